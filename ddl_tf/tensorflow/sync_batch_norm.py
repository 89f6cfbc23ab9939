"""``SyncBatchNormalization``: Keras 3 batch normalization with batch statistics over all ranks.

As Horovod's: in training, each rank computes its batch mean and variance,
and the ranks average the mean and the mean of squares (an allreduce of one
stacked tensor), so every rank normalizes with the statistics of the global
batch and updates identical moving averages (equal per-rank batch sizes
assumed, as in Horovod). Inference uses the moving statistics, no
communication. Horovod's ``fused`` argument is accepted only as ``False``.

Example (one process):
    >>> import numpy as np
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> layer = hvd.SyncBatchNormalization(axis=1)
    >>> out = layer(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32), training=True)
    >>> np.round(np.asarray(out), 3).tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    >>> hvd.shutdown()
"""

from __future__ import annotations

import keras
import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.allreduce_ops import allreduce

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="ddl_tf", name="SyncBatchNormalization")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are averaged over every rank.

    Args:
        fused: Horovod's argument; only ``False`` is accepted.
        **kwargs: As ``keras.layers.BatchNormalization`` (``synchronized`` excluded).

    Raises:
        ConfigError: ``fused`` is True/None, or ``synchronized=True`` is passed.
    """

    def __init__(self, fused: bool | None = False, **kwargs) -> None:
        if fused in (True, None):
            raise ConfigError(
                f"SyncBatchNormalization does not support fused=True. Received fused={fused!r}; "
                "leave it at False."
            )
        if kwargs.pop("synchronized", False):
            raise ConfigError(
                "SyncBatchNormalization synchronizes through ddl_tf, not tf.distribute. "
                "Received synchronized=True; drop the argument."
            )
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        if basics.size() == 1:
            return mean, variance
        stacked = tf.stack([mean, variance + tf.square(mean)])
        group = allreduce(stacked, op=ReduceOp.SUM) / tf.cast(basics.size(), stacked.dtype)
        group_mean, group_mean_of_square = tf.unstack(group)
        return group_mean, group_mean_of_square - tf.square(group_mean)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("synchronized", None)
        return config
