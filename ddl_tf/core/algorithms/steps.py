"""Step algorithms: reduce-scatter and allgather inside one communicator.

A *step algorithm* reduce-scatters a contiguous 1-D buffer inside one
communicator (each rank ends up owning one fully reduced shard) and
allgathers it back: ``flat`` (MPI's own ``Reduce_scatter``/``Allgatherv``),
``ring`` (``P - 1`` neighbour exchanges each way), ``asa`` (Theano-MPI's
``Alltoallv``, local sum, ``Allgatherv``). The allreduces of
:mod:`ddl_tf.core.algorithms.allreduce` are built from them.

Shards are as equal as possible (the first ``n % P`` get one extra element),
so any length works, including 0. Reductions of float16 and bfloat16
accumulate in float32 (``asa`` adds all ``P`` contributions in float32 before
rounding once); only the wire carries 16-bit values.

Example:
    >>> from ddl_tf.core.algorithms.steps import shard_layout
    >>> shard_layout(10, 4)
    ((3, 3, 2, 2), (0, 3, 6, 8))
"""

from __future__ import annotations

import abc
import functools
from typing import Any

import numpy as np

from ddl_tf.core.algorithms.waiting import wait_all
from ddl_tf.core.numerics import mpi
from ddl_tf.core.numerics.mpi import dtype_info, reduce_into, reduce_rows
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.timeline import NULL_TRACER, Tracer

__all__ = [
    "shard_layout",
    "StepAlgorithm",
    "FlatSteps",
    "RingSteps",
    "AlltoallSteps",
    "STEP_ALGORITHMS",
]

_RING_TAG = 4711


