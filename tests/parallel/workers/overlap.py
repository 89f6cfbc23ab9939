"""Overlapped gradient allreduce on real ranks: buckets, graph structure, tflms, timeline, errors.

Cases (one mpirun, every rank reports a dict):

* ``fit``: Keras ``fit`` with ``DistributedOptimizer`` and small buckets,
  overlap on and off from the same start: weights bitwise identical across
  ranks in both, and equal to each other (2 ranks: a + b in every layout);
* ``tape``: ``DistributedGradientTape`` inside ``tf.function``: several
  buckets, the first holds the last layer's gradients, and the first bucket's
  collective does not depend on the first layer's gradient (the last one
  backprop produces);
* ``tflms``: the same graph check after ``tflms.LMSCallback`` rewrote the
  Keras train step (swap ops present);
* ``timeline``: a trace recorded during ``fit``; per rank, the number of
  steps whose first bucket's collective started before the last bucket's
  gradients were ready;
* ``mismatch``: rank 1's model has a different layer width: every rank gets
  an error from the step (not a hang), and the ranks stay in step after it.
"""

import json
import os
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd
import tflms
from ddl_tf.tensorflow import bridge
from tests.parallel.workers.common import report

FEATURES, LR = 32, 0.05


def mlp(seed, width=64, depth=4):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width, activation="tanh") for _ in range(depth)]
    layers.append(keras.layers.Dense(1))
    return keras.Sequential(layers)


def data(n, seed=0):
    rng = np.random.default_rng(seed + hvd.rank())
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    return x, x[:, :1] * 0.5 + 0.1


def identical(weights):
    flat = np.concatenate([w.ravel() for w in weights])
    everyone = hvd.allgather(flat[None, :]).numpy()
    return bool(all(np.array_equal(everyone[0], w) for w in everyone)), flat


class Recording(hvd.DistributedOptimizer):
    """Remembers the graph its ``apply`` was traced in (the Keras train step's FuncGraph)."""

    graphs: list = []

    def apply(self, grads, trainable_variables=None):
        Recording.graphs.append(tf.compat.v1.get_default_graph())
        return super().apply(grads, trainable_variables)


def producer(tensor):
    """The op that computed ``tensor``, looking through identities (custom_gradient, markers)."""
    op = tensor.op
    while op.type in ("Identity", "IdentityN"):
        index = tensor.value_index if op.type == "IdentityN" else 0
        tensor = op.inputs[index]
        op = tensor.op
    return op


def ancestors(op):
    seen, stack = set(), [op]
    while stack:
        node = stack.pop()
        for parent in [t.op for t in node.inputs] + list(node.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def bucket_facts(graph, first_kernel_shape, last_kernel_shape, marker="_b"):
    """Structure of the gradient collectives of ``graph`` (in chain = creation order)."""
    chain = [op for op in bridge.collective_ops(graph) if marker in op.name]
    shapes = [[tuple(t.shape.as_list()) for t in op.inputs] for op in chain]
    first_ancestors = ancestors(chain[0])
    first_layer_grad = (
        next(
            producer(t) for t in chain[-1].inputs if tuple(t.shape.as_list()) == first_kernel_shape
        )
        if first_kernel_shape in shapes[-1]
        else None
    )
    return {
        "buckets": len(chain),
        "last_layer_bucket": next(k for k, s in enumerate(shapes) if last_kernel_shape in s),
        "first_layer_bucket": next(k for k, s in enumerate(shapes) if first_kernel_shape in s),
        "first_waits_for_first_layer_gradient": first_layer_grad in first_ancestors
        if first_layer_grad is not None
        else any(
            producer(t) in first_ancestors
            for k, s in enumerate(shapes)
            if first_kernel_shape in s
            for t in chain[k].inputs
            if tuple(t.shape.as_list()) == first_kernel_shape
        ),
    }


def case_fit(results):
    x, y = data(64)
    initial = mlp(0).get_weights()
    finals = {}
    for overlap in (True, False):
        model = mlp(0)
        model.set_weights(initial)
        opt = hvd.DistributedOptimizer(
            keras.optimizers.SGD(LR), overlap=overlap, bucket_bytes=8 * 1024
        )
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        same, flat = identical(model.get_weights())
        results[f"fit_identical_overlap_{overlap}"] = same
        finals[overlap] = flat
    results["fit_on_equals_off"] = bool(np.array_equal(finals[True], finals[False]))
    results["fit_moved"] = float(
        np.abs(finals[True] - np.concatenate([w.ravel() for w in initial])).max()
    )


def tape_step(model, optimizer, graphs, overlap):
    @tf.function
    def step(bx, by):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.mean_squared_error(by, model(bx)))
        tape = hvd.DistributedGradientTape(tape, overlap=overlap, bucket_bytes=8 * 1024)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        graphs.append(tf.compat.v1.get_default_graph())
        return loss

    return step


