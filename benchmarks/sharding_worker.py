"""One rank of ``bench_sharding.py``: replicated, ZeRO-1 and ZeRO-2 steps interleaved in one job.

Each variant has its own model (same initial weights) and a
``DistributedOptimizer(AdamW)``; a round runs ``--steps`` steps of each
variant in turn (the custom-loop path: ``opt.apply`` inside ``tf.function``).
Rank 0 writes the JSON named by ``--out``: per variant the step seconds of
every round (this rank's median; the slowest rank's, gathered), the
optimizer-state bytes each rank holds (by its variables, and by TensorFlow's
CPU allocator: the bytes that building the optimizer added), the most bytes
a step allocated on each rank above what it held before the step (the
allocator's peak, after the rounds: gradients, the reduced and gathered
buffers, the update's temporaries), and whether the weights of the three
variants ended bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import time
from statistics import median

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd

VARIANTS = (None, "optimizer", "gradients")


def make_model(width: int, depth: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((width,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential([*layers, keras.layers.Dense(1)])


def allocated() -> int:
    return int(tf.config.experimental.get_memory_info("CPU:0")["current"])


def step_peak(step) -> int:
    """The most bytes one run of ``step`` held above what was allocated before it."""
    tf.config.experimental.reset_memory_stats("CPU:0")
    resting = allocated()
    step().numpy()
    return int(tf.config.experimental.get_memory_info("CPU:0")["peak"]) - resting


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    rank = hvd.rank()
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch, args.width)).astype("float32"))
    y = tf.constant(rng.normal(size=(args.batch, 1)).astype("float32"))
    runs = {}
    for sharding in VARIANTS:
        model = make_model(args.width, args.depth)
        opt = hvd.DistributedOptimizer(keras.optimizers.AdamW(1e-4), sharding=sharding)
        before = allocated()
        opt.build(model.trainable_variables)
        added = allocated() - before

        @tf.function
        def step(model=model, opt=opt):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return loss

        step()  # trace
        slots = [v for v in opt.variables if len(v.shape)]
        runs[str(sharding)] = {
            "model": model,
            "step": step,
            "times": [],
            "state_bytes": int(sum(v.numpy().nbytes for v in slots)),
            "allocator_bytes_added_by_build": added,
        }
    for _ in range(args.rounds):
        for run in runs.values():
            hvd.barrier()
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                run["step"]().numpy()
                times.append(time.perf_counter() - start)
            slowest = hvd.allgather(np.array([median(times)])).numpy().max()
            run["times"].append(float(slowest))
    for run in runs.values():
        hvd.barrier()
        run["step_peak"] = step_peak(run["step"])
    weights = {
        name: np.concatenate([w.ravel() for w in r["model"].get_weights()])
        for name, r in runs.items()
    }
    params = int(sum(np.prod(v.shape) for v in runs["None"]["model"].trainable_variables))
    per_rank = hvd.allgather_object(
        {
            name: [r["state_bytes"], r["allocator_bytes_added_by_build"], r["step_peak"]]
            for name, r in runs.items()
        }
    )
    if rank == 0:
        out = {
            "ranks": hvd.size(),
            "parameters": params,
            "batch_per_rank": args.batch,
            "step_seconds_per_round": {name: r["times"] for name, r in runs.items()},
            "state_bytes_per_rank": {n: [p[n][0] for p in per_rank] for n in runs},
            "allocator_bytes_added_by_build_per_rank": {
                n: [p[n][1] for p in per_rank] for n in runs
            },
            "step_peak_bytes_above_resting_per_rank": {
                n: [p[n][2] for p in per_rank] for n in runs
            },
            "weights_bitwise_equal": {
                n: bool(np.array_equal(weights["None"], weights[n]))
                for n in ("optimizer", "gradients")
            },
        }
        with open(args.out, "w") as f:
            json.dump(out, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
