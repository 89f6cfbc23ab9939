"""Rank of a mixed_float16 job where rank 1 alone overflows on some steps (Keras's default path).

Every rank trains the same model with ``DistributedOptimizer`` under the
``mixed_float16`` policy. Rank 1's shard has a few batches whose inputs
overflow float16 (1e5 * weights), so its gradients are inf there while rank
0's are finite. Each rank reports, per step, whether the step was applied
(the inner optimizer's ``iterations``) and the loss scale, plus a digest of
its final weights.
"""

import hashlib
import os

import keras
import numpy as np

import ddl_tf.keras as hvd
from tests.parallel.workers.common import report

STEPS, BATCH = 12, 4
OVERFLOW_STEPS = (3, 7)  # rank 1 only


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        self.rows.append(
            (int(opt.inner_optimizer.iterations.numpy()), float(opt.dynamic_scale.numpy()))
        )


def main() -> None:
    hvd.init()
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(STEPS * BATCH, 8)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 1)).astype("float32")
    if hvd.rank() == 1:
        for step in OVERFLOW_STEPS:
            x[step * BATCH : (step + 1) * BATCH] = 1e5
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=hvd.Compression.none)
    model.compile(opt, "mse", jit_compile=False)
    record = Record()
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), record],
    )
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    report(
        hvd.rank(),
        {
            "optimizer": type(model.optimizer).__name__,
            "steps": record.rows,
            "digest": digest,
            "pid": os.getpid(),
        },
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
