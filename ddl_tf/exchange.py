"""Horovod's gather and exchange collectives on ``tf.Tensor``s: allgather, grouped_allgather
and alltoall, eager and inside ``tf.function``.

The first dimension may differ per rank; every other dimension and the dtype
must match (else every rank raises
:class:`~ddl_tf.tf_errors.CollectiveMismatchError`, a
``tf.errors.FailedPreconditionError``). ``alltoall`` without ``splits``
sends the first dimension in equal parts, so it must be a multiple of the
number of ranks; bad or uneven splits on any rank raise
:class:`~ddl_tf.tf_errors.CollectiveArgumentError` (a
``tf.errors.InvalidArgumentError``) on every rank.

Gradients (as Horovod 0.28.1):

* allgather: the **average** over ranks of the upstream gradient, this rank's
  rows of it (a gradient that is the same on every rank passes through);
* alltoall: the alltoall of the upstream gradient with the received splits.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> hvd.allgather(tf.ones([2, 3])).shape
    TensorShape([2, 3])
    >>> [t.shape for t in hvd.grouped_allgather([tf.ones([1]), tf.ones([2, 2])])]
    [TensorShape([1]), TensorShape([2, 2])]
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ddl_tf import basics, bridge
from ddl_tf.core.reduce_ops import ReduceOp
from ddl_tf.process_sets import check_process_set

__all__ = ["allgather", "grouped_allgather", "alltoall"]


def _gathered_shape(x: tf.Tensor) -> tf.TensorShape | None:
    return tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None


def _raw_gather(tensors: list[tf.Tensor], name: str | None) -> list[tf.Tensor]:
    engine = basics.engine()
    return bridge.run(
        lambda *arrays: engine.grouped_allgather(arrays, name=name),
        tensors,
        [t.dtype for t in tensors],
        [_gathered_shape(t) for t in tensors],
        name=bridge.op_name("Allgather", name),
    )


def _average(tensors: list[tf.Tensor], name: str | None) -> list[tf.Tensor]:
    engine = basics.engine()
    return bridge.run(
        lambda *arrays: engine.allreduce(arrays, op=ReduceOp.AVERAGE, name=name),
        tensors,
        [t.dtype for t in tensors],
        [t.shape for t in tensors],
        name=bridge.op_name("Allreduce", name),
    )


def grouped_allgather(
    tensors: Sequence,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = None,
) -> list[tf.Tensor]:
    """Allgather several tensors under one negotiation (Horovod's ``grouped_allgather``).

    Args:
        tensors: Tensors; at each position the same dtype and trailing
            dimensions on every rank (the first dimension may differ).
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: Only the global process set is supported.

    Returns:
        One tensor per input: every rank's rows, concatenated in rank order.
    """
    check_process_set(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    rank = basics.rank()

    @tf.custom_gradient
    def gather(*xs):
        ys = _raw_gather(list(xs), name)

        def grad(*dys):
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys, strict=True)]
            averaged = _average(dys, f"{name}_grad" if name else None)
            counts = _raw_gather(
                [tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1]) for x in xs],
                f"{name}_grad_rows" if name else None,
            )
            out = []
            for x, avg, rows in zip(xs, averaged, counts, strict=True):
                start = tf.reduce_sum(rows[:rank])
                out.append(avg[start : start + tf.shape(x, out_type=tf.int64)[0]])
            return out

        return ys, grad

    return list(gather(*tensors))


def allgather(
    tensor, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None
) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ).

    Args:
        tensor: A tensor with at least one dimension; same dtype and trailing
            dimensions on every rank.
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: Only the global process set (or None) is accepted.

    Returns:
        Every rank's rows, concatenated in rank order.
    """
    return grouped_allgather([tensor], name=name, process_set=process_set)[0]


def alltoall(
    tensor,
    splits=None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = None,
):
    """Send row slices to every rank; returns the received rows (and splits, if given).

    Args:
        tensor: Rows to distribute (slices of the first dimension).
        splits: Rows for each rank, in rank order; None sends equal parts
            (the first dimension must then be a multiple of the number of ranks).
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: Only the global process set is supported.

    Returns:
        The rows received from every rank, in rank order; with ``splits``,
        also the number of rows received from each rank.
    """
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    engine = basics.engine()
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
            [_gathered_shape(x), tf.TensorShape([engine.size])],
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
