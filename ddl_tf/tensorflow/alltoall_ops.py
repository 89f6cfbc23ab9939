"""Horovod's alltoall on ``tf.Tensor``s, eager and inside ``tf.function``.

``alltoall`` without ``splits`` sends the first dimension in equal parts, so
it must be a multiple of the number of ranks; bad or uneven splits on any rank
raise :class:`~ddl_tf.tensorflow.tf_errors.CollectiveArgumentError` (a
``tf.errors.InvalidArgumentError``) on every rank. Its gradient (as Horovod
0.28.1) is the alltoall of the upstream gradient with the received splits.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> received, splits = hvd.alltoall(tf.ones([2, 3]), splits=[2])
    >>> received.shape, splits.numpy().tolist()
    (TensorShape([2, 3]), [2])
    >>> hvd.shutdown()
"""

from __future__ import annotations

import tensorflow as tf

from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.allgather_ops import gathered_shape
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["alltoall"]


def alltoall(
    tensor,
    splits=None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet | None = None,
):
    """Send row slices to every rank; returns the received rows (and splits, if given).

    Args:
        tensor: Rows to distribute (slices of the first dimension).
        splits: Rows for each rank, in rank order; None sends equal parts
            (the first dimension must then be a multiple of the number of ranks).
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: The ranks to exchange among (a registered ``ProcessSet``); None: all.

    Returns:
        The rows received from every rank, in rank order; with ``splits``,
        also the number of rows received from each rank.
    """
    engine = engine_for(process_set)
    tensor = tf.convert_to_tensor(tensor)
    extra = [] if splits is None else [tf.convert_to_tensor(splits, tf.int32)]

    def exchange(*arrays):
        received, rsplits = engine.alltoall(
            arrays[0], None if splits is None else arrays[1], name=name, even=True
        )
        return [received, rsplits]

    @tf.custom_gradient
    def op(x):
        received, rsplits = bridge.run(
            exchange,
            [x, *extra],
            [x.dtype, tf.int32],
            [gathered_shape(x), tf.TensorShape([engine.size])],
            name=bridge.op_name("Alltoall", name),
        )

        def grad(dy, *unused):
            dy = tf.zeros_like(received) if dy is None else dy
            back, _ = bridge.run(
                lambda d, s: list(engine.alltoall(d, s)),
                [dy, rsplits],
                [dy.dtype, tf.int32],
                [x.shape, None],
                name=bridge.op_name("AlltoallGrad", None),
            )
            return back

        return (received, rsplits), grad

    received, rsplits = op(tensor)
    return received if splits is None else (received, rsplits)
