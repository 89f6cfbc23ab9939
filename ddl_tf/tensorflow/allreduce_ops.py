"""Horovod's allreduce family on ``tf.Tensor``s, eager and inside ``tf.function``: allreduce,
grouped_allreduce and barrier.

Shapes and dtypes are preserved. Every Horovod dtype and op works as
Horovod defines it, including ``Average`` of integers (the truncated mean), ``Adasum``
of float16/32/64 tensors (:mod:`ddl_tf.core.algorithms.adasum`; ``2^k`` ranks, or ``2^k``
nodes with a hierarchical allreduce; any registered process set; after the
engine's or a Horovod-style compression, as Horovod compresses first)
and ``prescale_factor`` / ``postscale_factor`` on integers (float64 math,
truncated; see :mod:`ddl_tf.core.numerics.scaling`). A ``tf.IndexedSlices`` is
allgathered (values and indices) instead of reduced, as in Horovod, which
supports only Sum and Average there and no scale factors; anything else
raises :class:`~ddl_tf.errors.UnsupportedError` (a ``NotImplementedError``)
on every rank.

Gradient (as Horovod 0.28.1): the gradient of an allreduce is the allreduce
of the upstream gradients with the same op and scale factors.

``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for
compatibility; data always travels through host memory.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> hvd.allreduce(tf.constant([1.0, 3.0]), op=hvd.Sum).numpy()
    array([1., 3.], dtype=float32)
    >>> hvd.allreduce(tf.constant([3, 5]), op=hvd.Average).numpy()
    array([3, 5], dtype=int32)
    >>> hvd.shutdown()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ddl_tf.core import current
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.errors import UnsupportedError
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.allgather_ops import gather_tensors
from ddl_tf.tensorflow.compression import Compression
from ddl_tf.tensorflow.rank_ops import size_op
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["allreduce", "grouped_allreduce", "reduce_tensors", "barrier", "join"]


def _raw_allreduce(engine, tensors, spec: ReduceSpec, name) -> list[tf.Tensor]:
    return bridge.run(
        lambda *arrays: engine.allreduce(arrays, spec, name=name),
        tensors,
        [t.dtype for t in tensors],
        [t.shape for t in tensors],
        name=bridge.op_name("Allreduce", name),
    )


def grouped_allreduce(
    tensors: Sequence,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = None,
    ignore_name_scope: bool = False,
    name: str | None = None,
) -> list:
    """Allreduce a list of tensors in one negotiated, fused collective.

    Args:
        tensors: Tensors (or ``tf.IndexedSlices``) with the same dtypes and
            shapes at each position on every rank.
        average: Deprecated Horovod flag; use ``op``.
        device_dense: Accepted for compatibility (ignored).
        device_sparse: Accepted for compatibility (ignored).
        compression: ``Compression.none/fp16/bf16`` or a Horovod-style compressor.
        op: Average (default), Sum, Min, Max, Product or Adasum.
        prescale_factor: Multiply before reducing.
        postscale_factor: Multiply after reducing.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
        ignore_name_scope: Accepted for compatibility.
        name: Optional name, compared across ranks.

    Returns:
        Reduced tensors, same order, dtypes and shapes.

    Raises:
        UnsupportedError: Adasum on a width that is not a power of two, or
            ``tf.IndexedSlices`` with an op other than Sum/Average or with scale
            factors (on every rank).
        CollectiveMismatchError: Ranks passed different tensors (a
            ``tf.errors.FailedPreconditionError``).
    """
    engine = engine_for(process_set)
    spec = ReduceSpec.of(
        op,
        average=average,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    return reduce_tensors(engine, list(tensors), spec, name)


def reduce_tensors(engine: Any, tensors: list, spec: ReduceSpec, name: str | None) -> list:
    """:func:`grouped_allreduce` with its arguments already resolved (the gradient path's entry).

    Args:
        engine: The engine of the process set on this rank (:func:`engine_for`).
        tensors: Tensors or ``tf.IndexedSlices``.
        spec: How to reduce them.
        name: Optional name, compared across ranks.

    Returns:
        Reduced tensors, same order, dtypes and shapes.
    """
    if not tensors:
        return []
    if spec.op is ReduceOp.ADASUM:
        engine.adasum()  # a width that is not 2^k: UnsupportedError now, on every rank alike
    out: list = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        reduced_slices = _sparse_allreduce(engine, [tensors[i] for i in sparse], spec, name)
        for i, t in zip(sparse, reduced_slices, strict=True):
            out[i] = t
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if dense:
        reduced = _dense_allreduce(
            engine, [tf.convert_to_tensor(tensors[i]) for i in dense], spec, name
        )
        for i, t in zip(dense, reduced, strict=True):
            out[i] = t
    return out


def _dense_allreduce(engine, tensors, spec: ReduceSpec, name) -> list[tf.Tensor]:
    wrapper = spec.wrapper
    contexts = None
    if wrapper is not None:
        pairs = [wrapper.compress(t) for t in tensors]
        tensors, contexts = [p[0] for p in pairs], [p[1] for p in pairs]

    # the gradient travels uncompressed, with the same op and scale factors (as Horovod)
    grad_spec = dataclasses.replace(spec, compressor=Compression.none, wrapper=None)

    @tf.custom_gradient
    def reduce(*xs):
        ys = _raw_allreduce(engine, list(xs), spec, name)

        def grad(*dys):
            filled = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys, strict=True)]
            grad_name = f"{name}_grad" if name else None
            return _raw_allreduce(engine, filled, grad_spec, grad_name)

        return ys, grad

    results = list(reduce(*tensors))
    if wrapper is not None:
        assert contexts is not None  # set with the compression above
        results = [wrapper.decompress(r, c) for r, c in zip(results, contexts, strict=True)]
    return results


def _sparse_allreduce(engine, slices, spec: ReduceSpec, name) -> list[tf.IndexedSlices]:
    op = spec.op
    problem = None
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        problem = (
            "tf.IndexedSlices support only Sum and Average (they are allgathered, not "
            f"reduced). Received op={op!r}; pass sparse_as_dense=True to the optimizer or "
            "tape, or convert with tf.convert_to_tensor."
        )
    elif spec.scaled:
        problem = (
            "prescale_factor and postscale_factor are not supported with tf.IndexedSlices. "
            f"Received prescale_factor={spec.prescale_factor}, "
            f"postscale_factor={spec.postscale_factor}; scale the values "
            "yourself or convert with tf.convert_to_tensor."
        )
    if problem is not None:
        bridge.refuse("allgather", UnsupportedError(problem), name=name, engine=engine)
    values = gather_tensors(
        engine, [s.values for s in slices], name=f"{name}_values" if name else None
    )
    indices = gather_tensors(
        engine, [s.indices for s in slices], name=f"{name}_indices" if name else None
    )
    # an elastic job's size changes under a traced step: read it when the step runs
    size = size_op() if engine is current.CURRENT else engine.size
    out = []
    for s, v, i in zip(slices, values, indices, strict=True):
        if op is ReduceOp.AVERAGE:
            v = v / tf.cast(size, v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


def allreduce(
    tensor,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet | None = None,
    ignore_name_scope: bool = False,
):
    """Reduce ``tensor`` across ranks (Average by default); see :func:`grouped_allreduce`.

    A ``tf.IndexedSlices`` is allgathered (values and indices) instead, as in Horovod.

    Args:
        tensor: A tensor (or ``tf.IndexedSlices``) of the same dtype and shape
            on every rank.
        average: Deprecated Horovod flag; use ``op``.
        device_dense: Accepted for compatibility (ignored).
        device_sparse: Accepted for compatibility (ignored).
        compression: ``Compression.none/fp16/bf16`` or a Horovod-style compressor.
        op: Average (default), Sum, Min, Max, Product or Adasum.
        prescale_factor: Multiply before reducing.
        postscale_factor: Multiply after reducing.
        name: Optional name, compared across ranks.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
        ignore_name_scope: Accepted for compatibility.

    Returns:
        The reduced tensor, same dtype and shape.

    Raises:
        UnsupportedError: Adasum on a width that is not a power of two, or ``tf.IndexedSlices`` with an op other
            than Sum/Average or with scale factors.
    """
    return grouped_allreduce(
        [tensor],
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
        name=name,
    )[0]


def barrier(process_set: ProcessSet | None = None) -> None:
    """Block until every rank arrives (eagerly; inside tf.function it is an op in the chain).

    Args:
        process_set: The ranks to wait for (a registered ``ProcessSet``); None: all.

    Raises:
        ConfigError: ``process_set`` is not registered, or this rank is not in it.
    """
    engine = engine_for(process_set)

    def wait():
        engine.barrier()
        return [np.zeros((), np.int32)]

    bridge.run(wait, [], [tf.int32], [tf.TensorShape([])], name=bridge.op_name("Barrier", None))


def join(device: Any = -1, process_set: ProcessSet | None = None) -> tf.Tensor:
    """This rank has no more data: take part in the others' allreduces with zeros until all join.

    Horovod's ``join()``. While some ranks have joined, the other ranks' allreduces
    go on: a joined rank contributes zeros (Average still divides by the number
    of ranks, as in Horovod), and any other collective raises on the ranks that
    issue it. Typical use, with uneven data::

        for batch in my_shard:  # ranks have different numbers of batches
            train_step(batch)   # DistributedGradientTape / DistributedOptimizer
        last = hvd.join()
        hvd.broadcast_variables(model.variables, root_rank=int(last))

    Args:
        device: Accepted for compatibility (Horovod's GPU for the zeros; ignored).
        process_set: The set whose ranks join (a registered ``ProcessSet``); None: all.

    Returns:
        The last rank to join, a scalar int32 tensor (the same on every rank).

    Raises:
        ConfigError: Collective checks are off (``DDL_CHECK_COLLECTIVES=0``).
    """
    engine = engine_for(process_set)

    def wait():
        return [np.asarray(engine.join(), np.int32)]

    return bridge.run(
        wait, [], [tf.int32], [tf.TensorShape([])], name=bridge.op_name("Join", None)
    )[0]
