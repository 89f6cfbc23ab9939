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

import numpy as np
import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import AVERAGE
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["allgather", "grouped_allgather", "gather_tensors", "gather_parts", "gathered_shape"]


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


def gather_parts(
    engine: Any, groups: Sequence[Sequence], dtypes: Sequence[tf.DType], name: str
) -> list[tf.Tensor]:
    """Allgather flat tensors given as parts: each group's parts are joined on the host.

    Group ``k`` on this rank is its tensors flattened and concatenated, of
    ``dtypes[k]`` (an empty group: nothing); every rank receives every
    rank's concatenation, in rank order. Nothing is concatenated in
    TensorFlow: the collective's op takes the parts and joins them in one
    host array when it runs, where MPI reads them anyway, so a rank's own
    share (ZeRO's updated weights) is not copied on the device first. Not
    differentiable.

    Args:
        engine: The set's engine on this rank.
        groups: Per message, this rank's tensors (any shapes, one dtype).
        dtypes: Each group's dtype (needed for an empty group).
        name: The collective's name, compared across ranks.

    Returns:
        Per group, a 1-D tensor: every rank's concatenation, in rank order.

    Example (one process: the parts come back joined):
        >>> import ddl_tf as hvd
        >>> from ddl_tf.core.basics import engine
        >>> _ = hvd.init()
        >>> parts = [[tf.constant([[1.0], [2.0]]), tf.constant([3.0])], []]
        >>> out = gather_parts(engine(), parts, [tf.float32, tf.int32], "parts")
        >>> [t.numpy().tolist() for t in out]
        [[1.0, 2.0, 3.0], []]
        >>> hvd.shutdown()
    """
    counts = [len(group) for group in groups]

    def join_and_gather(*parts: np.ndarray) -> list[np.ndarray]:
        flat = iter(parts)
        joined = [
            np.concatenate([np.ravel(next(flat)) for _ in range(count)])
            if count
            else np.zeros([0], dtype.as_numpy_dtype)
            for count, dtype in zip(counts, dtypes, strict=True)
        ]
        return engine.grouped_allgather(joined, name=name)

    return bridge.run(
        join_and_gather,
        [part for group in groups for part in group],
        list(dtypes),
        [tf.TensorShape([None]) for _ in groups],
        name=bridge.op_name("Allgather", name),
    )


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