@functools.lru_cache(maxsize=4096)
def shard_layout(n: int, parts: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Counts and offsets of ``parts`` near-equal shards of ``n`` elements.

    Args:
        n: Number of elements to split.
        parts: Number of shards (the communicator size), at least 1.

    Returns:
        ``(counts, offsets)``: the first ``n % parts`` shards hold one element
        more; offsets are the running sums of the counts, starting at 0.
    """
    base, extra = divmod(n, parts)
    counts = tuple(base + (1 if i < extra else 0) for i in range(parts))
    displs = tuple(int(x) for x in np.concatenate(([0], np.cumsum(counts[:-1]))).tolist())
    return counts, displs


class StepAlgorithm(abc.ABC):
    """Reduce-scatter and allgather inside one communicator."""

    name = "abstract"

    def __init__(self, comm: Any, trace: Tracer = NULL_TRACER) -> None:
        self.comm = comm
        self.trace = trace

    @abc.abstractmethod
    def reduce_scatter(self, buf: np.ndarray, op: ReduceOp) -> slice:
        """Reduce ``buf`` across the communicator; return the shard this rank now owns.

        Args:
            buf: Contiguous 1-D buffer, the same size and dtype on every rank; its
                contents are overwritten (only the owned shard is meaningful
                afterwards).
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).

        Returns:
            The slice of ``buf`` holding this rank's fully reduced shard (its
            position depends on the algorithm).
        """

    @abc.abstractmethod
    def allgather(self, buf: np.ndarray, owned: slice) -> None:
        """Fill every shard of ``buf`` from its owner (``owned`` is this rank's shard).

        Args:
            buf: The buffer :meth:`reduce_scatter` returned ``owned`` for; every
                shard is overwritten with its owner's values.
            owned: The slice this rank owns (what :meth:`reduce_scatter` returned).
        """

    def _own(self, n: int) -> slice:
        counts, displs = shard_layout(n, self.comm.size)
        r = self.comm.rank
        return slice(displs[r], displs[r] + counts[r])

    def _allgatherv(self, buf: np.ndarray) -> None:
        MPI = mpi.load()
        counts, displs = shard_layout(buf.size, self.comm.size)
        info = dtype_info(buf.dtype)
        with self.trace("allgather", algorithm=self.name, ranks=self.comm.size):
            self.comm.Allgatherv(MPI.IN_PLACE, [buf, (counts, displs), info.move_type])


class FlatSteps(StepAlgorithm):
    """MPI's own ``Reduce_scatter`` and ``Allgatherv``; rank ``r`` owns shard ``r``."""

    name = "flat"

    def reduce_scatter(self, buf: np.ndarray, op: ReduceOp) -> slice:
        """Reduce ``buf`` across the communicator (see ``StepAlgorithm``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).

        Returns:
            The slice of ``buf`` this rank now owns, fully reduced.
        """
        counts, _ = shard_layout(buf.size, self.comm.size)
        own = self._own(buf.size)
        info = dtype_info(buf.dtype)
        result = np.empty(counts[self.comm.rank], buf.dtype)
        with self.trace("reduce_scatter", algorithm=self.name, ranks=self.comm.size):
            self.comm.Reduce_scatter(
                [buf, info.reduce_type], [result, info.reduce_type], list(counts), op=info.ops[op]
            )
        buf[own] = result
        return own

    def allgather(self, buf: np.ndarray, owned: slice) -> None:
        """Fill every shard of ``buf`` from its owner (see ``StepAlgorithm``).

        Args:
            buf: The buffer after :meth:`reduce_scatter`.
            owned: The slice this rank owns.
        """
        self._allgatherv(buf)


class RingSteps(StepAlgorithm):
    """Ring: ``P - 1`` neighbour exchanges to reduce-scatter, ``P - 1`` to allgather.

    Rank ``r`` sends to ``r + 1`` and receives from ``r - 1``; after the
    reduce-scatter it owns shard ``(r + 1) % P``. Bandwidth-optimal
    (``2 (P - 1) / P`` of the buffer per rank), latency ``2 (P - 1)`` hops.
    """

    name = "ring"

    def reduce_scatter(self, buf: np.ndarray, op: ReduceOp) -> slice:
        """Reduce ``buf`` across the communicator (see ``StepAlgorithm``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).

        Returns:
            The slice of ``buf`` this rank now owns, fully reduced
            (shard ``(rank + 1) % size``).
        """
        p, r = self.comm.size, self.comm.rank
        counts, displs = shard_layout(buf.size, p)
        move = dtype_info(buf.dtype).move_type
        right, left = (r + 1) % p, (r - 1) % p
        scratch = np.empty(max(counts), buf.dtype)
        with self.trace("reduce_scatter", algorithm=self.name, ranks=p):
            for step in range(p - 1):
                send, recv = (r - step) % p, (r - step - 1) % p
                incoming = scratch[: counts[recv]]
                _exchange(
                    self.comm,
                    [buf[displs[send] : displs[send] + counts[send]], move],
                    right,
                    [incoming, move],
                    left,
                )
                reduce_into(buf[displs[recv] : displs[recv] + counts[recv]], incoming, op)
        own = (r + 1) % p
        return slice(displs[own], displs[own] + counts[own])

    def allgather(self, buf: np.ndarray, owned: slice) -> None:
        """Fill every shard of ``buf`` from its owner (see ``StepAlgorithm``).

        Args:
            buf: The buffer after :meth:`reduce_scatter`.
            owned: The slice this rank owns.
        """
        p, r = self.comm.size, self.comm.rank
        counts, displs = shard_layout(buf.size, p)
        move = dtype_info(buf.dtype).move_type
        right, left = (r + 1) % p, (r - 1) % p
        with self.trace("allgather", algorithm=self.name, ranks=p):
            for step in range(p - 1):
                send, recv = (r + 1 - step) % p, (r - step) % p
                _exchange(
                    self.comm,
                    [buf[displs[send] : displs[send] + counts[send]], move],
                    right,
                    [buf[displs[recv] : displs[recv] + counts[recv]], move],
                    left,
                )


def _exchange(comm: Any, send: list, dest: int, recv: list, source: int) -> None:
    """``Sendrecv`` that waits without spinning (:mod:`~ddl_tf.core.algorithms.waiting`)."""
    wait_all([comm.Irecv(recv, source, _RING_TAG), comm.Isend(send, dest, _RING_TAG)])


class AlltoallSteps(StepAlgorithm):
    """Alltoall-sum-allgather (Theano-MPI): every shard goes straight to its owner.

    One ``Alltoallv`` moves shard ``j`` of every rank to rank ``j``, which adds
    the ``P`` contributions locally (in float32 for 16-bit floats) and an
    ``Allgatherv`` returns the result. Transfer and arithmetic are separate,
    which suits devices that move data faster than MPI reduces it.
    """

    name = "asa"

    def reduce_scatter(self, buf: np.ndarray, op: ReduceOp) -> slice:
        """Reduce ``buf`` across the communicator (see ``StepAlgorithm``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).

        Returns:
            The slice of ``buf`` this rank now owns, fully reduced.
        """
        p, r = self.comm.size, self.comm.rank
        counts, displs = shard_layout(buf.size, p)
        move = dtype_info(buf.dtype).move_type
        mine = counts[r]
        rows = np.empty(p * mine, buf.dtype)
        with self.trace("alltoall", algorithm=self.name, ranks=p):
            self.comm.Alltoallv(
                [buf, (counts, displs), move],
                [rows, ((mine,) * p, tuple(i * mine for i in range(p))), move],
            )
        own = slice(displs[r], displs[r] + mine)
        with self.trace("local_reduce", algorithm=self.name, ranks=p):
            reduce_rows(rows.reshape(p, mine), op, out=buf[own])
        return own

    def allgather(self, buf: np.ndarray, owned: slice) -> None:
        """Fill every shard of ``buf`` from its owner (see ``StepAlgorithm``).

        Args:
            buf: The buffer after :meth:`reduce_scatter`.
            owned: The slice this rank owns.
        """
        self._allgatherv(buf)


STEP_ALGORITHMS: dict[str, type[StepAlgorithm]] = {
    "flat": FlatSteps,
    "ring": RingSteps,
    "asa": AlltoallSteps,
}
