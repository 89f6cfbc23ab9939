"""Adasum (adaptive summation) over MPI, in numpy: Maleki et al., MLSys 2021.

Two gradients ``a`` and ``b`` combine as::

    (1 - a.b / (2 |a|^2)) a  +  (1 - a.b / (2 |b|^2)) b

per tensor: a sum when they are orthogonal, their average when they are
parallel. A side whose squared norm is below ``sqrt(DBL_MIN)`` (a zero
vector) keeps the coefficient 1, so nothing is divided by zero and the zero
side contributes nothing (Horovod's rule). ``2^k`` ranks combine pairwise in a
binary tree: ranks ``2i`` and ``2i+1``, then the results of ``{0, 1}`` and
``{2, 3}``, and so on, ``a`` always being the lower ranks' side.

:class:`Adasum` runs that tree by vector halving and distance doubling. At the
level of distance ``d`` a rank exchanges half of the part of the fused buffer
it holds with rank ``rank ^ d`` and keeps the other half of both sides. The
dot products and squared norms need whole tensors, whose pieces are now
spread over the ``2d`` ranks of the group, so each rank sums its pieces'
partial products per tensor (in float64, whatever the dtype) and the group
adds them up by recursive doubling; then every rank combines its half. After
``log2(P)`` levels each rank holds ``1/P`` of the result, and an allgather
puts it together on every rank. Each element is computed once, by one rank,
so every rank ends with bitwise the same values. Data moves as bytes
(``Sendrecv``/``Allgatherv`` on the engine's data communicator); nothing is
pickled and no communicator is created.

:class:`HierarchicalAdasum` is Horovod's form across nodes: the ranks of a
node average their tensors (one ``MPI_Allreduce`` on the node communicator),
then the ranks with the same local rank run Adasum across the nodes. The
number of nodes must then be a power of two; with one rank per node, or one
node, it is plain Adasum.

Example (the pairwise rule on two orthogonal and two parallel vectors):
    >>> import numpy as np
    >>> a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    >>> ca, cb = pair_coefficients(np.array([a @ b]), np.array([a @ a]), np.array([b @ b]))
    >>> (ca * a + cb * b).tolist(), float(pair_coefficients([2.0], [1.0], [4.0])[0][0])
    ([1.0, 2.0], 0.0)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl_tf.core.numerics import mpi
from ddl_tf.core.numerics.compression import Compressor
from ddl_tf.core.numerics.scaling import scale
from ddl_tf.errors import ConfigError, UnsupportedError

__all__ = [
    "ADASUM_DTYPES",
    "Adasum",
    "HierarchicalAdasum",
    "adasum_arrays",
    "check_dtype",
    "check_size",
    "is_power_of_two",
    "pair_coefficients",
]

ADASUM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
"""The dtypes Adasum combines (Horovod's: float16, float32, float64)."""

_NORM_FLOOR = math.sqrt(sys.float_info.min)  # Horovod's threshold for "a zero vector"
_DATA_TAG, _SUMS_TAG = 0xADA, 0xADB


def is_power_of_two(n: int) -> bool:
    """Whether ``n`` is 1, 2, 4, 8, ..."""
    return n > 0 and n & (n - 1) == 0


def check_size(size: int, what: str = "ranks") -> None:
    """Refuse a tree that is not a power of two wide.

    Args:
        size: The number of tree leaves (ranks, or nodes in the hierarchical form).
        what: What the leaves are, for the message.

    Raises:
        UnsupportedError: ``size`` is not a power of two (a ``NotImplementedError``,
            as Horovod raises).
    """
    if not is_power_of_two(size):
        lower = 1 << (size.bit_length() - 1)
        raise UnsupportedError(
            f"Adasum needs a power-of-two number of {what}, as in Horovod. Received {size} "
            f"{what}; launch {lower} or {lower * 2}, or use op=Average."
        )


def check_dtype(dtype: np.dtype, op: Any = None) -> None:
    """Refuse a dtype Adasum does not combine (``op`` is accepted for the engine's check table).

    Raises:
        ConfigError: Not float16, float32 or float64.
    """
    if np.dtype(dtype) not in ADASUM_DTYPES:
        raise ConfigError(
            f"Adasum combines float16, float32 and float64 tensors. Received dtype="
            f"{np.dtype(dtype)}; cast to float32 first, or use op=Average or op=Sum."
        )


def pair_coefficients(dot: Any, anormsq: Any, bnormsq: Any) -> tuple[np.ndarray, np.ndarray]:
    """Adasum's per-tensor coefficients of ``a`` and ``b``, in float64.

    Args:
        dot: ``a.b`` per tensor.
        anormsq: ``|a|^2`` per tensor.
        bnormsq: ``|b|^2`` per tensor.

    Returns:
        ``(1 - dot / (2 |a|^2), 1 - dot / (2 |b|^2))``, with 1 where the
        squared norm is below ``sqrt(DBL_MIN)``.
    """
    dot, anormsq, bnormsq = (np.asarray(x, np.float64) for x in (dot, anormsq, bnormsq))
    with np.errstate(divide="ignore", invalid="ignore"):
        ca = np.where(anormsq >= _NORM_FLOOR, 1.0 - 0.5 * dot / anormsq, 1.0)
        cb = np.where(bnormsq >= _NORM_FLOOR, 1.0 - 0.5 * dot / bnormsq, 1.0)
    return ca, cb


def _bytes(array: np.ndarray, MPI: Any) -> list:
    return [array.view(np.uint8), MPI.BYTE]


class Adasum:
    """Adasum of fused tensors across a communicator of ``2^k`` ranks.

    Args:
        comm: The communicator (every rank calls :meth:`reduce` with the same
            tensor sizes and dtype).
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def check(self) -> None:
        """Raise :class:`~ddl_tf.errors.UnsupportedError` unless the ranks are ``2^k``."""
        check_size(self.comm.size)

    def reduce(self, buf: np.ndarray, counts: Sequence[int]) -> None:
        """Replace ``buf`` by the Adasum of every rank's ``buf``, tensor by tensor.

        Args:
            buf: Contiguous 1-D buffer of float16/32/64: the tensors one after
                the other.
            counts: Element count of each tensor in ``buf`` (they add up to ``buf.size``).

        Raises:
            UnsupportedError: The communicator's size is not a power of two.
        """
        size, rank = self.comm.size, self.comm.rank
        check_size(size)
        if size == 1 or buf.size == 0:
            return
        MPI = mpi.load()
        bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        scratch = np.empty((buf.size + 1) // 2, buf.dtype)
        lo, hi, distance = 0, buf.size, 1
        while distance < size:
            partner, lower = rank ^ distance, not rank & distance
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
            theirs = scratch[: keep[1] - keep[0]]
            self.comm.Sendrecv(
                _bytes(buf[give[0] : give[1]], MPI),
                partner,
                _DATA_TAG,
                _bytes(theirs, MPI),
                partner,
                _DATA_TAG,
            )
            mine = buf[keep[0] : keep[1]]
            a, b = (mine, theirs) if lower else (theirs, mine)
            a64, b64 = a.astype(np.float64), b.astype(np.float64)  # copies: ours to overwrite
            sums = self._group_sum(_partial_sums(a64, b64, bounds, *keep), distance, MPI)
            ca, cb = pair_coefficients(sums[:, 0], sums[:, 1], sums[:, 2])
            lengths = np.diff(np.clip(bounds, *keep))
            if np.count_nonzero(lengths) == 1:  # one tensor here: scalar coefficients
                t = int(np.flatnonzero(lengths)[0])
                a64 *= ca[t]
                b64 *= cb[t]
            else:
                a64 *= np.repeat(ca, lengths)
                b64 *= np.repeat(cb, lengths)
            a64 += b64
            mine[...] = a64
            lo, hi = keep
            distance *= 2
        self._allgather(buf, lo, hi, MPI)

    def _group_sum(self, sums: np.ndarray, distance: int, MPI: Any) -> np.ndarray:
        """Add ``sums`` over the ``2 * distance`` ranks of this rank's group (recursive doubling;
        ``x + y == y + x``, so the group ends with bitwise equal sums)."""
        received = np.empty_like(sums)
        step = 1
        while step <= distance:
            partner = self.comm.rank ^ step
            self.comm.Sendrecv(
                [sums, MPI.DOUBLE], partner, _SUMS_TAG, [received, MPI.DOUBLE], partner, _SUMS_TAG
            )
            sums = sums + received
            step *= 2
        return sums

    def _allgather(self, buf: np.ndarray, lo: int, hi: int, MPI: Any) -> None:
        ranges = [_final_range(r, self.comm.size, buf.size) for r in range(self.comm.size)]
        item = buf.dtype.itemsize
        counts = [(h - lo_) * item for lo_, h in ranges]
        displs = [lo_ * item for lo_, _ in ranges]
        piece = buf[lo:hi].copy()
        self.comm.Allgatherv(_bytes(piece, MPI), [buf.view(np.uint8), counts, displs, MPI.BYTE])


def _final_range(rank: int, size: int, n: int) -> tuple[int, int]:
    """The elements ``[lo, hi)`` of an ``n``-element buffer that ``rank`` holds after halving."""
    lo, hi, distance = 0, n, 1
    while distance < size:
        mid = lo + (hi - lo) // 2
        lo, hi = (lo, mid) if not rank & distance else (mid, hi)
        distance *= 2
    return lo, hi


_FEW_TENSORS = 32  # up to this many tensors in a piece: one dot loop each, else reduceat


def _partial_sums(a64: np.ndarray, b64: np.ndarray, bounds: np.ndarray, lo: int, hi: int):
    """``[a.b, |a|^2, |b|^2]`` per tensor over the elements ``lo:hi`` that ``a64`` and ``b64``
    (float64) hold; zeros for tensors with no element there."""
    sums = np.zeros((len(bounds) - 1, 3))
    if hi == lo:
        return sums
    starts = np.clip(bounds, lo, hi) - lo
    present = np.flatnonzero(starts[1:] > starts[:-1])
    if present.size <= _FEW_TENSORS:
        for t in present:
            x, y = a64[starts[t] : starts[t + 1]], b64[starts[t] : starts[t + 1]]
            # einsum's own loop: BLAS's threads would spin against the other ranks' cores
            sums[t] = (np.einsum("i,i->", x, y), np.einsum("i,i->", x, x), np.einsum("i,i->", y, y))
    else:
        at = starts[present]
        sums[present, 0] = np.add.reduceat(a64 * b64, at)
        sums[present, 1] = np.add.reduceat(a64 * a64, at)
        sums[present, 2] = np.add.reduceat(b64 * b64, at)
    return sums


class HierarchicalAdasum:
    """Average inside each node, then Adasum across nodes (Horovod's form across nodes).

    Args:
        node: The communicator of this rank's node.
        cross: The communicator of the ranks with this rank's local rank, one per node.
    """

    def __init__(self, node: Any, cross: Any) -> None:
        self.node = node
        self.across = Adasum(cross)

    def check(self) -> None:
        """Raise :class:`~ddl_tf.errors.UnsupportedError` unless the nodes are ``2^k``."""
        check_size(self.across.comm.size, "nodes")

    def reduce(self, buf: np.ndarray, counts: Sequence[int]) -> None:
        """Replace ``buf`` by the Adasum across nodes of each node's average.

        Args:
            buf: Contiguous 1-D buffer of float16/32/64.
            counts: Element count of each tensor in ``buf``.

        Raises:
            UnsupportedError: The number of nodes is not a power of two.
        """
        self.check()
        if buf.size and self.node.size > 1:
            wide = buf.astype(np.float64)  # float16 sums without overflow or rounding
            self.node.Allreduce(mpi.load().IN_PLACE, wide, op=mpi.load().SUM)
            buf[...] = (wide / self.node.size).astype(buf.dtype)
        self.across.reduce(buf, counts)


def adasum_arrays(
    reducer: Adasum | HierarchicalAdasum,
    arrays: Sequence[np.ndarray],
    comp: Compressor,
    postscale: float,
    timeline: Any,
) -> list[np.ndarray]:
    """The engine's Adasum of ``arrays``: compressed first, fused per wire dtype, tensor by tensor.

    Args:
        reducer: The engine's :class:`Adasum` or :class:`HierarchicalAdasum`.
        arrays: The tensors, the same dtypes and shapes on every rank.
        comp: The wire compressor (``fp16`` casts to float16 before Adasum, as Horovod).
        postscale: Multiply the results by this.
        timeline: The engine's timeline (an ``adasum`` phase per dtype).

    Returns:
        New arrays with the combined values, in the input dtypes and shapes.

    Raises:
        ConfigError: A wire dtype Adasum does not combine (e.g. ``bf16`` compression).
    """
    pairs = [comp.compress(a) for a in arrays]
    out: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
    groups: dict[np.dtype, list[int]] = {}
    for i, (wire, _) in enumerate(pairs):
        groups.setdefault(wire.dtype, []).append(i)
    for dtype, members in groups.items():
        check_dtype(dtype)  # the same wire dtypes everywhere: every rank refuses alike
        counts = [pairs[i][0].size for i in members]
        buf = np.concatenate([pairs[i][0].reshape(-1) for i in members])
        with timeline.phase("adasum", bytes=buf.nbytes, tensors=len(members)):
            reducer.reduce(buf, counts)
        offset = 0
        for i, n in zip(members, counts, strict=True):
            view = buf[offset : offset + n].reshape(arrays[i].shape)
            out[i] = scale(comp.decompress(view, pairs[i][1]), postscale)
            offset += n
    return out
