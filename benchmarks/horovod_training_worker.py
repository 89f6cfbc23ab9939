"""One rank of the Horovod side-by-side training-step benchmark (started by bench_horovod.py).

Usage: horovod_training_worker.py PLAN.json OUT.json

Runs in the Horovod peer's environment with the repository on
``PYTHONPATH``. PLAN is ``{"library": "horovod" | "ddl_tf" | "both",
"model": "mobilenet_v2" | "mlp", "batch": B, "rounds": R, "steps": S,
"warmup": W}``; one library per job (see ``horovod_allreduce_worker.py``
for why), ``both`` puts the two in one process.

Copies of the model, built from the same seed: one trained with the
library's ``DistributedGradientTape`` (gradients averaged over ranks) and
one with a plain ``tf.GradientTape`` (``local``: no communication, the
compute-only reference, measured in the same processes). Each step is one
``tf.function`` (forward, backward, allreduce, SGD update). The variants run
in interleaved rounds (the order rotates every round), ``S`` steps each per
round; a variant's step time is the median over rounds of its mean step
time, taken on the slowest rank. At the end, each distributed variant's
trainable weights must be bitwise identical on all ranks (a digest is
compared; batch-norm moving statistics stay per rank in both libraries).

Models: ``mobilenet_v2`` is ``keras.applications.MobileNetV2(weights=None)``
on 96x96x3 images, 10 classes (2.2 M parameters, 8.9 MB of float32
gradients); ``mlp`` is 1024 -> 4096 -> 4096 -> 10 dense layers (21 M
parameters, 84 MB of gradients), whose allreduce dominates the step.
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from mpi4py import MPI

import ddl_tf


def build(name: str) -> tuple[keras.Model, tuple[int, ...]]:
    keras.utils.set_random_seed(1234)  # the same weights on every rank and in every copy
    if name == "mobilenet_v2":
        shape = (96, 96, 3)
        model = keras.applications.MobileNetV2(input_shape=shape, weights=None, classes=10)
    elif name == "mlp":
        shape = (1024,)
        inputs = keras.Input(shape)
        x = keras.layers.Dense(4096, activation="relu")(inputs)
        x = keras.layers.Dense(4096, activation="relu")(x)
        model = keras.Model(inputs, keras.layers.Dense(10)(x))
    else:
        raise SystemExit(f"unknown model {name!r}; use mobilenet_v2 or mlp")
    return model, shape


def make_step(model: keras.Model, tape_class):
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    if model.layers[-1].get_config().get("activation") in (None, "linear"):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    variables = model.trainable_variables
    # Horovod's tape keys gradients by ``source.ref()``, which Keras 3 variables lack:
    # differentiate with respect to the tf.Variable inside each (for every variant alike)
    sources = [v.value for v in variables]

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if tape_class is not None:
            tape = tape_class(tape)
        grads = tape.gradient(loss, sources)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    return step


def digest(model: keras.Model) -> str:
    """Of the trainable weights: batch-norm statistics are per rank by design (as in Horovod)."""
    h = hashlib.sha256()
    for v in model.trainable_variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def main():
    plan = json.loads(open(sys.argv[1]).read())
    out = sys.argv[2]
    comm = MPI.COMM_WORLD.Dup()
    which = plan.get("library", "both")
    tapes = {}
    if which in ("horovod", "both"):
        import horovod.tensorflow as hvd

        hvd.init(comm=MPI.COMM_WORLD)
        tapes["horovod"] = hvd.DistributedGradientTape
    # ddl_tf describes the topology (and sizes the thread pools) in every job; in a Horovod
    # job it stays idle, its engine has no background thread
    engine = ddl_tf.init()
    if which in ("ddl_tf", "both"):
        tapes["ddl_tf"] = ddl_tf.DistributedGradientTape
    if not tapes:
        raise SystemExit(f"unknown library {which!r}; use horovod, ddl_tf or both")
    variants = (*tapes, "local")
    per_node = engine.topology.local_size
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // per_node))
    models, steps = {}, {}
    for variant in variants:
        models[variant], shape = build(plan["model"])
        steps[variant] = make_step(models[variant], tapes.get(variant))
    params = sum(int(np.prod(v.shape)) for v in models["local"].trainable_variables)
    rng = np.random.default_rng(comm.rank)
    x = tf.constant(rng.standard_normal((plan["batch"], *shape)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, plan["batch"]))
    for variant in variants:  # trace and warm up
        for _ in range(plan["warmup"]):
            steps[variant](x, y).numpy()
    samples = {v: [] for v in variants}
    for r in range(plan["rounds"]):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(plan["steps"]):
                loss = steps[variant](x, y)
            loss.numpy()
            samples[variant].append((time.perf_counter() - start) / plan["steps"])
    medians = {v: comm.allreduce(float(np.median(s)), op=MPI.MAX) for v, s in samples.items()}
    digests = {v: comm.allgather(digest(models[v])) for v in tapes}
    if comm.rank == 0:
        result = {
            "model": plan["model"],
            "parameters": params,
            "gradient_bytes": params * 4,
            "batch_per_rank": plan["batch"],
            "ranks": comm.size,
            "topology": engine.topology.describe(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "step_seconds": medians,
            "round_seconds": samples,
            "weights_identical_across_ranks": {v: len(set(d)) == 1 for v, d in digests.items()},
        }
        with open(out, "w") as f:
            json.dump(result, f)
        print(
            f"  {plan['model']}: " + ", ".join(f"{v} {s * 1e3:.1f} ms" for v, s in medians.items()),
            flush=True,
        )
    ddl_tf.shutdown()
    if "horovod" in tapes:
        hvd.shutdown()
    comm.Free()


if __name__ == "__main__":
    main()
