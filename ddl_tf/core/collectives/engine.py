"""The engine: every collective of ddl_tf on numpy arrays, checked, fused, traced.

Each collective runs the same pipeline on every rank:

1. take the engine lock (graph ops run on TensorFlow threads; one collective
   at a time keeps MPI calls serialized and in program order);
2. negotiate a descriptor (:mod:`~ddl_tf.core.collectives.negotiation`), once per call,
   so mismatches raise and stalls are reported before any data moves;
3. for allreduce: compress, fuse into buckets (:mod:`~ddl_tf.core.collectives.fusion`),
   pick the algorithm per bucket (``auto`` or forced), reduce, unpack,
   decompress, average.

Argument checks that depend only on negotiated fields (dtype, shape, op,
root) run after the negotiation, where every rank reaches the same verdict;
checks on what may legitimately differ per rank (first dimensions, alltoall
splits) run before it and travel in the descriptor as a refusal.

The engine knows nothing of TensorFlow: :mod:`ddl_tf.tensorflow.bridge` feeds it.
Example (one process, so every collective returns its input):

    >>> import numpy as np
    >>> from ddl_tf.core import basics
    >>> from ddl_tf.core.collectives.reduce_spec import ReduceSpec
    >>> engine = basics.init()
    >>> engine.allreduce([np.array([1.0, 2.0], np.float32)], ReduceSpec.of("sum"))
    [array([1., 2.], dtype=float32)]
    >>> [a.shape for a in engine.grouped_allgather([np.zeros((2, 3)), np.zeros(4)])]
    [(2, 3), (4,)]
    >>> engine.alltoall(np.arange(3), splits=[2])
    Traceback (most recent call last):
    ...
    ddl_tf.errors.CollectiveArgumentError: alltoall splits must give one non-negative row count per rank (1) summing to the first dimension (3). Received splits=[2].
    >>> basics.shutdown()
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl_tf.config import DDLConfig
from ddl_tf.core.algorithms.adasum import Adasum, HierarchicalAdasum, adasum_arrays, check_dtype
from ddl_tf.core.algorithms.allreduce import Allreduce, make_allreduce
from ddl_tf.core.algorithms.selection import AutoPolicy
from ddl_tf.core.algorithms.steps import shard_layout
from ddl_tf.core.collectives import join, movement
from ddl_tf.core.collectives.fusion import pack, plan_buckets, unpack
from ddl_tf.core.collectives.guard import CollectiveGuard, CollectiveStats, EngineState, layout_text
from ddl_tf.core.collectives.negotiation import Descriptor, Negotiator
from ddl_tf.core.collectives.reduce_spec import AVERAGE, ReduceSpec
from ddl_tf.core.numerics import mpi
from ddl_tf.core.numerics.aligned import BufferPool, aligned_empty
from ddl_tf.core.numerics.compression import Compression, Compressor
from ddl_tf.core.numerics.halfconv import cast_into
from ddl_tf.core.numerics.mpi import check_reducible, dtype_info
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.numerics.scaling import postscale_factor as combined_postscale
from ddl_tf.core.numerics.scaling import scale
from ddl_tf.core.timeline import NullTimeline, Timeline, Tracer, merge_traces
from ddl_tf.core.topology.comms import Communicators, build_communicators
from ddl_tf.core.topology.layout import Topology
from ddl_tf.errors import CollectiveArgumentError, DDLError, StallError

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_POOL_BYTES = 256 << 20

FAILED_EXIT_SECONDS = 30.0
"""How long a rank whose collectives failed waits, in its shutdown, for the other ranks to
shut down too (they are not left waiting for it; past this the job aborts at exit)."""


class Engine:
    """Collectives of one rank over its communicators.

    Allreduce, then reducescatter, allgather, broadcast, alltoall, Python
    objects, barrier and refusals, then the lifecycle. Each runs inside
    :meth:`collective` (lock, negotiation, timeline); the runtime state a
    collective may change is :attr:`state` (:class:`~ddl_tf.core.collectives.guard.EngineState`).

    Args:
        comms: Communicators from :func:`ddl_tf.core.topology.comms.build_communicators`.
        topology: This rank's topology.
        config: Job configuration.
        policy: Table behind ``auto``.
        host: Host name (timeline label).
        lock: The lock collectives run under; a process set's engine shares
            its job's, so that one thread at a time calls MPI.
        elastic: A collective that meets a failed peer (or a communicator a
            peer revoked) revokes this engine's communicators, so that every
            other rank learns of it too, and raises
            :class:`~ddl_tf.errors.HorovodInternalError`; without it the
            engine is marked failed and the job aborts, as before.
    """

    def __init__(
        self,
        comms: Communicators,
        topology: Topology,
        config: DDLConfig,
        policy: AutoPolicy,
        host: str = "",
        lock: Any = None,
        elastic: bool = False,
    ) -> None:
        self.comms = comms
        self.elastic = elastic
        self.topology = topology
        self.config = config
        self.policy = policy
        self.rank, self.size = topology.rank, topology.size
        self.state = EngineState(lock)
        # process sets this rank belongs to: process_set_id -> their engine (see subset())
        self.subsets: dict[int, Engine] = {}
        self._host = host
        self.stats = CollectiveStats()
        # result buffers, reused once TensorFlow has released the tensors made from them
        self.buffers = BufferPool(max(_POOL_BYTES, 2 * config.fusion_threshold_bytes))
        self.timeline = (
            Timeline(config.timeline, self.rank, host) if config.timeline else NullTimeline()
        )
        self.negotiator = (
            Negotiator(
                comms.control,
                config.stall_warning_seconds,
                config.stall_shutdown_seconds,
                config.stall_shutdown_setting,
            )
            if config.check_collectives
            else None
        )

        trace = self._tracer = Tracer(self.timeline)  # start/stop_timeline repoint it
        self._choices: dict[tuple[int, np.dtype], Allreduce] = {}
        self._descriptors: dict[tuple, Descriptor] = {}
        self._reducible: set[tuple[np.dtype, ReduceOp]] = set()
        self._adasum: Adasum | HierarchicalAdasum | None = None
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
        name: str = self.config.algorithm
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

    def collective(
        self, kind: str, name: str | None, *fields: Any, summary=None, error=None
    ) -> CollectiveGuard:
        """Context for one collective: lock, negotiate, trace, failure bookkeeping.

        ``fields`` (hashable) identify the collective across ranks; ``summary``
        (text, or a callable producing it) is what error messages show. Both are
        turned into a :class:`Descriptor` once per distinct collective and cached.
        ``error`` is an argument error this rank found: the collective is refused
        on every rank (see :mod:`~ddl_tf.core.collectives.guard`).
        """
        return CollectiveGuard(self, kind, name, fields, summary, error)

    def descriptor(
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

    def compressor(self, spec: ReduceSpec) -> Compressor:
        """The wire compression of ``spec``: its own, else the job's (``DDL_COMPRESSION``)."""
        if spec.compressor is not None:
            return spec.compressor
        return Compression.get(self.config.compression)

    def allreduce(
        self,
        arrays: Sequence[np.ndarray],
        spec: ReduceSpec = AVERAGE,
        *,
        name: str | None = None,
    ) -> list[np.ndarray]:
        """Reduce each array across ranks (one negotiation, fused buckets).

        Args:
            arrays: Arrays with the same dtypes and shapes, in the same order,
                on every rank.
            spec: How to reduce them (:class:`~ddl_tf.core.collectives.reduce_spec.ReduceSpec`,
                built once by the caller): the op (Average by default; Adasum on
                float16/32/64 only, see :meth:`adasum`), the wire compression
                (None: the configured default) and the scale factors (pre:
                inputs before reducing; post: results after reducing and averaging).
                Its ``wrapper`` is the framework layer's and is not read here.
            name: Optional name (compared across ranks).

        Returns:
            New arrays with the reduced values, same dtypes and shapes.

        Raises:
            UnsupportedError: Adasum on a number of ranks (nodes, in the
                hierarchical form) that is not a power of two, on every rank.
        """
        op = spec.op
        if op is ReduceOp.ADASUM:
            self.adasum()  # the layout is the same everywhere: every rank refuses alike
        comp = self.compressor(spec)
        prescale_factor, postscale_factor = spec.prescale_factor, spec.postscale_factor
        arrays = [np.asarray(a) for a in arrays]
        layout = tuple((a.dtype, a.shape) for a in arrays)
        with self.collective(
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
                    (check_dtype if op is ReduceOp.ADASUM else check_reducible)(array.dtype, op)
                    self._reducible.add((array.dtype, op))
            if prescale_factor != 1.0:  # in the tensor's own dtype, before any compression
                arrays = [scale(a, prescale_factor) for a in arrays]
            if op is ReduceOp.ADASUM:
                return adasum_arrays(self.adasum(), arrays, comp, postscale_factor, self.timeline)
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

    def adasum(self) -> Adasum | HierarchicalAdasum:
        """This engine's Adasum: across nodes after a per-node average when the allreduce is
        hierarchical (``DDL_ALLREDUCE_ALGO=hierarchical`` or ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``)
        on several uniform nodes of several ranks, else over all ranks.

        Raises:
            UnsupportedError: The tree's width (ranks or nodes) is not a power of two.
        """
        if self._adasum is None:
            topo, comms = self.topology, self.comms
            across_nodes = topo.is_uniform and topo.num_nodes > 1 and topo.local_size > 1
            if self.config.algorithm == "hierarchical" and across_nodes:
                self._adasum = HierarchicalAdasum(comms.node, comms.cross)
            else:
                self._adasum = Adasum(comms.data)
        self._adasum.check()
        return self._adasum

    # ------------------------------------------------------------------ reducescatter

    def reducescatter(
        self, array: np.ndarray, spec: ReduceSpec = AVERAGE, *, name: str | None = None
    ) -> np.ndarray:
        """One array's :meth:`grouped_reducescatter`.

        Args:
            array: The array to reduce; at least one dimension.
            spec: How to reduce it, as for :meth:`grouped_reducescatter`.
            name: Optional name of the call (compared across ranks).

        Returns:
            This rank's rows of the reduced array.
        """
        return self.grouped_reducescatter([array], spec, name=name)[0]

    def grouped_reducescatter(
        self,
        arrays: Sequence[np.ndarray],
        spec: ReduceSpec = AVERAGE,
        *,
        name: str | None = None,
    ) -> list[np.ndarray]:
        """Reduce each array and return this rank's rows of its first dimension.

        Rank ``r`` receives rows ``shard_layout(rows, size)`` (the first
        ``rows % size`` ranks get one extra row), as Horovod splits them.

        Args:
            arrays: The arrays to reduce; same shapes and dtypes on every rank,
                each with at least one dimension.
            spec: How to reduce them (:class:`~ddl_tf.core.collectives.reduce_spec.ReduceSpec`):
                the op (Average by default), the wire compression (None: the
                engine config's), ``prescale_factor`` (multiplies each input
                before the reduction) and ``postscale_factor`` (multiplies each
                result after it; Average also divides by the number of ranks).
            name: Optional name of the call; it must match across ranks and appears
                in the timeline and in mismatch errors.

        Returns:
            One array per input: this rank's rows of the reduced result.

        Raises:
            CollectiveArgumentError: A scalar (on every rank: shapes are negotiated).
            ConfigError: The op is not defined for the dtype.
        """
        op = spec.op
        comp = self.compressor(spec)
        prescale_factor, postscale_factor = spec.prescale_factor, spec.postscale_factor
        arrays = [np.asarray(a) for a in arrays]
        layout = tuple((str(a.dtype), a.shape) for a in arrays)
        with self.collective(
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
        with self.collective(
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
        with self.collective(
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
        with self.collective(
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
        with self.collective("broadcast_object", name, root_rank):
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
        with self.collective("allgather_object", name):
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
        with self.collective("barrier", name):
            if self.negotiator is None:
                self.comms.data.Barrier()

    def join(self) -> int:
        """Horovod's ``join()``: allreduce zeros for the others until every rank has joined.

        Returns:
            The last rank to join (see :mod:`~ddl_tf.core.collectives.join`).
        """
        return join.join(self)

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
                :data:`~ddl_tf.core.collectives.negotiation.REFUSALS`).
        """
        with self.collective(kind, name, error=error):
            pass
        raise error  # pragma: no cover - the guard raises before the body runs

    # ------------------------------------------------------------------ process sets

    def subset(self, ranks: tuple[int, ...], set_id: int) -> Engine | None:
        """Collectively make the engine of process set ``set_id`` (every rank of the job calls it).

        The ranks agree on the set first (a mismatch raises on every rank);
        then the data communicator is split, and the members build an engine
        over their part: its own communicators, its topology (the job's nodes,
        restricted to the set), no timeline of its own, this engine's lock.

        Args:
            ranks: The set's ranks in this job, sorted.
            set_id: Its ``process_set_id``; the members' engine is kept in
                :attr:`subsets` under it.

        Returns:
            The set's engine on its members, None elsewhere.
        """
        MPI = mpi.load()
        member = self.rank in ranks
        with self.collective("add_process_set", None, ranks, set_id):
            comm = self.comms.data.Split(0 if member else MPI.UNDEFINED, key=self.rank)
        if not member:
            return None
        names = [self.topology.node_names[r] for r in ranks]
        topology = Topology.from_node_names(names, comm.rank, source=self.topology.source)
        try:
            comms = build_communicators(comm, topology)
        finally:
            comm.Free()
        config = self.config.replace(timeline=None, topology_file=None)
        sub = Engine(
            comms, topology, config, self.policy, self._host, self.state.lock, self.elastic
        )
        self.subsets[set_id] = sub
        return sub

    def drop_subset(self, set_id: int) -> None:
        """Collectively remove process set ``set_id`` (every rank of the job calls it)."""
        with self.collective("remove_process_set", None, set_id):
            pass
        sub = self.subsets.pop(set_id, None)
        if sub is not None:
            sub.shutdown()

    # ------------------------------------------------------------------ lifecycle

    def revoke(self) -> None:
        """Revoke every communicator of this engine and its process sets; refuse collectives after.

        Local and immediate (ULFM's ``MPI_Comm_revoke``): any rank blocked in
        one of these communicators returns with ``MPI_ERR_REVOKED``, which
        is how one rank's discovery of a failed peer reaches the ranks that
        are waiting on healthy ones. Nothing is freed: the ranks are out of
        step, and a freed communicator would need them all.
        """
        MPI = mpi.load()
        for sub in self.subsets.values():
            sub.revoke()
        for comm in self.comms.all():
            try:
                comm.Revoke()
            except MPI.Exception:  # a peer revoked it first
                pass
        if self.negotiator is not None and not self.state.lost:
            self.negotiator.abandon()
        self.state.mark_lost()

    def shutdown(self) -> None:
        """Collectively stop: check every rank is shutting down, merge the timeline, free comms.

        After a failure on this rank the shutdown still takes part, so that
        the other ranks are not left waiting for it (at exit, then in
        ``MPI_Finalize``): it presents the same ``shutdown`` descriptor, but
        waits for the others at most :data:`FAILED_EXIT_SECONDS`.

        Raises:
            CollectiveMismatchError: Another rank is still issuing collectives
                (e.g. it is in an allreduce while this rank exits).
            StallError: After a failure: the other ranks did not all shut down
                within :data:`FAILED_EXIT_SECONDS` (at exit the job then aborts).
        """
        with self.state.lock:
            if self.state.closed:
                return
            try:
                for set_id in sorted(self.subsets):  # same order on every member
                    self.subsets.pop(set_id).shutdown()
                if self.state.failure is None:
                    with self.collective("shutdown", None):
                        pass
                elif not self._shutdown_after_failure():
                    return
                self._merge_timeline()
                if self.negotiator is not None:
                    self.negotiator.close()
                self.comms.free()
            finally:
                self.state.close()
                self.timeline.close()

    def set_timeline(self, path: str | None) -> None:
        """Start recording a timeline to ``path`` (None stops and merges; collective).

        Args:
            path: File to write the Chrome-trace timeline to, or None to stop
                recording (any running timeline is merged and closed first).
        """
        with self.state.lock:
            if self.timeline.enabled:
                self._merge_timeline()
            self.config = self.config.replace(timeline=path)
            self.timeline = Timeline(path, self.rank, self._host) if path else NullTimeline()
            self._tracer.timeline = self.timeline

    def _shutdown_after_failure(self) -> bool:
        """The ``shutdown`` negotiation of a failed engine, bounded; whether the others agreed.

        Without collective checks there is nothing to agree on (False: leave
        the communicators alone, as the ranks may be out of step).
        """
        if self.negotiator is None or self.size == 1:
            return self.size == 1
        descriptor = self.descriptor("shutdown", None, (), None)
        try:
            self.negotiator.negotiate(descriptor, limit=FAILED_EXIT_SECONDS)
        except DDLError:
            raise
        except Exception as err:  # e.g. a request left active by the failure
            raise StallError(
                f"rank {self.rank} could not shut down after its failure "
                f"({self.state.failure!r}): {err!r}"
            ) from err
        return True

    def _merge_timeline(self) -> None:
        if not self.timeline.enabled:
            return
        gathered = self.comms.data.gather(self.timeline.close(), root=0)
        if self.rank == 0:
            assert self.config.timeline is not None  # an enabled timeline has a path
            merge_traces(self.config.timeline, gathered)
            logger.info("timeline of %d rank(s) written to %s", self.size, self.config.timeline)
