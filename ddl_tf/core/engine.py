"""The engine: every collective of ddl_tf on numpy arrays, checked, fused, traced.

Each collective runs the same pipeline on every rank:

1. take the engine lock (graph ops run on TensorFlow threads; one collective
   at a time keeps MPI calls serialized and in program order);
2. negotiate a descriptor (:mod:`~ddl_tf.core.negotiation`), once per call,
   so mismatches raise and stalls are reported before any data moves;
3. for allreduce: compress, fuse into buckets (:mod:`~ddl_tf.core.fusion`),
   pick the algorithm per bucket (``auto`` or forced), reduce, unpack,
   decompress, average.

The engine knows nothing of TensorFlow: :mod:`ddl_tf.bridge` feeds it.
Example (one process, so every collective returns its input):

    >>> import numpy as np
    >>> from ddl_tf import basics
    >>> engine = basics.init()
    >>> engine.allreduce([np.array([1.0, 2.0], np.float32)], op="sum")
    [array([1., 2.], dtype=float32)]
    >>> basics.shutdown()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl_tf.config import DDLConfig
from ddl_tf.core import movement
from ddl_tf.core.algorithms import Allreduce, make_allreduce, shard_layout
from ddl_tf.core.comms import Communicators
from ddl_tf.core.compression import Compression, Compressor
from ddl_tf.core.fusion import pack, plan_buckets, unpack
from ddl_tf.core.guard import CollectiveGuard, CollectiveStats, layout_text
from ddl_tf.core.mpi import accumulation_dtype, check_reducible, dtype_info
from ddl_tf.core.negotiation import Descriptor, Negotiator
from ddl_tf.core.reduce_ops import ReduceOp, parse_op
from ddl_tf.core.selection import AutoPolicy
from ddl_tf.core.timeline import NullTimeline, Timeline, Tracer, merge_traces
from ddl_tf.core.topology import Topology
from ddl_tf.errors import DDLError

__all__ = ["Engine"]

logger = logging.getLogger(__name__)


class Engine:
    """Collectives of one rank over its communicators.

    Args:
        comms: Communicators from :func:`ddl_tf.core.comms.build_communicators`.
        topology: This rank's topology.
        config: Job configuration.
        policy: Table behind ``auto``.
        host: Host name (timeline label).
    """

    def __init__(
        self,
        comms: Communicators,
        topology: Topology,
        config: DDLConfig,
        policy: AutoPolicy,
        host: str = "",
    ) -> None:
        self.comms = comms
        self.topology = topology
        self.config = config
        self.policy = policy
        self.rank, self.size = topology.rank, topology.size
        self._lock = threading.RLock()
        self._failed: BaseException | None = None
        self._closed = False
        self._host = host
        self.stats = CollectiveStats()
        self.timeline = (
            Timeline(config.timeline, self.rank, host) if config.timeline else NullTimeline()
        )
        self.negotiator = (
            Negotiator(comms.control, config.stall_warning_seconds, config.stall_shutdown_seconds)
            if config.check_collectives
            else None
        )

        trace = self._tracer = Tracer(self.timeline)  # start/stop_timeline repoint it
        self._choices: dict[tuple[int, np.dtype], Allreduce] = {}
        self._descriptors: dict[tuple, Descriptor] = {}
        self._reducible: set[tuple[np.dtype, ReduceOp]] = set()
        steps = topology.steps()
        # (nodes, ranks per node) only when uniform: every rank must see the same key
        self._layout = (topology.num_nodes, topology.local_size) if topology.is_uniform else None
        self.algorithms: dict[str, Allreduce] = {
            name: make_allreduce(name, comms.data, trace=trace) for name in ("flat", "ring", "asa")
        }
        if topology.is_uniform:
            self.algorithms["hierarchical"] = make_allreduce(
                "hierarchical",
                comms.data,
                step_comms=comms.steps,
                step_algorithms=[
                    s.algorithm or policy.step_algorithm(s.level, layout=self._layout)
                    for s in steps
                ],
                trace=trace,
            )
        elif config.algorithm == "hierarchical":
            make_allreduce("hierarchical", comms.data, uniform=False)  # raises TopologyError

    # ------------------------------------------------------------------ plumbing

    def choose(self, nbytes: int, dtype: np.dtype) -> Allreduce:
        """The allreduce for a fused buffer of ``nbytes`` bytes of ``dtype``."""
        key = (nbytes, dtype)
        chosen = self._choices.get(key)
        if chosen is not None:
            return chosen
        name = self.config.algorithm
        if name == "auto":
            name = self.policy.choose(
                nbytes,
                num_nodes=self.topology.num_nodes,
                hierarchical_ok="hierarchical" in self.algorithms,
                custom_op=dtype_info(dtype).custom_op,
                layout=self._layout,
            )
        if len(self._choices) > 4096:  # many distinct sizes: keep the cache bounded
            self._choices.clear()
        chosen = self._choices[key] = self.algorithms[name]
        return chosen

    def _collective(
        self, kind: str, name: str | None, *fields: Any, summary=None
    ) -> CollectiveGuard:
        """Context for one collective: lock, negotiate, trace, failure bookkeeping.

        ``fields`` (hashable) identify the collective across ranks; ``summary``
        (text, or a callable producing it) is what error messages show. Both are
        turned into a :class:`Descriptor` once per distinct collective and cached.
        """
        return CollectiveGuard(self, kind, name, fields, summary)

    def _descriptor(self, kind: str, name: str | None, fields: tuple, summary) -> Descriptor:
        key = (kind, name, fields)
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            text = summary() if callable(summary) else summary
            descriptor = Descriptor.make(kind, name, *fields, summary=text)
            if len(self._descriptors) > 4096:
                self._descriptors.clear()
            self._descriptors[key] = descriptor
        return descriptor

    # ------------------------------------------------------------------ allreduce

    def allreduce(
        self,
        arrays: Sequence[np.ndarray],
        *,
        op: ReduceOp | str | None = ReduceOp.AVERAGE,
        compression: Compressor | str | None = None,
        name: str | None = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> list[np.ndarray]:
        """Reduce each array across ranks (one negotiation, fused buckets).

        Args:
            arrays: Arrays with the same dtypes and shapes, in the same order,
                on every rank.
            op: Average (default), Sum, Min, Max or Product.
            compression: Wire compression; None uses the configured default.
            name: Optional name (compared across ranks).
            prescale_factor: Multiply inputs before reducing.
            postscale_factor: Multiply results after reducing (and averaging).

        Returns:
            New arrays with the reduced values, same dtypes and shapes.
        """
        op = parse_op(op)
        comp = Compression.get(compression if compression is not None else self.config.compression)
        arrays = [np.asarray(a) for a in arrays]
        for array in arrays:
            if (array.dtype, op) not in self._reducible:
                check_reducible(array.dtype, op)
                self._reducible.add((array.dtype, op))
        layout = tuple((a.dtype, a.shape) for a in arrays)
        with self._collective(
            "allreduce",
            name,
            layout,
            op,
            comp.name,
            prescale_factor,
            postscale_factor,
            summary=lambda: f"of {layout_text(arrays)} op={op.value} compression={comp.name}",
        ):
            wire, contexts = [], []
            with self.timeline.phase("compress", compression=comp.name):
                for array in arrays:
                    scaled = _scale(array, prescale_factor) if prescale_factor != 1.0 else array
                    packed, ctx = comp.compress(scaled)
                    wire.append(packed)
                    contexts.append(ctx)
            buckets = plan_buckets(
                tuple(w.dtype for w in wire),
                tuple(int(w.size) for w in wire),
                self.config.fusion_threshold_bytes,
            )
            reduced: dict[int, np.ndarray] = {}
            for bucket in buckets:
                with self.timeline.phase("pack", bytes=bucket.nbytes, tensors=len(bucket.members)):
                    buf = pack(bucket, wire)
                if self.size > 1 and buf.size:
                    self.choose(bucket.nbytes, bucket.dtype).allreduce(buf, op.wire_op)
                reduced.update(unpack(bucket, buf, [w.shape for w in wire]))
            with self.timeline.phase("decompress"):
                out = [comp.decompress(reduced[i], contexts[i]) for i in range(len(arrays))]
                divisor = self.size if op is ReduceOp.AVERAGE else 1
                if divisor != 1 or postscale_factor != 1.0:
                    out = [_scale(x, postscale_factor, divisor) for x in out]
            return out

    def reducescatter(
        self,
        array: np.ndarray,
        *,
        op: ReduceOp | str | None = ReduceOp.AVERAGE,
        compression: Compressor | str | None = None,
        name: str | None = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> np.ndarray:
        """Reduce ``array`` and return this rank's rows of the first dimension.

        Rank ``r`` receives rows ``shard_layout(rows, size)`` (the first
        ``rows % size`` ranks get one extra row), as Horovod splits them.
        """
        op = parse_op(op)
        comp = Compression.get(compression if compression is not None else self.config.compression)
        array = np.asarray(array)
        check_reducible(array.dtype, op)
        if array.ndim == 0:
            raise DDLError("reducescatter needs a tensor with at least one dimension.")
        with self._collective(
            "reducescatter",
            name,
            str(array.dtype),
            array.shape,
            op.value,
            comp.name,
            summary=f"of {layout_text([array])} op={op.value} compression={comp.name}",
        ):
            scaled = _scale(array, prescale_factor) if prescale_factor != 1.0 else array
            wire, ctx = comp.compress(np.ascontiguousarray(scaled))
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
            out = comp.decompress(mine, ctx)
            divisor = self.size if op is ReduceOp.AVERAGE else 1
            if divisor != 1 or postscale_factor != 1.0:
                out = _scale(out, postscale_factor, divisor)
            return out

    # ------------------------------------------------------------------ movement

    def allgather(self, array: np.ndarray, *, name: str | None = None) -> np.ndarray:
        """Concatenate every rank's array along the first dimension (which may differ)."""
        array = np.asarray(array)
        with self._collective(
            "allgather",
            name,
            str(array.dtype),
            array.shape[1:],
            array.ndim,
            summary=f"of {array.dtype}[?, {', '.join(map(str, array.shape[1:]))}]",
        ):
            return movement.allgatherv(self.comms.data, array)

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
            summary=f"of {layout_text(arrays)} from rank {root_rank}",
        ):
            return movement.broadcast_arrays(self.comms.data, arrays, root_rank)

    def alltoall(
        self, array: np.ndarray, splits: Sequence[int] | None = None, *, name: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scatter row slices to every rank and gather theirs; returns (rows, received splits)."""
        array = np.asarray(array)
        with self._collective("alltoall", name, str(array.dtype), array.shape[1:], array.ndim):
            return movement.alltoallv(self.comms.data, array, splits)

    def broadcast_object(self, obj: Any, root_rank: int = 0, *, name: str | None = None) -> Any:
        """A picklable object from the root, on every rank."""
        with self._collective("broadcast_object", name, root_rank):
            return self.comms.data.bcast(obj, root=root_rank)

    def allgather_object(self, obj: Any, *, name: str | None = None) -> list[Any]:
        """Every rank's picklable object, in rank order."""
        with self._collective("allgather_object", name):
            return self.comms.data.allgather(obj)

    def barrier(self) -> None:
        """Wait until every rank arrives (with stall reporting when checks are on)."""
        with self._collective("barrier", None):
            if self.negotiator is None:
                self.comms.data.Barrier()

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Collectively stop: check every rank is shutting down, merge the timeline, free comms.

        Raises:
            CollectiveMismatchError: Another rank is still issuing collectives
                (e.g. it is in an allreduce while this rank exits).
        """
        with self._lock:
            if self._closed:
                return
            try:
                if self._failed is None:
                    with self._collective("shutdown", None):
                        pass
                    self._merge_timeline()
                    if self.negotiator is not None:
                        self.negotiator.close()
                    self.comms.free()
            finally:
                self._closed = True
                self.timeline.close()

    def set_timeline(self, path: str | None) -> None:
        """Start recording a timeline to ``path`` (None stops and merges; collective)."""
        with self._lock:
            if self.timeline.enabled:
                self._merge_timeline()
            self.config = self.config.replace(timeline=path)
            self.timeline = Timeline(path, self.rank, self._host) if path else NullTimeline()
            self._tracer.timeline = self.timeline

    def _merge_timeline(self) -> None:
        if not self.timeline.enabled:
            return
        gathered = self.comms.data.gather(self.timeline.close(), root=0)
        if self.rank == 0:
            merge_traces(self.config.timeline, gathered)
            logger.info("timeline of %d rank(s) written to %s", self.size, self.config.timeline)


def _scale(array: np.ndarray, factor: float, divisor: int = 1) -> np.ndarray:
    """``array * factor / divisor`` in the array's dtype (float32 math for 16-bit floats)."""
    acc = accumulation_dtype(array.dtype)
    if array.dtype.kind in "iu":
        if factor != 1.0 or divisor != 1:
            raise DDLError(
                f"Scaling factors apply to floating tensors only. Received dtype={array.dtype}, "
                f"factor={factor}; use prescale_factor=postscale_factor=1.0 for integers."
            )
        return array
    work = array.astype(acc, copy=True)
    if factor != 1.0:
        work *= factor
    if divisor != 1:
        work /= divisor
    return work.astype(array.dtype, copy=False)
