"""One rank of the cluster training benchmark (started by bench_cluster_training.py).

Usage: cluster_training_worker.py OUT.json STEPS WARMUP

Trains a small Keras CNN (about 4.3 M parameters, so one step's gradients
are 17 MB in float32) on synthetic 32x32x3 images with
``ddl_tf.keras.DistributedOptimizer``; the allreduce algorithm and wire
compression come from ``DDL_ALLREDUCE_ALGO`` / ``DDL_COMPRESSION``. Per
step it records the wall time (Keras batch callbacks) and the time spent
inside ddl_tf's allreduce (the engine call, wrapped with a timer: negotiation,
compression, fusion copies and the algorithm). At the end the weights of
every rank are compared bit for bit.
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np
from mpi4py import MPI

import ddl_tf.keras as hvd
from ddl_tf.core import basics

BATCH, IMAGE, CLASSES = 32, 32, 10


def make_model():
    keras.utils.set_random_seed(1234 + hvd.rank())  # different per rank: the broadcast matters
    return keras.Sequential(
        [
            keras.Input((IMAGE, IMAGE, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


class StepTimes(keras.callbacks.Callback):
    def __init__(self, comm_seconds):
        super().__init__()
        self.comm_seconds = comm_seconds
        self.steps = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start, self._comm = time.perf_counter(), self.comm_seconds[0]

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append((time.perf_counter() - self._start, self.comm_seconds[0] - self._comm))


def main():
    out, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    engine = basics.engine()
    comm_seconds = [0.0]
    inner = engine.allreduce

    def timed_allreduce(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            comm_seconds[0] += time.perf_counter() - start

    engine.allreduce = timed_allreduce
    rng = np.random.default_rng(hvd.rank())
    n = BATCH * (steps + warmup)
    x = rng.normal(size=(n, IMAGE, IMAGE, 3)).astype("float32")
    y = rng.integers(0, CLASSES, size=n)
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    timer = StepTimes(comm_seconds)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer],
    )
    timed = timer.steps[warmup:]
    step = float(np.median([s for s, _ in timed]))
    comm = float(np.median([c for _, c in timed]))
    digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
    world = MPI.COMM_WORLD
    digests = world.allgather(digest.hexdigest())
    steps_all = world.gather(step, root=0)
    comms_all = world.gather(comm, root=0)
    if hvd.rank() == 0:
        params = int(sum(np.prod(w.shape) for w in model.get_weights()))
        slowest = max(steps_all)
        result = {
            "algorithm": os.environ.get("DDL_ALLREDUCE_ALGO", "auto"),
            "compression": os.environ.get("DDL_COMPRESSION", "none"),
            "ranks": hvd.size(),
            "nodes": basics.topology().num_nodes,
            "parameters": params,
            "gradient_bytes_fp32": params * 4,
            "steps_timed": len(timed),
            "step_seconds_median_per_rank": steps_all,
            "comm_seconds_median_per_rank": comms_all,
            "step_seconds": slowest,
            "comm_share": max(c / s for c, s in zip(comms_all, steps_all, strict=True)),
            "images_per_second": BATCH * hvd.size() / slowest,
            "weights_identical_on_all_ranks": len(set(digests)) == 1,
            "topology": basics.topology().describe(),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
