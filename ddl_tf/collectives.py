"""Horovod's TensorFlow collectives on ``tf.Tensor``s, eager and inside ``tf.function``.

Shapes and dtypes are preserved (allgather/reducescatter/alltoall change the
first dimension only). Gradients are defined where Horovod defines them:
allreduce (Sum/Average: the allreduced upstream gradient), allgather (this
rank's slice of the summed upstream gradient), broadcast (the summed
gradient on the root, zeros elsewhere), plus reducescatter (allgather) and
alltoall (the reverse alltoall). ``device_dense``/``device_sparse`` are
accepted for compatibility; data always travels through host memory.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> hvd.allreduce(tf.constant([1.0, 3.0]), op=hvd.Sum).numpy()
    array([1., 3.], dtype=float32)
    >>> hvd.allgather(tf.ones([2, 3])).shape
    TensorShape([2, 3])
    >>> hvd.shutdown()
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ddl_tf import basics, bridge
from ddl_tf.api_names import COLLECTIVES
from ddl_tf.core.compression import Compression, Compressor
from ddl_tf.core.reduce_ops import ReduceOp, parse_op
from ddl_tf.errors import ConfigError, DDLError

__all__ = list(COLLECTIVES)

_counter = itertools.count()


class ProcessSet:
    """Horovod's process set; ddl_tf only has the global one (every rank)."""

    def size(self) -> int:
        return basics.size()

    def rank(self) -> int:
        return basics.rank()

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def check_process_set(process_set: Any) -> None:
    """Raise :class:`ConfigError` for any process set but the global one (shared by the API)."""
    if process_set is not None and process_set is not global_process_set:
        raise ConfigError(
            f"ddl_tf supports only the global process set. Received process_set={process_set!r};"
            " drop the argument (collectives span every rank)."
        )


def _op_name(kind: str, name: str | None) -> str:
    return f"DDL{kind}_{name or next(_counter)}".replace("/", "_").replace(":", "_")


def _split_compression(compression: Any) -> tuple[Compressor | None, Any]:
    """Engine-side compressor, or a Horovod-style TF compressor to apply around the op."""
    if compression is None or isinstance(compression, (Compressor, str)):
        return (None if compression is None else Compression.get(compression)), None
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return Compression.none, compression
    raise ConfigError(f"Unknown compression {compression!r}; use ddl_tf.Compression.fp16 etc.")


def _raw_allreduce(tensors, op, compressor, name, pre, post) -> list[tf.Tensor]:
    engine = basics.engine()

    def fn(*arrays):
        return engine.allreduce(
            arrays,
            op=op,
            compression=compressor,
            name=name,
            prescale_factor=pre,
            postscale_factor=post,
        )

    return bridge.run(
        fn,
        tensors,
        [t.dtype for t in tensors],
        [t.shape for t in tensors],
        name=_op_name("Allreduce", name),
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
    process_set: Any = None,
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
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor: Multiply before reducing.
        postscale_factor: Multiply after reducing.
        process_set: Only the global process set is supported.
        ignore_name_scope: Accepted for compatibility.
        name: Optional name, compared across ranks.

    Returns:
        Reduced tensors, same order, dtypes and shapes.
    """
    check_process_set(process_set)
    op = parse_op(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: list = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = _sparse_allreduce(t, op, name)
    if dense:
        dense_tensors = [tf.convert_to_tensor(tensors[i]) for i in dense]
        for i, t in zip(
            dense,
            _dense_allreduce(
                dense_tensors, op, compression, name, prescale_factor, postscale_factor
            ),
            strict=True,
        ):
            out[i] = t
    return out


def _dense_allreduce(tensors, op, compression, name, pre, post) -> list[tf.Tensor]:
    compressor, tf_compressor = _split_compression(compression)
    contexts = None
    if tf_compressor is not None:
        pairs = [tf_compressor.compress(t) for t in tensors]
        tensors, contexts = [p[0] for p in pairs], [p[1] for p in pairs]

    @tf.custom_gradient
    def reduce(*xs):
        ys = _raw_allreduce(list(xs), op, compressor, name, pre, post)

        def grad(*dys):
            if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                raise DDLError(
                    f"allreduce with op={op.name} has no gradient (Horovod defines none); "
                    "use Sum or Average on differentiable paths."
                )
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys, strict=True)]
            return _raw_allreduce(dys, op, compressor, f"{name}_grad" if name else None, pre, post)

        return ys, grad

    results = list(reduce(*tensors))
    if tf_compressor is not None:
        results = [tf_compressor.decompress(r, c) for r, c in zip(results, contexts, strict=True)]
    return results


def _sparse_allreduce(t: tf.IndexedSlices, op: ReduceOp, name: str | None) -> tf.IndexedSlices:
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ConfigError(
            f"Sparse gradients (tf.IndexedSlices) support only Sum and Average. Received "
            f"op={op.name}; pass sparse_as_dense=True or use a dense tensor."
        )
    values = allgather(t.values, name=f"{name}_values" if name else None)
    indices = allgather(t.indices, name=f"{name}_indices" if name else None)
    if op is ReduceOp.AVERAGE:
        values = values / tf.cast(basics.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=t.dense_shape)


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
    process_set: Any = None,
    ignore_name_scope: bool = False,
):
    """Reduce ``tensor`` across ranks (Average by default); see :func:`grouped_allreduce`.

    A ``tf.IndexedSlices`` is allgathered (values and indices) instead, as in Horovod.
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


def allgather(
    tensor, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None
) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ)."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    engine = basics.engine()

    def gather(x):
        return bridge.run(
            lambda a: [engine.allgather(a, name=name)],
            [x],
            [x.dtype],
            [tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None],
            name=_op_name("Allgather", name),
        )[0]

    @tf.custom_gradient
    def op(x):
        y = gather(x)

        def grad(dy):
            summed = _raw_allreduce([dy], ReduceOp.SUM, Compression.none, None, 1.0, 1.0)[0]
            rows = gather(tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1]))
            start = tf.reduce_sum(rows[: engine.rank])
            return summed[start : start + tf.shape(x, out_type=tf.int64)[0]]

        return y, grad

    return op(tensor)


