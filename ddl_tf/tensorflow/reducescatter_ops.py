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

import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.allgather_ops import gather_tensors
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = ["reducescatter", "grouped_reducescatter", "scatter_tensors"]


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
