"""Overlap the gradient allreduce with the backward pass, inside TensorFlow graphs.

One fused collective after the whole backward pass leaves the network idle
while gradients are computed and the processor idle while they are reduced.
Here the gradients are instead cut into buckets (:mod:`ddl_tf.core.collectives.fusion`)
*in the order backprop produces them* (last layer first), and each bucket
becomes its own collective op that depends only on its own gradients. The
bridge (:mod:`ddl_tf.tensorflow.bridge`) chains a graph's collectives in creation order;
creating the bucket ops in production order makes that chain follow
dataflow, so TensorFlow's executor starts bucket ``k``'s allreduce as soon as
bucket ``k``'s gradients exist (and bucket ``k - 1`` is done), while other
threads keep computing the earlier layers' gradients.

Production order is read off the graph's structure, which every rank traces
identically: the *level* of a gradient is the length of the longest path
(data and control edges) from the graph's sources to the op producing it,
and gradients are taken by increasing level, ties by their position in the
list. Backprop of layer ``k - 1`` needs the input gradient of layer ``k``,
so a later layer's gradients have lower levels. Graph rewriters that only
add control edges from an op's ancestors (tflms swap-in triggers) change no
op's set of ancestors, so they cannot make a bucket wait for the rest of the
backward pass.

Eager execution has no graph: every gradient exists before the allreduce
is called, so there is nothing to overlap and one fused collective runs.

Timeline: when a timeline is being recorded while the step is traced, each
bucket with dense gradients also gets a marker op that depends on nothing
but the bucket's gradients and records an instant event ``gradients ready``
(thread 1) at the moment they all exist; its empty output rides along in
the bucket's collective, which shows as ``allreduce '<name>_b<k>'``. A collective that starts before the last
bucket's ``gradients ready`` overlapped with the backward pass.

Example (the order of two tensors of a traced function):
    >>> import tensorflow as tf
    >>> from ddl_tf.tensorflow.overlap import production_order
    >>> captured = []
    >>> @tf.function
    ... def step(x):
    ...     a = x * 2.0          # produced first
    ...     b = tf.sin(a) * a    # needs a: produced later
    ...     captured.append(production_order([b, a]))
    ...     return b
    >>> _ = step.get_concrete_function(tf.TensorSpec([3]))
    >>> captured[0]
    [1, 0]
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.core.collectives.fusion import GradientBucket, plan_gradient_buckets
from ddl_tf.errors import ConfigError

__all__ = ["production_levels", "production_order", "Bucketing", "resolve", "reduce_in_buckets"]

logger = logging.getLogger(__name__)

_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})
"""TF1 while loops: the op that carries a value back to the loop's ``Merge``."""


def _op_of(value) -> tf.Operation:
    if isinstance(value, tf.IndexedSlices):
        return value.values.op
    return value.op


def production_levels(tensors: Sequence) -> list[int]:
    """Longest-path level (data and control edges) of the op producing each tensor.

    Loop back edges are not dependencies: a TF1 while loop feeds its
    ``NextIteration`` back into its ``Merge``, and any edge to an op still on
    the walk's path closes a cycle, so both are skipped (the walk would
    otherwise never end).

    Args:
        tensors: Graph tensors or ``tf.IndexedSlices`` of one graph.

    Returns:
        One level per tensor; sources (placeholders, constants) have level 0.
    """
    levels: dict[tf.Operation, int] = {}
    on_path: set[tf.Operation] = set()
    for value in tensors:
        stack = [_op_of(value)]
        while stack:
            op = stack[-1]
            if op in levels:
                stack.pop()
                continue
            on_path.add(op)
            preds = [
                p
                for p in [t.op for t in op.inputs] + list(op.control_inputs)
                if p.type not in _BACK_EDGE_OPS and p not in on_path
            ]
            missing = [p for p in preds if p not in levels]
            if missing:
                stack.extend(missing)
                continue
            levels[op] = 1 + max((levels[p] for p in preds), default=-1)
            on_path.discard(op)
            stack.pop()
    return [levels[_op_of(value)] for value in tensors]


def production_order(tensors: Sequence) -> list[int]:
    """Indices of ``tensors`` in the order backprop produces them (level, then position).

    Args:
        tensors: Graph tensors or ``tf.IndexedSlices`` of one graph.

    Returns:
        A permutation of ``range(len(tensors))``, earliest produced first.
    """
    levels = production_levels(tensors)
    return sorted(range(len(tensors)), key=lambda i: (levels[i], i))


class Bucketing(NamedTuple):
    """How a gradient list travels inside a graph, resolved once (see :func:`resolve`).

    Attributes:
        overlap: Reduce in buckets as backprop produces them; False: one
            fused collective after the whole backward pass.
        bucket_bytes: Gradient bytes per bucket (0: one bucket per gradient).
    """

    overlap: bool
    bucket_bytes: int


