"""Horovod's allgather on ``tf.Tensor``s: allgather and grouped_allgather, eager and inside
``tf.function`` (alltoall, which moves rows the same way, is :mod:`.alltoall_ops`).

The first dimension may differ per rank; every other dimension and the dtype
must match (else every rank raises
:class:`~ddl_tf.tensorflow.tf_errors.CollectiveMismatchError`, a
``tf.errors.FailedPreconditionError``).

Gradient (as Horovod 0.28.1): the **average** over ranks of the upstream
gradient, this rank's rows of it (a gradient that is the same on every rank
passes through).

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

from ddl_tf.core.collectives.reduce_spec import AVERAGE
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["allgather", "grouped_allgather", "gather_tensors", "gathered_shape"]


def gathered_shape(x: tf.Tensor) -> tf.TensorShape | None:
    return tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None


def _raw_gather(engine, tensors: list[tf.Tensor], name: str | None) -> list[tf.Tensor]:
    return bridge.run(
        lambda *arrays: engine.grouped_allgather(arrays, name=name),
        tensors,
        [t.dtype for t in tensors],
        [gathered_shape(t) for t in tensors],
        name=bridge.op_name("Allgather", name),
    )


def _average(engine, tensors: list[tf.Tensor], name: str | None) -> list[tf.Tensor]:
    return bridge.run(
        lambda *arrays: engine.allreduce(arrays, AVERAGE, name=name),
        tensors,
        [t.dtype for t in tensors],
        [t.shape for t in tensors],
        name=bridge.op_name("Allreduce", name),
    )


def grouped_allgather(
    tensors: Sequence,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet | None = None,
) -> list[tf.Tensor]:
    """Allgather several tensors under one negotiation (Horovod's ``grouped_allgather``).

    Args:
        tensors: Tensors; at each position the same dtype and trailing
            dimensions on every rank (the first dimension may differ).
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: The ranks to gather from (a registered ``ProcessSet``); None: all.

    Returns:
        One tensor per input: every rank's rows (of the set), concatenated in rank order.
    """
    return gather_tensors(engine_for(process_set), tensors, name)


def gather_tensors(engine: Any, tensors: Sequence, name: str | None) -> list[tf.Tensor]:
    """:func:`grouped_allgather` on the engine of a process set already resolved.

    Args:
        engine: The set's engine on this rank (:func:`~ddl_tf.tensorflow.tf_errors.engine_for`).
        tensors: As for :func:`grouped_allgather`.
        name: Optional name, compared across ranks.

    Returns:
        As :func:`grouped_allgather`.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    rank = engine.rank

    @tf.custom_gradient
    def gather(*xs):
        ys = _raw_gather(engine, list(xs), name)

        def grad(*dys):
            filled = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys, strict=True)]
            averaged = _average(engine, filled, f"{name}_grad" if name else None)
            counts = _raw_gather(
                engine,
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
    tensor,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet | None = None,
) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ).

    Args:
        tensor: A tensor with at least one dimension; same dtype and trailing
            dimensions on every rank.
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: The ranks to gather from (a registered ``ProcessSet``); None: all.

    Returns:
        Every rank's rows, concatenated in rank order.
    """
    return grouped_allgather([tensor], name=name, process_set=process_set)[0]
