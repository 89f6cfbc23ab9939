"""Gradient buckets for overlap: consecutive gradients, in production order, up to a byte size.

Framework-neutral: the caller says in which order gradients become ready
(:func:`ddl_tf.overlap.production_order` reads it off a TensorFlow graph)
and how many bytes each has; the plan is a pure function of those values.
Every rank traces the same graph, so every rank gets the same order, the
same sizes and therefore the same buckets, and issues their collectives in
the same order (MPI would deadlock otherwise; the negotiation turns a
difference into a :class:`~ddl_tf.errors.CollectiveMismatchError`).

A bucket closes when the next gradient would take it past ``bucket_bytes``;
a gradient larger than that gets a bucket of its own, and so does a gradient
marked ``alone`` (``tf.IndexedSlices``: allgathered, not fused) or of unknown
size.

Example:
    >>> from ddl_tf.core.buckets import plan_gradient_buckets
    >>> [b.members for b in plan_gradient_buckets([2, 0, 1, 3], [40, 40, 40, 40], 80)]
    [(2, 0), (1, 3)]
    >>> [b.members for b in plan_gradient_buckets([0, 1, 2], [10, None, 10], 80)]
    [(0,), (1,), (2,)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddl_tf.errors import ConfigError

__all__ = ["GradientBucket", "plan_gradient_buckets"]


@dataclass(frozen=True)
class GradientBucket:
    """Gradients reduced by one collective.

    Attributes:
        members: Indices into the caller's gradient list, in production order.
        nbytes: Their bytes (0 when a member's size is unknown).
    """

    members: tuple[int, ...]
    nbytes: int


def plan_gradient_buckets(
    order: Sequence[int],
    nbytes: Sequence[int | None],
    bucket_bytes: int,
    *,
    alone: Sequence[bool] = (),
) -> tuple[GradientBucket, ...]:
    """Cut gradients, taken in ``order``, into buckets of at most ``bucket_bytes``.

    Args:
        order: Gradient indices in the order they are produced (each once).
        nbytes: Bytes of each gradient (indexed like the caller's list);
            ``None`` for an unknown size, which gets a bucket of its own.
        bucket_bytes: Largest bucket in bytes; ``0`` puts every gradient alone.
        alone: Per gradient, whether it must travel in a bucket of its own.

    Returns:
        The buckets, in the order their collectives must be issued.

    Raises:
        ConfigError: ``order`` is not a permutation of the gradient indices,
            or ``bucket_bytes`` is negative.
    """
    if sorted(order) != list(range(len(nbytes))):
        raise ConfigError(
            f"order must list every gradient index once. Received order={list(order)!r} for "
            f"{len(nbytes)} gradients."
        )
    if bucket_bytes < 0:
        raise ConfigError(
            f"bucket_bytes must be >= 0. Received bucket_bytes={bucket_bytes!r} "
            "(e.g. DDL_BUCKET_BYTES=2097152)."
        )
    buckets: list[GradientBucket] = []
    current: list[int] = []
    current_bytes = 0

    def close() -> None:
        nonlocal current, current_bytes
        if current:
            buckets.append(GradientBucket(tuple(current), current_bytes))
            current, current_bytes = [], 0

    for index in order:
        size = nbytes[index]
        if size is None or (alone and alone[index]):
            close()
            buckets.append(GradientBucket((index,), size or 0))
            continue
        if current and current_bytes + size > bucket_bytes:
            close()
        current.append(index)
        current_bytes += size
    close()
    return tuple(buckets)
