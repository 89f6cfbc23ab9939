"""Keras callbacks of the demo: per-epoch timing, communication share and Dice."""

from __future__ import annotations

import time

import keras
import numpy as np

from .data import CLASSES
from .metrics import confusion_counts, dice_from_counts

__all__ = ["EpochStats"]


class EpochStats(keras.callbacks.Callback):
    """Records per epoch: wall time, allreduce seconds, volumes/s and validation Dice.

    Dice is computed on every rank's shard of the validation set and the
    per-class counts are summed across ranks, so all ranks do the same work
    and agree on the result.

    Args:
        hvd: the ``ddl_tf.keras`` module (initialized).
        x_val, y_val: this rank's validation shard.
        volumes_per_epoch: training volumes this rank sees per epoch.
    """

    def __init__(self, hvd, x_val: np.ndarray, y_val: np.ndarray, volumes_per_epoch: int):
        super().__init__()
        self.hvd = hvd
        self.x_val, self.y_val = x_val, y_val
        self.volumes_per_epoch = volumes_per_epoch
        self.epochs: list[dict] = []

    def on_train_begin(self, logs=None):
        self.epochs = []
        self.hvd.collective_stats(reset=True)

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self.hvd.collective_stats(reset=True)

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        comm = self.hvd.collective_stats(reset=True).get("allreduce", {}).get("seconds", 0.0)
        pred = self.model.predict(self.x_val, batch_size=2, verbose=0).argmax(-1)
        counts = self.hvd.allreduce(confusion_counts(pred, self.y_val, CLASSES), op=self.hvd.Sum)
        dice = dice_from_counts(np.asarray(counts))
        self.epochs.append(
            {
                "epoch": epoch + 1,
                "loss": float((logs or {}).get("loss", float("nan"))),
                "dice": [round(float(d), 4) for d in dice],
                "seconds": round(seconds, 3),
                "allreduce_seconds": round(comm, 3),
                "volumes_per_second": round(self.volumes_per_epoch / seconds, 3),
            }
        )
