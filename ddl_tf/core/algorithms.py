"""Allreduce algorithms over mpi4py communicators, on contiguous 1-D numpy buffers.

Two tiny strategy shapes, in the style of Horovod's ``compression.py``:

* a *step algorithm* reduce-scatters a buffer inside one communicator (each
  rank ends up owning one fully reduced shard) and allgathers it back:
  ``flat`` (MPI's own ``Reduce_scatter``/``Allgatherv``), ``ring``
  (``P - 1`` neighbour exchanges each way), ``asa`` (Theano-MPI's
  ``Alltoallv``, local sum, ``Allgatherv``);
* an *allreduce* reduces a buffer in place: ``flat`` (``MPI_Allreduce``),
  ``ring`` and ``asa`` (their step algorithm's reduce-scatter then allgather)
  and ``hierarchical`` (PowerAI DDL / BlueConnect: reduce-scatter at every
  level of the topology, allreduce the remaining shard across the outermost
  groups, allgather back down, each level with its own step algorithm).

Buffers are numpy arrays handed to MPI through the buffer protocol; nothing
is pickled. Shards are as equal as possible (the first ``n % P`` get one
extra element), so any length works, including 0. Reductions of float16 and
bfloat16 accumulate in float32 (``asa`` adds all ``P`` contributions in
float32 before rounding once); only the wire carries 16-bit values. Every
algorithm leaves bitwise identical results on all ranks.

Example:
    >>> from ddl_tf.core.algorithms import shard_layout
    >>> shard_layout(10, 4)
    ((3, 3, 2, 2), (0, 3, 6, 8))
"""

from __future__ import annotations

import abc
import functools
from typing import Any

import numpy as np

from ddl_tf.core import mpi
from ddl_tf.core.mpi import dtype_info, reduce_into, reduce_rows
from ddl_tf.core.reduce_ops import ReduceOp
from ddl_tf.core.timeline import NULL_TRACER, Tracer
from ddl_tf.core.waiting import wait_all
from ddl_tf.errors import TopologyError

__all__ = [
    "shard_layout",
    "StepAlgorithm",
    "FlatSteps",
    "RingSteps",
    "AlltoallSteps",
    "Allreduce",
    "FlatAllreduce",
    "ComposedAllreduce",
    "HierarchicalAllreduce",
    "STEP_ALGORITHMS",
    "make_allreduce",
]

_RING_TAG = 4711


