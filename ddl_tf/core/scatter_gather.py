"""The engine's collectives that split or move data (a mixin of :class:`~ddl_tf.core.engine.Engine`).

Reducescatter (grouped), allgather (grouped), broadcast, alltoall, Python
objects, barrier, and :meth:`ScatterGather.refuse`. Each runs inside the
engine's collective guard (lock, negotiation, timeline), so mismatches and
argument errors are raised on every rank before any data moves. Argument
checks that depend only on negotiated fields (dtype, shape, op, root) run
after the negotiation, where every rank reaches the same verdict; checks on
what may legitimately differ per rank (first dimensions, alltoall splits)
run before it and travel in the descriptor as a refusal.

Example (one process):
    >>> import numpy as np
    >>> from ddl_tf import basics
    >>> engine = basics.init()
    >>> [a.shape for a in engine.grouped_allgather([np.zeros((2, 3)), np.zeros(4)])]
    [(2, 3), (4,)]
    >>> engine.alltoall(np.arange(3), splits=[2])
    Traceback (most recent call last):
    ...
    ddl_tf.errors.CollectiveArgumentError: alltoall splits must give one non-negative row count per rank (1) summing to the first dimension (3). Received splits=[2].
    >>> basics.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl_tf.core import movement
from ddl_tf.core.algorithms import shard_layout
from ddl_tf.core.compression import Compression, Compressor
from ddl_tf.core.guard import layout_text
from ddl_tf.core.mpi import check_reducible, dtype_info
from ddl_tf.core.reduce_ops import ReduceOp, parse_op
from ddl_tf.core.scaling import postscale_factor as combined_postscale
from ddl_tf.core.scaling import scale
from ddl_tf.errors import CollectiveArgumentError, DDLError

__all__ = ["ScatterGather"]


class ScatterGather:
    """Reducescatter, allgather, broadcast, alltoall and object collectives of the engine.

    Relies on the engine's ``_collective`` guard, ``comms``, ``config``,
    ``timeline``, ``rank`` and ``size``.
    """

    # ------------------------------------------------------------------ reducescatter

    def reducescatter(self, array: np.ndarray, **kwargs: Any) -> np.ndarray:
        """One array's :meth:`grouped_reducescatter`."""
        return self.grouped_reducescatter([array], **kwargs)[0]

    def grouped_reducescatter(
        self,
        arrays: Sequence[np.ndarray],
        *,
        op: ReduceOp | str | None = ReduceOp.AVERAGE,
        compression: Compressor | str | None = None,
        name: str | None = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> list[np.ndarray]:
        """Reduce each array and return this rank's rows of its first dimension.

        Rank ``r`` receives rows ``shard_layout(rows, size)`` (the first
        ``rows % size`` ranks get one extra row), as Horovod splits them.

        Raises:
            CollectiveArgumentError: A scalar (on every rank: shapes are negotiated).
            ConfigError: The op is not defined for the dtype.
        """
        op = parse_op(op)
        comp = Compression.get(compression if compression is not None else self.config.compression)
        arrays = [np.asarray(a) for a in arrays]
        layout = tuple((str(a.dtype), a.shape) for a in arrays)
        with self._collective(
            "reducescatter",
            name,
            layout,
            op.value,
            comp.name,
            prescale_factor,
            postscale_factor,
            summary=lambda: f"of {layout_text(arrays)} op={op.value} compression={comp.name}",
        ):
            for array in arrays:  # negotiated fields only: every rank reaches the same verdict
                check_reducible(array.dtype, op)
                if array.ndim == 0:
                    raise CollectiveArgumentError(
                        "reducescatter splits the first dimension, so it needs a tensor with at "
                        f"least one dimension. Received a scalar of dtype {array.dtype}; reshape "
                        "it to [1] first (e.g. tf.reshape(x, [1]))."
                    )
            factor = combined_postscale(postscale_factor, op is ReduceOp.AVERAGE, self.size)
            return [self._reduce_scatter(a, op, comp, prescale_factor, factor) for a in arrays]

    def _reduce_scatter(self, array, op, comp, prescale, factor) -> np.ndarray:
        wire, ctx = comp.compress(np.ascontiguousarray(scale(array, prescale)))
        rows, _ = shard_layout(array.shape[0], self.size)
        row = int(np.prod(array.shape[1:], dtype=np.int64))
        mine = np.empty((rows[self.rank], *array.shape[1:]), wire.dtype)
        info = dtype_info(wire.dtype)
        with self.timeline.phase("reduce_scatter", algorithm="flat"):
            self.comms.data.Reduce_scatter(
                [wire, info.reduce_type],
                [mine, info.reduce_type],
                [r * row for r in rows],
                op=info.ops[op.wire_op],
            )
        return scale(comp.decompress(mine, ctx), factor)

    # ------------------------------------------------------------------ movement

    def allgather(self, array: np.ndarray, *, name: str | None = None) -> np.ndarray:
        """Concatenate every rank's array along the first dimension (which may differ)."""
        return self.grouped_allgather([array], name=name)[0]

    def grouped_allgather(
        self, arrays: Sequence[np.ndarray], *, name: str | None = None
    ) -> list[np.ndarray]:
        """:meth:`allgather` of several arrays under one negotiation."""
        arrays = [np.asarray(a) for a in arrays]
        layout = tuple((str(a.dtype), a.shape[1:], a.ndim) for a in arrays)
        with self._collective(
            "allgather",
            name,
            layout,
            summary=lambda: (
                "of "
                + ", ".join(f"{a.dtype}[?, {', '.join(map(str, a.shape[1:]))}]" for a in arrays[:4])
            ),
        ):
            return [movement.allgatherv(self.comms.data, a) for a in arrays]

    def broadcast(
        self, arrays: Sequence[np.ndarray], root_rank: int, *, name: str | None = None
    ) -> list[np.ndarray]:
        """The root's arrays on every rank (one fused message)."""
        arrays = [np.asarray(a) for a in arrays]
        layout = tuple((str(a.dtype), a.shape) for a in arrays)
        with self._collective(
            "broadcast",
            name,
            layout,
            root_rank,
            summary=lambda: f"of {layout_text(arrays)} from rank {root_rank}",
        ):
            return movement.broadcast_arrays(self.comms.data, arrays, root_rank)

    def alltoall(
        self,
        array: np.ndarray,
        splits: Sequence[int] | None = None,
        *,
        name: str | None = None,
        even: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scatter row slices to every rank and gather theirs; returns (rows, received splits).

        Args:
            array: At least one dimension; rows are slices of the first.
            splits: Rows for each rank; None splits the first dimension as
                evenly as possible (the first ranks get one more row).
            name: Optional name (compared across ranks).
            even: Without ``splits``, require the first dimension to be a
                multiple of the number of ranks (Horovod's rule).

        Raises:
            CollectiveArgumentError: Bad splits, a scalar, or an uneven first
                dimension with ``even``, on any rank: raised on every rank.
        """
        array = np.asarray(array)
        problem = movement.alltoall_problem(array, splits, self.size, even=even)
        with self._collective(
            "alltoall",
            name,
            str(array.dtype),
            array.shape[1:],
            array.ndim,
            error=None if problem is None else CollectiveArgumentError(problem),
        ):
            return movement.alltoallv(self.comms.data, array, splits)

    # ------------------------------------------------------------------ objects, sync

    def broadcast_object(self, obj: Any, root_rank: int = 0, *, name: str | None = None) -> Any:
        """A picklable object from the root, on every rank."""
        with self._collective("broadcast_object", name, root_rank):
            return self.comms.data.bcast(obj, root=root_rank)

    def allgather_object(self, obj: Any, *, name: str | None = None) -> list[Any]:
        """Every rank's picklable object, in rank order."""
        with self._collective("allgather_object", name):
            return self.comms.data.allgather(obj)

    def barrier(self, *, name: str | None = None) -> None:
        """Wait until every rank arrives (with stall reporting when checks are on)."""
        with self._collective("barrier", name):
            if self.negotiator is None:
                self.comms.data.Barrier()

    def refuse(self, kind: str, error: DDLError, *, name: str | None = None) -> None:
        """Take part in collective ``kind`` that this rank cannot run because of ``error``.

        The other ranks are inside (or about to enter) a collective; instead of
        leaving them waiting, this rank negotiates a refusal, and every rank
        raises ``error``'s class with a message naming this rank.

        Raises:
            DDLError: Always: ``error``'s class (one of
                :data:`~ddl_tf.core.negotiation.REFUSALS`).
        """
        with self._collective(kind, name, error=error):
            pass
        raise error  # pragma: no cover - the guard raises before the body runs
