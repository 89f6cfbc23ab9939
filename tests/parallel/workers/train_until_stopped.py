"""Rank of a Keras training job that a test stops with a signal: report once training runs.

Trains a small model with ``ddl_tf.keras.DistributedOptimizer`` for at most 120 s
(bounded), writing this rank's pid once the first batch has been reduced across ranks.
"""

import os
import time

import keras
import numpy as np

import ddl_tf.keras as hvd
from tests.parallel.workers.common import report


class ReportOnce(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.done = False
        self.deadline = time.monotonic() + 120

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            report(hvd.rank(), {"pid": os.getpid(), "training": True})
            self.done = True
        if time.monotonic() > self.deadline:
            self.model.stop_training = True


def main() -> None:
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 16)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=10_000, verbose=0, callbacks=[ReportOnce()])


if __name__ == "__main__":
    main()