@functools.lru_cache(maxsize=4096)
def shard_layout(n: int, parts: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Counts and offsets of ``parts`` near-equal shards of ``n`` elements."""
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
        """Reduce ``buf`` across the communicator; return the shard this rank now owns."""

    @abc.abstractmethod
    def allgather(self, buf: np.ndarray, owned: slice) -> None:
        """Fill every shard of ``buf`` from its owner (``owned`` is this rank's shard)."""

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
        self._allgatherv(buf)


class RingSteps(StepAlgorithm):
    """Ring: ``P - 1`` neighbour exchanges to reduce-scatter, ``P - 1`` to allgather.

    Rank ``r`` sends to ``r + 1`` and receives from ``r - 1``; after the
    reduce-scatter it owns shard ``(r + 1) % P``. Bandwidth-optimal
    (``2 (P - 1) / P`` of the buffer per rank), latency ``2 (P - 1)`` hops.
    """

    name = "ring"

    def reduce_scatter(self, buf: np.ndarray, op: ReduceOp) -> slice:
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
    """``Sendrecv`` that waits without spinning (:mod:`~ddl_tf.core.waiting`)."""
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
        self._allgatherv(buf)


STEP_ALGORITHMS: dict[str, type[StepAlgorithm]] = {
    "flat": FlatSteps,
    "ring": RingSteps,
    "asa": AlltoallSteps,
}


class Allreduce(abc.ABC):
    """Interface: ``allreduce(buf, op)`` reduces a contiguous 1-D buffer in place."""

    name = "abstract"

    @abc.abstractmethod
    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``buf`` in place across the communicator."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class FlatAllreduce(Allreduce):
    """One ``MPI_Allreduce``: the MPI library picks its own algorithm."""

    name = "flat"

    def __init__(self, comm: Any, trace: Tracer = NULL_TRACER) -> None:
        self.comm = comm
        self.trace = trace
        self._size = comm.size
        self._in_place = mpi.load().IN_PLACE
        self._specs: dict[tuple[np.dtype, ReduceOp], tuple[Any, Any]] = {}

    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        # the small-message latency path: keep it to one dict lookup and the MPI call
        if self._size == 1 or not buf.size:
            return
        key = (buf.dtype, op)
        spec = self._specs.get(key)
        if spec is None:
            info = dtype_info(buf.dtype)
            spec = self._specs[key] = (info.reduce_type, info.ops[op])
        if self.trace.enabled:
            with self.trace("allreduce", algorithm=self.name, ranks=self._size):
                self.comm.Allreduce(self._in_place, [buf, spec[0]], spec[1])
        else:
            self.comm.Allreduce(self._in_place, [buf, spec[0]], spec[1])


class ComposedAllreduce(Allreduce):
    """A step algorithm's reduce-scatter followed by its allgather."""

    def __init__(self, steps: StepAlgorithm) -> None:
        self.steps = steps
        self.name = steps.name

    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        if self.steps.comm.size == 1 or buf.size == 0:
            return
        owned = self.steps.reduce_scatter(buf, op)
        self.steps.allgather(buf, owned)


class HierarchicalAllreduce(Allreduce):
    """Reduce-scatter per level, allreduce across the top, allgather per level.

    Args:
        levels: Step algorithms from the innermost level outwards; their
            communicators must be the ones :meth:`Topology.steps` describes.
        top: Allreduce among ranks holding the same shard in different
            outermost groups.
    """

    name = "hierarchical"

    def __init__(self, levels: list[StepAlgorithm], top: Allreduce) -> None:
        self.levels = [step for step in levels if step.comm.size > 1]
        self.top = top

    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        if buf.size == 0:
            return
        stack: list[tuple[StepAlgorithm, np.ndarray, slice]] = []
        view = buf
        for step in self.levels:
            owned = step.reduce_scatter(view, op)
            stack.append((step, view, owned))
            view = view[owned]
        self.top.allreduce(view, op)
        for step, parent, owned in reversed(stack):
            step.allgather(parent, owned)


def make_allreduce(
    name: str,
    comm: Any,
    *,
    step_comms: list[tuple[str, Any]] | None = None,
    step_algorithms: list[str | None] | None = None,
    uniform: bool = True,
    trace: Tracer = NULL_TRACER,
) -> Allreduce:
    """Build the allreduce called ``name`` over ``comm``.

    Args:
        name: ``flat``, ``ring``, ``asa`` or ``hierarchical``.
        comm: The job's data communicator.
        step_comms: For ``hierarchical``: ``(level, comm)`` per step, the last
            one being ``world`` (see :class:`~ddl_tf.core.comms.Communicators`).
        step_algorithms: Step algorithm name per step (None = ``flat``).
        uniform: Whether the topology's groups have equal sizes.
        trace: ``trace(phase, **args)`` context-manager factory (timeline).

    Raises:
        TopologyError: ``hierarchical`` on a topology with unequal groups.
    """
    if name == "flat":
        return FlatAllreduce(comm, trace)
    if name in ("ring", "asa"):
        return ComposedAllreduce(STEP_ALGORITHMS[name](comm, trace))
    if name != "hierarchical":
        raise ValueError(f"unknown allreduce {name!r}")
    if not uniform:
        raise TopologyError(
            "The hierarchical allreduce needs groups of equal size at every level (the same "
            "number of ranks per node, of nodes per rack, ...). Received an uneven layout; "
            "launch the same number of ranks on every node, or use DDL_ALLREDUCE_ALGO=auto."
        )
    step_comms = step_comms or [("world", comm)]
    step_algorithms = step_algorithms or [None] * len(step_comms)
    levels = [
        STEP_ALGORITHMS[algo or "flat"](c, trace)
        for (_, c), algo in zip(step_comms[:-1], step_algorithms[:-1], strict=True)
    ]
    top_comm, top_algo = step_comms[-1][1], step_algorithms[-1] or "flat"
    return HierarchicalAllreduce(levels, make_allreduce(top_algo, top_comm, trace=trace))