def case_tape(results):
    for overlap in (True, False):
        model = mlp(1)
        hvd.broadcast_variables(model.variables, root_rank=0)
        graphs = []
        step = tape_step(model, keras.optimizers.SGD(LR), graphs, overlap)
        x, y = data(32)
        for i in range(0, 32, 8):
            step(x[i : i + 8], y[i : i + 8])
        results[f"tape_identical_overlap_{overlap}"] = identical(model.get_weights())[0]
        marker = "_b" if overlap else "DistributedGradientTape"
        results[f"tape_overlap_{overlap}"] = bucket_facts(
            graphs[0], (FEATURES, 64), (64, 1), marker=marker
        )


def case_tflms(results):
    x, y = data(32)
    model = mlp(2, width=256)
    Recording.graphs = []
    model.compile(
        optimizer=Recording(keras.optimizers.SGD(LR), bucket_bytes=64 * 1024),
        loss="mse",
        jit_compile=False,
    )
    callback = tflms.LMSCallback(swapout_threshold=2, swapin_ahead=1, min_tensor_bytes=0)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    graph = Recording.graphs[0]
    results["tflms_swaps"] = len(callback.plan.swaps)
    results["tflms_swap_ops"] = sum(1 for op in graph.get_operations() if "lms/" in op.name)
    results["tflms"] = bucket_facts(graph, (FEATURES, 256), (256, 1))
    results["tflms_identical"] = identical(model.get_weights())[0]


def case_timeline(results, outdir):
    x, y = data(512)
    model = mlp(3, width=512, depth=6)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001), bucket_bytes=1 << 20),
        loss="mse",
    )
    path = outdir / "trace.json"
    hvd.start_timeline(str(path))
    model.fit(x, y, batch_size=128, epochs=2, shuffle=False, verbose=0)
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return
    events = json.loads(path.read_text())["traceEvents"]
    for pid in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == pid]
        ready = [e for e in mine if e["name"] == "gradients ready"]
        buckets = sorted({e["args"]["bucket"] for e in ready}, key=lambda b: int(b.split("_b")[-1]))
        starts = sorted(
            e["ts"] for e in mine if e["ph"] == "X" and e["name"].endswith(f"{buckets[0]}'")
        )
        last_ready = sorted(e["ts"] for e in ready if e["args"]["bucket"] == buckets[-1])
        results[f"timeline_rank{pid}"] = {
            "buckets": len(buckets),
            "steps": len(starts),
            "overlapped_steps": sum(s < r for s, r in zip(starts, last_ready, strict=True)),
            "lead_ms": [round((r - s) / 1e3, 3) for s, r in zip(starts, last_ready, strict=True)],
        }


def case_mismatch(results):
    width = 16 if hvd.rank() == 0 else 17
    model = mlp(4, width=width, depth=2)
    optimizer = keras.optimizers.SGD(LR)

    @tf.function
    def step(bx, by):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.mean_squared_error(by, model(bx)))
        tape = hvd.DistributedGradientTape(tape, bucket_bytes=256)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    x, y = data(8)
    start = time.monotonic()
    try:
        step(x, y)
        results["mismatch"] = {"raised": None}
    except tf.errors.OpError as err:
        results["mismatch"] = {"raised": type(err).__name__, "message": str(err)[-1500:]}
    results["mismatch"]["seconds"] = time.monotonic() - start
    results["after"] = hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist()


def main():
    hvd.init()
    results = {}
    outdir = Path(os.environ["DDL_TEST_OUTDIR"])
    cases = sys.argv[1:] or ["fit", "tape", "tflms", "timeline", "mismatch"]
    for case in cases:
        if case == "timeline":
            case_timeline(results, outdir)
        else:
            globals()[f"case_{case}"](results)
    report(hvd.rank(), results)
    hvd.shutdown()


if __name__ == "__main__":
    main()
