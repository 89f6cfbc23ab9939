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
from ddl_tf.core.algorithms import Allreduce, make_allreduce
from ddl_tf.core.aligned import BufferPool
from ddl_tf.core.comms import Communicators
from ddl_tf.core.compression import Compression, Compressor
from ddl_tf.core.fusion import pack, plan_buckets, unpack
from ddl_tf.core.guard import CollectiveGuard, CollectiveStats, layout_text
from ddl_tf.core.halfconv import cast_into
from ddl_tf.core.mpi import check_reducible, dtype_info
from ddl_tf.core.negotiation import Descriptor, Negotiator
from ddl_tf.core.reduce_ops import ReduceOp, parse_op
from ddl_tf.core.scaling import postscale_factor as combined_postscale
from ddl_tf.core.scaling import scale
from ddl_tf.core.scatter_gather import ScatterGather
from ddl_tf.core.selection import AutoPolicy
from ddl_tf.core.timeline import NullTimeline, Timeline, Tracer, merge_traces
from ddl_tf.core.topology import Topology

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_POOL_BYTES = 256 << 20


class Engine(ScatterGather):
    """Collectives of one rank over its communicators.

    Allreduce and the lifecycle live here; reducescatter, allgather, broadcast,
    alltoall, objects and refusals in :class:`~ddl_tf.core.scatter_gather.ScatterGather`.

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
        # result buffers, reused once TensorFlow has released the tensors made from them
        self.buffers = BufferPool(max(_POOL_BYTES, 2 * config.fusion_threshold_bytes))
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
        """The allreduce for a fused buffer of ``nbytes`` bytes of ``dtype``.

        Args:
            nbytes: Size of the fused buffer in bytes.
            dtype: Its element dtype (custom MPI reductions rule out some
                algorithms).

        Returns:
            The configured algorithm, or with ``algorithm="auto"`` the one the
            selection policy picks for the size and topology (memoized).
        """
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
        self, kind: str, name: str | None, *fields: Any, summary=None, error=None
    ) -> CollectiveGuard:
        """Context for one collective: lock, negotiate, trace, failure bookkeeping.

        ``fields`` (hashable) identify the collective across ranks; ``summary``
        (text, or a callable producing it) is what error messages show. Both are
        turned into a :class:`Descriptor` once per distinct collective and cached.
        ``error`` is an argument error this rank found: the collective is refused
        on every rank (see :mod:`~ddl_tf.core.guard`).
        """
        return CollectiveGuard(self, kind, name, fields, summary, error)

    def _descriptor(
        self, kind: str, name: str | None, fields: tuple, summary, error=None
    ) -> Descriptor:
        if error is not None:
            return Descriptor.refusal(kind, name, error)
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
            for array in arrays:  # dtypes and op are negotiated: every rank reaches one verdict
                if (array.dtype, op) not in self._reducible:
                    check_reducible(array.dtype, op)
                    self._reducible.add((array.dtype, op))
            if prescale_factor != 1.0:  # in the tensor's own dtype, before any compression
                arrays = [scale(a, prescale_factor) for a in arrays]
            with self.timeline.phase("compress", compression=comp.name):
                if comp.casts_only:  # the cast happens while packing: no extra copy
                    sources, contexts = arrays, None
                    wire = tuple(comp.wire_dtype(a.dtype) for a in arrays)
                else:
                    pairs = [comp.compress(a) for a in arrays]
                    sources, contexts = [p[0] for p in pairs], [p[1] for p in pairs]
                    wire = tuple(w.dtype for w in sources)
            buckets = plan_buckets(
                wire, tuple(int(a.size) for a in sources), self.config.fusion_threshold_bytes
            )
            factor = combined_postscale(postscale_factor, op is ReduceOp.AVERAGE, self.size)
            shapes = [a.shape for a in arrays]
            out: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
            for bucket in buckets:
                alone = sources[bucket.members[0]] if len(bucket.members) == 1 else None
                if self.size > 1 and alone is not None and alone.dtype == bucket.dtype:
                    # one tensor: reduced from where it is into a pooled buffer, no copy in
                    buf = self.buffers.take(bucket.elements, bucket.dtype)
                    self.choose(bucket.nbytes, bucket.dtype).allreduce_from(
                        np.ascontiguousarray(alone).reshape(-1), buf, op.wire_op
                    )
                else:
                    with self.timeline.phase(
                        "pack", bytes=bucket.nbytes, tensors=len(bucket.members)
                    ):
                        buf = pack(
                            bucket, sources, self.buffers.take(bucket.elements, bucket.dtype)
                        )
                    if self.size > 1 and buf.size:
                        self.choose(bucket.nbytes, bucket.dtype).allreduce(buf, op.wire_op)
                with self.timeline.phase("decompress"):
                    views = unpack(bucket, buf, shapes)
                    if contexts is None and all(arrays[i].dtype == bucket.dtype for i in views):
                        scale(buf, factor, out=buf)  # the buffer is ours: one pass, in place
                        for i, view in views.items():
                            out[i] = view
                        continue
                    for i, view in views.items():
                        if contexts is not None:
                            out[i] = scale(comp.decompress(view, contexts[i]), factor)
                            continue
                        restored = self.buffers.take(view.shape, arrays[i].dtype)
                        cast_into(view, restored)  # the casting compressor's way back
                        out[i] = scale(restored, factor, out=restored)
            return out

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
        """Start recording a timeline to ``path`` (None stops and merges; collective).

        Args:
            path: File to write the Chrome-trace timeline to, or None to stop
                recording (any running timeline is merged and closed first).
        """
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