def broadcast(
    tensor,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = None,
) -> tf.Tensor:
    """``tensor`` from ``root_rank`` on every rank."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    engine = basics.engine()

    @tf.custom_gradient
    def op(x):
        y = bridge.run(
            lambda a: engine.broadcast([a], root_rank, name=name),
            [x],
            [x.dtype],
            [x.shape],
            name=_op_name("Broadcast", name),
        )[0]

        def grad(dy):
            summed = _raw_allreduce([dy], ReduceOp.SUM, Compression.none, None, 1.0, 1.0)[0]
            return summed if engine.rank == root_rank else tf.zeros_like(summed)

        return y, grad

    return op(tensor)


def reducescatter(
    tensor,
    device_dense: str = "",
    compression: Any = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    name: str | None = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` and keep this rank's rows of the first dimension (first ranks get extras)."""
    check_process_set(process_set)
    op = parse_op(op)
    compressor, _ = _split_compression(compression)
    tensor = tf.convert_to_tensor(tensor)
    engine = basics.engine()

    @tf.custom_gradient
    def scatter(x):
        y = bridge.run(
            lambda a: [
                engine.reducescatter(
                    a,
                    op=op,
                    compression=compressor,
                    name=name,
                    prescale_factor=prescale_factor,
                    postscale_factor=postscale_factor,
                )
            ],
            [x],
            [x.dtype],
            [tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None],
            name=_op_name("Reducescatter", name),
        )[0]

        def grad(dy):
            gathered = allgather(dy)
            return gathered / engine.size if op is ReduceOp.AVERAGE else gathered

        return y, grad

    return scatter(tensor)


def alltoall(
    tensor,
    splits=None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = None,
):
    """Send row slices to every rank; returns the received rows (and splits, if given)."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    engine = basics.engine()
    inputs = [tensor] if splits is None else [tensor, tf.convert_to_tensor(splits, tf.int32)]

    def exchange(*arrays):
        received, rsplits = engine.alltoall(
            arrays[0], None if splits is None else arrays[1], name=name
        )
        return [received, rsplits]

    @tf.custom_gradient
    def op(x):
        received, rsplits = bridge.run(
            exchange,
            [x, *inputs[1:]],
            [x.dtype, tf.int32],
            [
                tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None,
                tf.TensorShape([engine.size]),
            ],
            name=_op_name("Alltoall", name),
        )

        def grad(dy, *unused):
            back, _ = bridge.run(
                lambda d, s: list(engine.alltoall(d, s)),
                [dy, rsplits],
                [dy.dtype, tf.int32],
                [x.shape, None],
                name=_op_name("AlltoallGrad", None),
            )
            return back

        return (received, rsplits), grad

    received, rsplits = op(tensor)
    return received if splits is None else (received, rsplits)


def barrier(process_set: Any = None) -> None:
    """Block until every rank arrives (eagerly; inside tf.function it is an op in the chain)."""
    check_process_set(process_set)
    engine = basics.engine()

    def wait():
        engine.barrier()
        return [np.zeros((), np.int32)]

    bridge.run(wait, [], [tf.int32], [tf.TensorShape([])], name=_op_name("Barrier", None))
