"""Horovod's reducescatter and grouped_reducescatter on ``tf.Tensor``s, eager and in graphs.

Each tensor is reduced across ranks (Average by default, as in Horovod) and
rank ``r`` keeps its share of the first dimension: ``rows // size`` rows,
plus one for the first ``rows % size`` ranks. Shapes and dtypes must match
across ranks; a scalar raises :class:`~ddl_tf.tensorflow.tf_errors.CollectiveArgumentError`
(a ``ValueError`` and ``tf.errors.InvalidArgumentError``) on every rank.
Integer Average and scale factors follow :mod:`ddl_tf.core.numerics.scaling`.

Gradient (as Horovod 0.28.1): the allgather of the upstream gradient,
multiplied by the number of ranks for ``op=Sum`` and by the pre- and
post-scale factors; for ``op=Average`` the allgather alone.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> hvd.reducescatter(tf.constant([[1.0], [2.0]]), op=hvd.Sum).numpy().tolist()
    [[1.0], [2.0]]
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.allgather_ops import gather_tensors
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["reducescatter", "grouped_reducescatter", "scatter_rows", "scatter_tensors"]


def grouped_reducescatter(
    tensors: Sequence,
    device_dense: str = "",
    compression: Any = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    process_set: ProcessSet | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> list[tf.Tensor]:
    """Reducescatter several tensors under one negotiation (Horovod's ``grouped_reducescatter``).

    Args:
        tensors: Tensors with the same dtypes and shapes at each position on every rank.
        device_dense: Accepted for compatibility (ignored).
        compression: ``Compression.none/fp16/bf16`` or a Horovod-style compressor.
        op: Average (default) or Sum (Min, Max, Product also work).
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
        prescale_factor: Multiply before reducing.
        postscale_factor: Multiply after reducing.
        name: Optional name, compared across ranks (a ddl_tf addition).

    Returns:
        This rank's rows of each reduced tensor.
    """
    spec = ReduceSpec.of(
        op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    return scatter_tensors(engine_for(process_set), tensors, spec, name)


def scatter_tensors(engine: Any, tensors: Sequence, spec: ReduceSpec, name: str | None) -> list:
    """:func:`grouped_reducescatter` on a resolved engine and :class:`ReduceSpec`.

    Args:
        engine: The set's engine on this rank (:func:`~ddl_tf.tensorflow.tf_errors.engine_for`).
        tensors: As for :func:`grouped_reducescatter`.
        spec: How to reduce them.
        name: Optional name, compared across ranks.

    Returns:
        As :func:`grouped_reducescatter`.
    """
    op = spec.op
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    tf_compressor = spec.wrapper
    contexts = None
    if tf_compressor is not None:
        pairs = [tf_compressor.compress(t) for t in tensors]
        tensors, contexts = [p[0] for p in pairs], [p[1] for p in pairs]

    @tf.custom_gradient
    def scatter(*xs):
        ys = bridge.run(
            lambda *arrays: engine.grouped_reducescatter(arrays, spec, name=name),
            list(xs),
            [x.dtype for x in xs],
            [tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None for x in xs],
            name=bridge.op_name("Reducescatter", name),
        )

        def grad(*dys):
            filled = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys, strict=True)]
            factor = (engine.size if op is ReduceOp.SUM else 1) * spec.prescale_factor
            factor *= spec.postscale_factor
            if factor != 1:
                filled = [d * tf.cast(factor, d.dtype) for d in filled]
            return gather_tensors(engine, filled, f"{name}_grad" if name else None)

        return ys, grad

    results = list(scatter(*tensors))
    if tf_compressor is not None:
        assert contexts is not None  # set with the compression above
        results = [tf_compressor.decompress(r, c) for r, c in zip(results, contexts, strict=True)]
    return results


def scatter_rows(
    engine: Any,
    matrices: Sequence[Sequence[Sequence]],
    widths: Sequence[int],
    spec: ReduceSpec,
    name: str,
) -> list:
    """:func:`scatter_tensors` of ``[size, width]`` matrices given as rows of flat parts, one row per rank.

    Row ``r`` of matrix ``k`` is the flat tensors ``matrices[k][r]`` (one
    dtype per matrix) concatenated and zero-padded to ``widths[k]``; each
    rank receives its own row, reduced. Nothing is stacked in TensorFlow: the
    collective's op takes the parts themselves and writes the rows into one
    host array when it runs, where MPI reads them anyway. A stacked copy built
    as ordinary ops would be made as soon as its gradients exist and held
    until the collectives before it finish (ddl_tf runs them one after
    another), so buckets queued behind a slow link would hold a second copy
    of their gradients (on a GPU, in device memory). A Horovod-style
    ``compression`` object transforms whole tensors, so with one the
    matrices are stacked first, as :func:`scatter_tensors` needs them. Not
    differentiable (it reduces gradients).

    Args:
        engine: The set's engine on this rank.
        matrices: Per matrix, per rank, the flat tensors of that rank's row.
        widths: Each matrix's row length (at least its longest row).
        spec: How to reduce them.
        name: The collective's name, compared across ranks.

    Returns:
        Per matrix, this rank's reduced row, shape ``[1, width]``.

    Example (one process: the one row comes back):
        >>> import ddl_tf as hvd
        >>> from ddl_tf.core.basics import engine
        >>> from ddl_tf.core.collectives.reduce_spec import ReduceSpec
        >>> _ = hvd.init()
        >>> rows = [[[tf.constant([1.0, 2.0]), tf.constant([3.0])]]]
        >>> scatter_rows(engine(), rows, [4], ReduceSpec(), "rows")[0].numpy().tolist()
        [[1.0, 2.0, 3.0, 0.0]]
    """
    dtypes = [_dtype_of(m) for m in matrices]
    if spec.wrapper is not None:
        stacked = [
            tf.stack([tf.concat([*row, tf.zeros([width - _length(row)], dtype)], 0) for row in m])
            for m, width, dtype in zip(matrices, widths, dtypes, strict=True)
        ]
        return scatter_tensors(engine, stacked, spec, name)
    counts = [[len(row) for row in m] for m in matrices]

    def assemble_and_scatter(*parts: np.ndarray) -> list[np.ndarray]:
        flat = iter(parts)
        arrays = []
        for per_row, width, dtype in zip(counts, widths, dtypes, strict=True):
            array = np.empty((len(per_row), width), dtype.as_numpy_dtype)
            for r, count in enumerate(per_row):
                start = 0
                for _ in range(count):
                    part = np.ravel(next(flat))
                    array[r, start : start + part.size] = part
                    start += part.size
                array[r, start:] = 0
            arrays.append(array)
        return engine.grouped_reducescatter(arrays, spec, name=name)

    inputs = [part for m in matrices for row in m for part in row]
    return bridge.run(
        assemble_and_scatter,
        inputs,
        dtypes,
        [tf.TensorShape([1, width]) for width in widths],
        name=bridge.op_name("Reducescatter", name),
    )


def _dtype_of(matrix: Sequence[Sequence]) -> tf.DType:
    return next(tf.convert_to_tensor(part).dtype for row in matrix for part in row)


def _length(row: Sequence) -> int:
    return sum(int(part.shape[0]) for part in row)


def reducescatter(
    tensor,
    device_dense: str = "",
    compression: Any = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    name: str | None = None,
    process_set: ProcessSet | None = None,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` and keep this rank's rows of the first dimension (first ranks get extras).

    Args:
        tensor: A tensor with at least one dimension, same dtype and shape on
            every rank.
        device_dense: Accepted for compatibility (ignored).
        compression: ``Compression.none/fp16/bf16`` or a Horovod-style compressor.
        op: Average (default) or Sum (Min, Max, Product also work).
        name: Optional name, compared across ranks.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
        ignore_name_scope: Accepted for compatibility.
        prescale_factor: Multiply before reducing.
        postscale_factor: Multiply after reducing.

    Returns:
        This rank's rows of the reduced tensor.
    """
    return grouped_reducescatter(
        [tensor],
        compression=compression,
        op=op,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )[0]
