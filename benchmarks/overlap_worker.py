"""One rank of the overlap benchmark (started by bench_overlap.py inside a rehearsal cluster).

Usage: overlap_worker.py OUT.json ROUNDS STEPS BATCH WIDTH DEPTH BUCKETS

Keras ``fit`` of an MLP (a small first layer, ``DEPTH`` hidden layers of
``WIDTH``), every variant in the same process, interleaved round by round
(the order reversed every other round):

* ``overlap_<bytes>``: ``DistributedOptimizer(overlap=True, bucket_bytes=...)``
  for each bucket size in ``BUCKETS`` (comma separated);
* ``off``: ``DistributedOptimizer(overlap=False)`` (one fused collective
  after the backward pass);
* ``compute``: the plain optimizer: forward, backward and update, no
  allreduce (both ranks compute at once, as in the other variants);
* ``comm``: the allreduce alone: one ``engine.allreduce`` of arrays shaped
  like the gradients (what ``off`` sends), outside TensorFlow;
* ``forward``: the forward pass alone (the ``compute`` model called with
  ``training=True`` in a ``tf.function``, batch by batch): ``compute`` minus
  it is the backward pass and update, the part communication can overlap.

Per step it records the wall time (Keras batch callbacks); per round and
variant the median step; the slowest rank counts. Every model starts from the
same weights; at the end the weights of each distributed variant are
compared bit for bit across ranks.
"""

import hashlib
import json
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per rank for compute
tf.config.threading.set_inter_op_parallelism_threads(2)  # + a thread for the collective

import keras  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ddl_tf.keras as hvd  # noqa: E402
from ddl_tf import basics  # noqa: E402

FEATURES = 16


def make_model(width, depth):
    keras.utils.set_random_seed(7)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu")]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    layers.append(keras.layers.Dense(1))
    return keras.Sequential(layers)


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(time.perf_counter() - self._start)


def main():
    out, rounds, steps, batch, width, depth = sys.argv[1], *map(int, sys.argv[2:7])
    bucket_sizes = [int(b) for b in sys.argv[7].split(",")]
    hvd.init()
    engine = basics.engine()
    world = MPI.COMM_WORLD
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(batch * (steps + 1), FEATURES)).astype("float32")
    y = x[:, :1] * 0.3
    initial = make_model(width, depth).get_weights()

    models = {}
    for name in [f"overlap_{b}" for b in bucket_sizes] + ["off", "compute"]:
        model = make_model(width, depth)
        model.set_weights(initial)
        inner = keras.optimizers.SGD(1e-4)
        if name == "compute":
            optimizer = inner
        elif name == "off":
            optimizer = hvd.DistributedOptimizer(inner, overlap=False)
        else:
            optimizer = hvd.DistributedOptimizer(
                inner, overlap=True, bucket_bytes=int(name.split("_")[1])
            )
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        models[name] = model
    grads = [np.ones(w.shape, np.float32) for w in initial]
    gradient_bytes = sum(g.nbytes for g in grads)

    forward = tf.function(lambda batch: models["compute"](batch, training=True))

    def run(name):
        if name == "forward":
            times = []
            world.Barrier()
            for k in range(steps + 1):
                start = time.perf_counter()
                forward(x[k * batch : (k + 1) * batch]).numpy()
                times.append(time.perf_counter() - start)
            return times[1:]
        if name == "comm":
            times = []
            for _ in range(steps + 1):
                world.Barrier()
                start = time.perf_counter()
                engine.allreduce(grads, name="comm_alone")
                times.append(time.perf_counter() - start)
            return times[1:]
        timer = StepTimes()
        world.Barrier()
        models[name].fit(
            x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer]
        )
        return timer.steps[1:]  # the first step of each fit pays the call's setup

    variants = list(models) + ["comm", "forward"]
    for name in variants:  # trace every train function, warm every path
        run(name)
    medians = {name: [] for name in variants}
    for r in range(rounds):
        for name in variants if r % 2 == 0 else variants[::-1]:
            local = float(np.median(run(name)))
            medians[name].append(max(world.allgather(local)))  # the slowest rank counts
    identical = {}
    for name, model in models.items():
        if name == "compute":
            continue
        digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
        identical[name] = len(set(world.allgather(digest.hexdigest()))) == 1
    if hvd.rank() == 0:
        result = {
            "ranks": hvd.size(),
            "nodes": basics.topology().num_nodes,
            "algorithm": engine.config.algorithm,
            "parameters": int(sum(np.prod(w.shape) for w in initial)),
            "gradient_bytes": gradient_bytes,
            "gradients": len(initial),
            "batch_per_rank": batch,
            "width": width,
            "depth": depth,
            "steps_per_round": steps,
            "round_medians_seconds": medians,
            "weights_identical_on_all_ranks": identical,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
