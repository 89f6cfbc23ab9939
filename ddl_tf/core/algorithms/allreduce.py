"""Allreduce algorithms over mpi4py communicators, on contiguous 1-D numpy buffers.

Two tiny strategy shapes, in the style of Horovod's ``compression.py``:

* a *step algorithm* (:mod:`ddl_tf.core.algorithms.steps`) reduce-scatters a buffer
  inside one communicator and allgathers it back: ``flat``, ``ring``, ``asa``;
* an *allreduce* (here) reduces a buffer in place: ``flat`` (``MPI_Allreduce``),
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
    >>> sorted(STEP_ALGORITHMS)  # the step algorithms each topology level may use
    ['asa', 'flat', 'ring']
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from ddl_tf.core.algorithms.steps import STEP_ALGORITHMS, StepAlgorithm
from ddl_tf.core.numerics import mpi
from ddl_tf.core.numerics.mpi import dtype_info
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.timeline import NULL_TRACER, Tracer
from ddl_tf.errors import ConfigError, TopologyError

__all__ = [
    "Allreduce",
    "FlatAllreduce",
    "ComposedAllreduce",
    "HierarchicalAllreduce",
    "make_allreduce",
]


class Allreduce(abc.ABC):
    """Interface: ``allreduce(buf, op)`` reduces a contiguous 1-D buffer in place."""

    name = "abstract"

    @abc.abstractmethod
    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``buf`` in place across the communicator.

        Args:
            buf: Contiguous 1-D buffer, the same size and dtype on every rank;
                holds the reduced values on return (empty buffers are allowed).
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).
        """

    def allreduce_from(self, src: np.ndarray, dst: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``src`` across the communicator into ``dst``, leaving ``src`` untouched.

        The default copies ``src`` into ``dst`` and reduces in place;
        algorithms that can read their input where it is override it.

        Args:
            src: Contiguous 1-D buffer (may be read-only, e.g. a tensor's memory).
            dst: Contiguous 1-D buffer of the same size and dtype; holds the
                reduced values on return.
            op: The reduction (see :meth:`allreduce`).
        """
        dst[...] = src
        self.allreduce(dst, op)

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
        """Reduce ``buf`` in place across the communicator (see ``Allreduce``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).
        """
        if self._size == 1 or not buf.size:
            return
        spec = self._specs.get((buf.dtype, op)) or self._spec(buf.dtype, op)
        self._reduce(self._in_place, buf, spec)

    def allreduce_from(self, src: np.ndarray, dst: np.ndarray, op: ReduceOp) -> None:
        """One ``MPI_Allreduce`` from ``src`` into ``dst``: no copy of the input.

        Args:
            src: Contiguous 1-D buffer (may be read-only).
            dst: Contiguous 1-D buffer of the same size and dtype.
            op: The reduction (see ``Allreduce``).
        """
        if self._size == 1 or not src.size:
            dst[...] = src
            return
        spec = self._specs.get((src.dtype, op)) or self._spec(src.dtype, op)
        self._reduce([src, spec[0]], dst, spec)

    def _spec(self, dtype: np.dtype, op: ReduceOp) -> tuple[Any, Any]:
        info = dtype_info(dtype)
        spec = self._specs[(dtype, op)] = (info.reduce_type, info.ops[op])
        return spec

    def _reduce(self, send: Any, dst: np.ndarray, spec: tuple[Any, Any]) -> None:
        if self.trace.enabled:
            with self.trace("allreduce", algorithm=self.name, ranks=self._size):
                self.comm.Allreduce(send, [dst, spec[0]], spec[1])
        else:
            self.comm.Allreduce(send, [dst, spec[0]], spec[1])


class ComposedAllreduce(Allreduce):
    """A step algorithm's reduce-scatter followed by its allgather."""

    def __init__(self, steps: StepAlgorithm) -> None:
        self.steps = steps
        self.name = steps.name

    def allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``buf`` in place across the communicator (see ``Allreduce``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).
        """
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
        """Reduce ``buf`` in place across the communicator (see ``Allreduce``).

        Args:
            buf: Contiguous 1-D buffer, same size and dtype on every rank.
            op: The reduction; one MPI knows (SUM, MIN, MAX, PRODUCT; callers
                pass ``ReduceOp.wire_op``, averaging happens after).
        """
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
            one being ``world`` (see :class:`~ddl_tf.core.topology.comms.Communicators`).
        step_algorithms: Step algorithm name per step (None = ``flat``).
        uniform: Whether the topology's groups have equal sizes.
        trace: ``trace(phase, **args)`` context-manager factory (timeline).

    Returns:
        The allreduce object; ``flat`` uses one ``MPI_Allreduce``, ``ring`` and
        ``asa`` compose reduce-scatter and allgather steps, ``hierarchical``
        runs steps per topology level around a top-level allreduce.

    Raises:
        TopologyError: ``hierarchical`` on a topology with unequal groups.
        ConfigError: ``name`` is not one of the four.
    """
    if name == "flat":
        return FlatAllreduce(comm, trace)
    if name in ("ring", "asa"):
        return ComposedAllreduce(STEP_ALGORITHMS[name](comm, trace))
    if name != "hierarchical":
        raise ConfigError(
            f"Unknown allreduce algorithm {name!r}. Received name={name!r}; use flat, ring, asa "
            "or hierarchical (DDL_ALLREDUCE_ALGO also accepts auto)."
        )
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
