"""Helpers over the collectives: broadcast variables and Python objects, reduce gradient lists.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> v = tf.Variable([1.0, 2.0])
    >>> hvd.broadcast_variables([v], root_rank=0)
    >>> hvd.broadcast_object({"epoch": 3}, root_rank=0)
    {'epoch': 3}
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet, set_root
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.allreduce_ops import reduce_tensors
from ddl_tf.tensorflow.overlap import Bucketing, reduce_in_buckets, resolve
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = [
    "broadcast_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "allreduce_gradients",
    "reduce_gradients",
]


def broadcast_variables(
    variables: Sequence,
    root_rank: int,
    process_set: ProcessSet | None = None,
    inplace: bool = False,
):
    """Assign every variable the root's value, in one fused broadcast.

    Works with ``tf.Variable`` and Keras 3 variables, eagerly (returns None) and
    inside ``tf.function`` (returns the grouped assign op).

    Args:
        variables: Variables in the same order on every rank.
        root_rank: Rank whose values win.
        process_set: The ranks to broadcast among (a registered ``ProcessSet``; ``root_rank``
            is a job rank in it); None: all.
        inplace: Accepted for compatibility.
    """
    engine = engine_for(process_set)
    root = set_root(process_set, root_rank)
    variables = list(variables)
    if not variables:
        return None
    values = bridge.run(
        lambda *arrays: engine.broadcast(arrays, root, name="broadcast_variables"),
        [tf.convert_to_tensor(v) for v in variables],
        [tf.as_dtype(v.dtype).base_dtype for v in variables],
        [tf.TensorShape(v.shape) for v in variables],
        name="DDLBroadcastVariables",
    )
    assigns = [v.assign(value) for v, value in zip(variables, values, strict=True)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet | None = None,
) -> Any:
    """A picklable object from ``root_rank`` on every rank (eager only).

    Args:
        obj: The object (only ``root_rank``'s is used; must pickle).
        root_rank: The rank whose object everyone gets.
        session: Ignored (TF1 compatibility).
        name: Name of the collective; None for an automatic one.
        process_set: The ranks taking part (a registered ``ProcessSet``); None: all.

    Returns:
        ``root_rank``'s object, unpickled on every other rank.

    Raises:
        ConfigError: ``process_set`` is not registered, or this rank is not in it.
    """
    engine = engine_for(process_set)
    return engine.broadcast_object(obj, set_root(process_set, root_rank), name=name)


def broadcast_object_fn(
    root_rank: int = 0,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet | None = None,
):
    """A function that broadcasts a picklable object from ``root_rank`` (Horovod's TF1 helper).

    Horovod needs it to reuse one graph op in ``tf.compat.v1`` sessions; ddl_tf
    broadcasts objects outside the graph, so the function simply calls
    :func:`broadcast_object`. ``session`` is accepted for compatibility.

    Args:
        root_rank: The rank whose object everyone gets.
        session: Ignored.
        name: Name of the collective; None for an automatic one.
        process_set: The ranks taking part (a registered ``ProcessSet``); None: all.

    Returns:
        A function ``obj -> root_rank's obj``.

    Raises:
        ConfigError: ``process_set`` is not registered, or this rank is not in it.
    """
    engine_for(process_set)  # refuse a bad set now, not at the first call

    def broadcast(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)

    return broadcast


def allgather_object(
    obj: Any, session: Any = None, name: str | None = None, process_set: ProcessSet | None = None
) -> list:
    """Every rank's picklable object, as a list in rank order (eager only).

    Args:
        obj: This rank's object (must pickle).
        session: Ignored (TF1 compatibility).
        name: Name of the collective; None for an automatic one.
        process_set: The ranks taking part (a registered ``ProcessSet``); None: all.

    Returns:
        A list of ``size()`` objects, entry ``r`` from rank ``r``.

    Raises:
        ConfigError: ``process_set`` is not registered, or this rank is not in it.
    """
    return engine_for(process_set).allgather_object(obj, name=name)


def allreduce_gradients(
    grads: Sequence,
    *,
    op: ReduceOp | None = ReduceOp.AVERAGE,
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    name: str | None = None,
    overlap: bool | None = None,
    bucket_bytes: int | None = None,
    process_set: ProcessSet | None = None,
) -> list:
    """Reduce a gradient list across ranks; ``None`` entries stay ``None``.

    Eagerly (and with ``overlap=False``) the gradients travel in one grouped,
    fused collective. Inside a graph with overlap on, they travel in buckets
    in the order backprop produces them, each bucket's collective depending
    only on its own gradients, so reducing overlaps with the rest of the
    backward pass (see :mod:`ddl_tf.tensorflow.overlap`).

    Args:
        grads: Gradients (tensors, ``tf.IndexedSlices`` or None).
        op: Average (default) or Sum (Min/Max work but have no gradient semantics).
        compression: Wire compression.
        sparse_as_dense: Densify ``tf.IndexedSlices`` before reducing.
        gradient_predivide_factor: With Average, divide by this before the sum
            and multiply after (Horovod's option against fp16 overflow).
        name: Collective name (bucket ``k`` is named ``<name>_b<k>``).
        overlap: Bucket and overlap inside graphs; None: the job's ``DDL_OVERLAP``.
        bucket_bytes: Bytes per bucket; None: the job's ``DDL_BUCKET_BYTES``.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.

    Returns:
        The reduced gradients, in the order of ``grads``.

    Raises:
        ConfigError: Invalid ``gradient_predivide_factor``, ``overlap`` or ``bucket_bytes``.
    """
    engine = engine_for(process_set)
    spec = ReduceSpec.for_gradients(
        op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor
    )
    return reduce_gradients(
        grads,
        spec,
        engine,
        resolve(overlap, bucket_bytes),
        sparse_as_dense=sparse_as_dense,
        name=name,
    )


def reduce_gradients(
    grads: Sequence,
    spec: ReduceSpec,
    engine: Any,
    bucketing: Bucketing,
    *,
    sparse_as_dense: bool = False,
    name: str | None = None,
) -> list:
    """:func:`allreduce_gradients` with its options resolved (the optimizer's and tape's entry).

    Args:
        grads: Gradients (tensors, ``tf.IndexedSlices`` or None).
        spec: How to reduce them (built once by the optimizer or tape).
        engine: The engine of the process set on this rank.
        bucketing: Whether to bucket and overlap inside graphs, and the bucket
            size (:func:`ddl_tf.tensorflow.overlap.resolve`, once by the optimizer or tape).
        sparse_as_dense: Densify ``tf.IndexedSlices`` before reducing.
        name: Collective name (bucket ``k`` is named ``<name>_b<k>``).

    Returns:
        The reduced gradients, in the order of ``grads``.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    # an elastic job of one rank may grow: its traced steps must keep the collective
    if engine.size == 1 and not engine.elastic and spec.op in (ReduceOp.AVERAGE, ReduceOp.SUM):
        return list(grads)  # nothing to reduce; keep tensors (and IndexedSlices) untouched
    chosen = []
    for i in present:
        g = grads[i]
        if sparse_as_dense and isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        chosen.append(g)

    def reduce(tensors: list, collective_name: str | None) -> list:
        return reduce_tensors(engine, tensors, spec, collective_name)

    if bucketing.overlap and chosen and not tf.executing_eagerly():
        reduced = reduce_in_buckets(
            chosen, reduce, bucket_bytes=bucketing.bucket_bytes, name=name or "gradients"
        )
    else:
        reduced = reduce(chosen, name)
    out = list(grads)
    for i, g in zip(present, reduced, strict=True):
        out[i] = g
    return out
