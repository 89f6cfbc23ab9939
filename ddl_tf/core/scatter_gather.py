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
from ddl_tf.core.aligned import aligned_empty
from ddl_tf.core.compression import Compression, Compressor
from ddl_tf.core.guard import layout_text
from ddl_tf.core.mpi import check_reducible, dtype_info
from ddl_tf.core.reduce_ops import ReduceOp, parse_op
from ddl_tf.core.scaling import postscale_factor as combined_postscale
from ddl_tf.core.scaling import scale
from ddl_tf.core.steps import shard_layout
from ddl_tf.errors import CollectiveArgumentError, DDLError

__all__ = ["ScatterGather"]


class ScatterGather:
    """Reducescatter, allgather, broadcast, alltoall and object collectives of the engine.

    Relies on the engine's ``_collective`` guard, ``comms``, ``config``,
    ``timeline``, ``rank`` and ``size``.
    """

    # ------------------------------------------------------------------ reducescatter

    def reducescatter(self, array: np.ndarray, **kwargs: Any) -> np.ndarray:
        """One array's :meth:`grouped_reducescatter`.

        Args:
            array: The array to reduce; at least one dimension.
            **kwargs: ``op``, ``compression``, ``name``, ``prescale_factor`` and
                ``postscale_factor``, as for :meth:`grouped_reducescatter`.

        Returns:
            This rank's rows of the reduced array.
        """
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

        Args:
            arrays: The arrays to reduce; same shapes and dtypes on every rank,
                each with at least one dimension.
            op: A :class:`ReduceOp` or its name; None means Average.
            compression: Wire compression (a compressor or ``"none"``/``"fp16"``/
                ``"bf16"``); None uses the engine config's.
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.
            prescale_factor: Multiplies each input before the reduction.
            postscale_factor: Multiplies each result after it (Average also
                divides by the number of ranks).

        Returns:
            One array per input: this rank's rows of the reduced result.

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
        mine = aligned_empty((rows[self.rank], *array.shape[1:]), wire.dtype)
        info = dtype_info(wire.dtype)
        with self.timeline.phase("reduce_scatter", algorithm="flat"):
            self.comms.data.Reduce_scatter(
                [wire, info.reduce_type],
                [mine, info.reduce_type],
                [r * row for r in rows],
                op=info.ops[op.wire_op],
            )
        result = comp.decompress(mine, ctx)  # ``mine`` or a new array: ours to scale in place
        return scale(result, factor, out=result)

    # ------------------------------------------------------------------ movement

    def allgather(self, array: np.ndarray, *, name: str | None = None) -> np.ndarray:
        """Concatenate every rank's array along the first dimension (which may differ).

        Args:
            array: This rank's array; at least one dimension, the trailing
                dimensions and the dtype equal on every rank.
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            The ranks' arrays concatenated in rank order.

        Raises:
            CollectiveArgumentError: ``array`` is a scalar.
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
        return self.grouped_allgather([array], name=name)[0]

    def grouped_allgather(
        self, arrays: Sequence[np.ndarray], *, name: str | None = None
    ) -> list[np.ndarray]:
        """:meth:`allgather` of several arrays under one negotiation.

        Args:
            arrays: This rank's arrays (see :meth:`allgather`).
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            One concatenated array per input.

        Raises:
            CollectiveArgumentError: an array is a scalar.
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
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
        """The root's arrays on every rank (one fused message).

        Args:
            arrays: The arrays; only the root's values are sent, but every rank
                passes the same shapes and dtypes.
            root_rank: Rank whose values everyone receives.
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            New arrays holding the root's values.

        Raises:
            ConfigError: ``root_rank`` is not a rank of the job.
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
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

        Returns:
            ``(received rows, received splits)``: the rows from every rank
            concatenated in rank order, and how many came from each rank.

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
        """A picklable object from the root, on every rank.

        Args:
            obj: Any picklable object; only the root's is used.
            root_rank: Rank whose object everyone receives.
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            The root's object (unpickled anew on the other ranks).

        Raises:
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
        with self._collective("broadcast_object", name, root_rank):
            return self.comms.data.bcast(obj, root=root_rank)

    def allgather_object(self, obj: Any, *, name: str | None = None) -> list[Any]:
        """Every rank's picklable object, in rank order.

        Args:
            obj: This rank's picklable object.
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            A list with one object per rank, in rank order.

        Raises:
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
        with self._collective("allgather_object", name):
            return self.comms.data.allgather(obj)

    def barrier(self, *, name: str | None = None) -> None:
        """Wait until every rank arrives (with stall reporting when checks are on).

        Args:
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Raises:
            CollectiveMismatchError: the ranks called different collectives, or with
                different fields (with the consistency checks on).
            StallError: a rank did not join within ``stall_shutdown_seconds``.
            DDLError: the engine was shut down, or an earlier collective failed.
        """
        with self._collective("barrier", name):
            if self.negotiator is None:
                self.comms.data.Barrier()

    def refuse(self, kind: str, error: DDLError, *, name: str | None = None) -> None:
        """Take part in collective ``kind`` that this rank cannot run because of ``error``.

        The other ranks are inside (or about to enter) a collective; instead of
        leaving them waiting, this rank negotiates a refusal, and every rank
        raises ``error``'s class with a message naming this rank.

        Args:
            kind: The collective the other ranks are running.
            error: Why this rank cannot take part; an instance of one of
                ``REFUSALS``.
            name: The call's name, as the other ranks give it.

        Raises:
            DDLError: Always: ``error``'s class (one of
                :data:`~ddl_tf.core.negotiation.REFUSALS`).
        """
        with self._collective(kind, name, error=error):
            pass
        raise error  # pragma: no cover - the guard raises before the body runs