def resolve(overlap: bool | None, bucket_bytes: int | None) -> Bucketing:
    """The overlap switch and bucket size to use: the arguments, else the job's configuration.

    ``DistributedOptimizer`` and ``DistributedGradientTape`` call it once, when
    they are made (a bad value fails there, not inside a traced step);
    :func:`~ddl_tf.tensorflow.functions.allreduce_gradients` at each call. The
    job's configuration is read only for an argument that is None.

    Args:
        overlap: Reduce gradient buckets while backprop runs; None takes ``DDLConfig.overlap``.
        bucket_bytes: Bucket size in bytes (0: one bucket per gradient); None takes
            ``DDLConfig.bucket_bytes``.

    Returns:
        ``(overlap, bucket_bytes)``, a :class:`Bucketing`.

    Raises:
        ConfigError: ``bucket_bytes`` is not a whole number >= 0, or ``overlap`` not a bool.
        NotInitializedError: An argument is None and ``init()`` has not run.
    """
    if overlap is not None and not isinstance(overlap, bool):
        raise ConfigError(
            f"overlap must be True, False or None (the job's DDL_OVERLAP). Received "
            f"overlap={overlap!r}; e.g. overlap=False for one fused allreduce after backprop."
        )
    if bucket_bytes is not None and (
        isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0
    ):
        raise ConfigError(
            "bucket_bytes must be a whole number of bytes >= 0 or None (the job's "
            f"DDL_BUCKET_BYTES). Received bucket_bytes={bucket_bytes!r}; e.g. "
            "bucket_bytes=2 * 1024 * 1024, or 0 for one bucket per gradient."
        )
    if overlap is None or bucket_bytes is None:
        config = basics.engine().config  # DDLConfig checked both when the job started
        overlap = config.overlap if overlap is None else overlap
        bucket_bytes = config.bucket_bytes if bucket_bytes is None else bucket_bytes
    return Bucketing(overlap, bucket_bytes)


def _nbytes(value) -> int | None:
    if isinstance(value, tf.IndexedSlices):
        return None
    shape = value.shape
    if not shape.is_fully_defined():
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64)) * value.dtype.size


def reduce_in_buckets(
    grads: Sequence,
    reduce: Callable[[list, str], list],
    *,
    bucket_bytes: int,
    name: str,
) -> list:
    """Reduce ``grads`` (graph tensors, no ``None``) bucket by bucket in production order.

    Args:
        grads: Gradients of one graph (tensors or ``tf.IndexedSlices``).
        reduce: ``reduce(bucket_grads, bucket_name) -> reduced`` builds one
            collective (e.g. :func:`ddl_tf.tensorflow.allreduce_ops.grouped_allreduce`).
        bucket_bytes: Largest bucket in bytes (see :mod:`ddl_tf.core.collectives.fusion`).
        name: Base name; bucket ``k`` is ``f"{name}_b{k}"``.

    Returns:
        The reduced gradients, in the order of ``grads``.
    """
    grads = list(grads)
    order = production_order(grads)
    buckets = plan_gradient_buckets(
        order,
        [_nbytes(g) for g in grads],
        bucket_bytes,
        alone=[isinstance(g, tf.IndexedSlices) for g in grads],
    )
    logger.debug(
        "%s: %d gradients in %d bucket(s) of <= %d bytes, production order %s",
        name,
        len(grads),
        len(buckets),
        bucket_bytes,
        order,
    )
    marking = basics.engine().timeline.enabled
    out: list = [None] * len(grads)
    for k, bucket in enumerate(buckets):
        label = f"{name}_b{k}"
        members = [grads[i] for i in bucket.members]
        dense = any(not isinstance(m, tf.IndexedSlices) for m in members)
        if marking and dense:
            reduced = reduce([*members, _marker(members, bucket, label)], label)[:-1]
        else:
            reduced = reduce(members, label)
        for i, value in zip(bucket.members, reduced, strict=True):
            out[i] = value
    return out


def _marker(members: list, bucket: GradientBucket, label: str) -> tf.Tensor:
    """An empty float32 tensor computed when ``members`` all exist; records that moment.

    It travels with the bucket as an extra (0-byte) member: a marker whose
    output fed only a control edge would be pruned by Grappler, and a stateful
    one would be chained behind the previous bucket's collective by automatic
    control dependencies.
    """

    def mark(*_arrays):
        basics.engine().timeline.instant(
            "gradients ready", tid=1, bucket=label, bytes=bucket.nbytes, tensors=len(members)
        )
        return np.zeros(0, np.float32)

    values = [m.values if isinstance(m, tf.IndexedSlices) else m for m in members]
    marker = tf.numpy_function(mark, values, tf.float32, stateful=False, name=f"{label}_ready")
    marker.set_shape([0])
    return marker
