"""Rank of a job started with Horovod's environment knobs: trains two epochs with warmup.

The test sets ``HOROVOD_LOG_LEVEL=trace`` and knobs ddl_tf has no equivalent for, and
reads what the ranks printed.
"""

import keras
import numpy as np

import ddl_tf.keras as hvd
from ddl_tf.core import basics
from tests.parallel.workers.common import report


def main() -> None:
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(opt, "mse", jit_compile=False)
    warmup = hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=0.01 * hvd.size(), warmup_epochs=1, steps_per_epoch=8, verbose=1
    )
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[warmup])
    report(hvd.rank(), {"algorithm": basics.engine().config.algorithm})
    hvd.shutdown()


if __name__ == "__main__":
    main()
