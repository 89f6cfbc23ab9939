"""Tensor fusion: pack many small tensors into few buckets, in the same order on every rank.

Two bucket plans, both pure functions of values every rank has checked to be
identical, so all ranks run the same collectives in the same order (MPI would
deadlock otherwise; the negotiation turns a difference into a
:class:`~ddl_tf.errors.CollectiveMismatchError`):

* :func:`plan_buckets`: one fused collective's tensors, by wire dtype, into
  contiguous buffers (:func:`pack`, :func:`unpack`);
* :func:`plan_gradient_buckets`: for overlap, consecutive gradients in the
  order the backward pass produces them
  (:func:`ddl_tf.tensorflow.overlap.production_order` reads it off a
  TensorFlow graph), each bucket reduced as soon as its last gradient is
  ready.

A fusion bucket holds tensors of one wire dtype, at most ``threshold`` bytes (a
larger tensor gets a bucket of its own). Tensors keep the order they were
given in, grouped by dtype in order of first appearance: the plan is a pure
function of the (dtype, size) list, which every rank has checked to be
identical before any data moves, so all ranks run the same collectives in the
same order.

Every member starts on a 64-byte boundary of a 64-byte aligned buffer (the
gaps are zeros, reduced along with the data), so each reduced member can
become a tensor without a copy (:mod:`~ddl_tf.core.numerics.aligned`).

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.collectives.fusion import plan_buckets
    >>> f4, f2 = np.dtype("float32"), np.dtype("float16")
    >>> [b.members for b in plan_buckets((f4, f2, f4, f4), (10, 10, 10, 10), 128)]
    [(0, 2), (3,), (1,)]
    >>> plan_buckets((f4, f4), (10, 10), 128)[0].offsets  # element offsets: 64 bytes apart
    (0, 16)

A gradient bucket closes when the next gradient would take it past
``bucket_bytes``; a gradient larger than that gets a bucket of its own, and so
does a gradient marked ``alone`` (``tf.IndexedSlices``: allgathered, not fused)
or of unknown size:

    >>> [b.members for b in plan_gradient_buckets([2, 0, 1, 3], [40, 40, 40, 40], 80)]
    [(2, 0), (1, 3)]
    >>> [b.members for b in plan_gradient_buckets([0, 1, 2], [10, None, 10], 80)]
    [(0,), (1,), (2,)]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ddl_tf.core.numerics.aligned import align_up, aligned_empty
from ddl_tf.core.numerics.halfconv import cast_into
from ddl_tf.errors import ConfigError

__all__ = ["Bucket", "plan_buckets", "pack", "unpack", "GradientBucket", "plan_gradient_buckets"]


@dataclass(frozen=True)
class Bucket:
    """Tensors fused into one contiguous buffer.

    Attributes:
        dtype: Wire dtype of every member.
        members: Indices of the member tensors in the caller's list.
        offsets: Element offset of each member inside the buffer (each a
            multiple of 64 bytes).
        sizes: Element count of each member.
    """

    dtype: np.dtype
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @functools.cached_property
    def elements(self) -> int:
        """Elements in the fused buffer, alignment gaps included."""
        return self.offsets[-1] + self.sizes[-1] if self.members else 0

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes of the fused buffer."""
        return self.elements * self.dtype.itemsize


@functools.lru_cache(maxsize=256)
def plan_buckets(
    dtypes: Sequence[np.dtype], sizes: Sequence[int], threshold: int
) -> tuple[Bucket, ...]:
    """Split tensors into buckets of at most ``threshold`` bytes per dtype.

    Args:
        dtypes: Wire dtype of each tensor (a tuple, so plans can be cached).
        sizes: Element count of each tensor.
        threshold: Largest bucket in bytes (members padded to 64-byte
            boundaries); 0 puts every tensor alone.

    Returns:
        Buckets, dtype groups in order of first appearance, members in input order.
    """
    order: dict[np.dtype, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        order.setdefault(np.dtype(dtype), []).append(index)
    buckets: list[Bucket] = []
    for dtype, indices in order.items():
        current: list[int] = []
        current_bytes = 0
        for index in indices:
            nbytes = align_up(sizes[index] * dtype.itemsize)
            if current and current_bytes + nbytes > threshold:
                buckets.append(_bucket(dtype, current, sizes))
                current, current_bytes = [], 0
            current.append(index)
            current_bytes += nbytes
        if current:
            buckets.append(_bucket(dtype, current, sizes))
    return tuple(buckets)


def _bucket(dtype: np.dtype, members: list[int], sizes: Sequence[int]) -> Bucket:
    member_sizes = tuple(int(sizes[i]) for i in members)
    offsets, offset = [], 0
    for size in member_sizes:
        offsets.append(offset)
        offset += align_up(size * dtype.itemsize) // dtype.itemsize
    return Bucket(dtype, tuple(members), tuple(offsets), member_sizes)


def pack(bucket: Bucket, arrays: Sequence[np.ndarray], buf: np.ndarray | None = None) -> np.ndarray:
    """An aligned buffer holding the bucket's members, each on a 64-byte boundary.

    A single member that is already a contiguous array of the right dtype is
    copied as well: the buffer is reduced in place and the caller's input must
    stay untouched (graph inputs alias TensorFlow's memory). A member of
    another dtype is cast on the way in (this is how half-precision
    compression packs), rounding as ``ndarray.astype`` does.

    Args:
        bucket: The bucket (member indices, offsets, sizes, dtype).
        arrays: All tensors of the step as numpy arrays, indexed by member index.
        buf: The aligned 1-D buffer of ``bucket.elements`` elements of
            ``bucket.dtype`` to fill; None allocates one.

    Returns:
        ``buf`` (or the new buffer) holding the members; the gaps between
        members are zeros.
    """
    if buf is None:
        buf = aligned_empty(bucket.elements, bucket.dtype)
    end = 0
    for index, offset, size in zip(bucket.members, bucket.offsets, bucket.sizes, strict=True):
        buf[end:offset] = 0
        cast_into(arrays[index], buf[offset : offset + size])
        end = offset + size
    return buf


def unpack(bucket: Bucket, buf: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> dict:
    """Views of ``buf`` shaped like each member, keyed by member index.

    The views share ``buf``'s memory and start on 64-byte boundaries; the
    engine reuses ``buf`` only once nothing references it (see
    :class:`~ddl_tf.core.numerics.aligned.BufferPool`), so no later collective can
    overwrite them.

    Args:
        bucket: The bucket ``buf`` was packed for.
        buf: The (reduced) 1-D buffer.
        shapes: Shapes of all tensors of the step, indexed by member index.

    Returns:
        ``{member index: view}`` for the bucket's members only.
    """
    return {
        index: buf[offset : offset + size].reshape(shapes[index])
        for index, offset, size in zip(bucket.members, bucket.offsets, bucket.sizes, strict=True)
    }


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
