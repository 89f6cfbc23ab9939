"""Tensor fusion: pack many small tensors into few buckets, in the same order on every rank.

A bucket holds tensors of one wire dtype, at most ``threshold`` bytes (a
larger tensor gets a bucket of its own). Tensors keep the order they were
given in, grouped by dtype in order of first appearance: the plan is a pure
function of the (dtype, size) list, which every rank has checked to be
identical before any data moves, so all ranks run the same collectives in the
same order.

Every member starts on a 64-byte boundary of a 64-byte aligned buffer (the
gaps are zeros, reduced along with the data), so each reduced member can
become a tensor without a copy (:mod:`~ddl_tf.core.aligned`).

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.fusion import plan_buckets
    >>> f4, f2 = np.dtype("float32"), np.dtype("float16")
    >>> [b.members for b in plan_buckets((f4, f2, f4, f4), (10, 10, 10, 10), 128)]
    [(0, 2), (3,), (1,)]
    >>> plan_buckets((f4, f4), (10, 10), 128)[0].offsets  # element offsets: 64 bytes apart
    (0, 16)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ddl_tf.core.aligned import align_up, aligned_empty
from ddl_tf.core.halfconv import cast_into

__all__ = ["Bucket", "plan_buckets", "pack", "unpack"]


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
    :class:`~ddl_tf.core.aligned.BufferPool`), so no later collective can
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
