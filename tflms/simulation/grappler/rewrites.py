"""Whether a plan changes what Grappler does to a step: the arithmetic TensorFlow runs.

This is how tflms keeps a step's arithmetic bit for bit
(``LMSConfig.check_rewrites``): the pipeline runs Grappler offline on the
traced step with and without its plan (:class:`RewriteGuard`), pins every op
the two optimized graphs treat differently (:func:`pins`,
:data:`tflms.graph.grappler_rules.PINNED`: no plan moves, reroutes, triggers
on, recomputes or orders a pinned op) and plans again, until they agree. The planner's
rules (:mod:`tflms.graph.grappler_rules`) avoid the rewrites known so far;
the check catches the next one without a rule for it.

TensorFlow hands every graph to Grappler before running it, and several of
Grappler's rewrites apply only to a tensor with a single consumer: the
arithmetic optimizer's stages (adds folded into an ``AddN`` tree, broadcasts
minimized, common factors hoisted, ...) and the remapper's fusions
(``MatMul + BiasAdd + Relu`` into one ``_FusedMatMul``, ...). A swap-out adds
a consumer and a recompute clone moves some, so a plan can stop a rewrite:
the step then runs other arithmetic (other float rounding, and on a GPU an
unfused intermediate that costs memory and time).

:func:`grappler_structure` runs Grappler's default pipeline offline on a
virtual device of the step's type (as :func:`grappler_optimize` does) and
reduces the result to what decides the arithmetic: for every op Grappler keeps
or creates, its type, its non-internal attributes, its data inputs and its
device type. tflms' own ops are read through (a swap-in stands for the tensor
it carries, a recompute clone for the op it re-runs), and constants are named
by their value (Grappler keeps one of several equal constants under whichever
name sorts first, which moves with the other names of the graph). Control
inputs are left out: they order ops, they compute nothing.
:func:`compare_rewrites` lists the ops whose structure differs with the plan.

The check sizes the compute device as TensorFlow declares it to Grappler (a
CPU 256 MiB, a GPU the target's memory), since one rewrite keys on the size:
the memory optimizer turns a sum of 3+ inputs into an accumulation in the
order its inputs arrive once the static peak passes 80% of it
(:data:`~tflms.simulation.grappler.devices.CPU_DEVICE_BYTES`) and one of
its inputs is live at that peak. Where that peak falls follows the step's
control edges, so the step the check optimizes carries those TensorFlow's
automatic control dependencies add when a traced step's tracing ends
(:mod:`~tflms.simulation.grappler.state_order`): without them the check
rewrote no sum of ``benchmarks/bench_remat.py``'s MLP under the cheap-op
plan, whose update waits made the real run rewrite one (and train to a
different result). The schedule's op times come from the device's
properties, so a CPU step's device is this machine's CPU as TensorFlow
describes it (:func:`~tflms.simulation.grappler.devices.local_cpu`).

What it cannot see: rewrites of a device kind this TensorFlow build lacks (a
CPU-only build applies no GPU-only fusion, so a GPU step's fusions are checked
only where ``tensorflow[and-cuda]`` is installed), run-time choices inside
kernels (which buffer an ``AddN`` reuses: see
:data:`tflms.plan.candidates.ORDER_SENSITIVE`), and the order an
accumulation runs in.

Example:
    >>> import tensorflow as tf
    >>> @tf.function
    ... def step(x):
    ...     y = x + 1.0
    ...     return tf.reduce_sum((y + x) + 2.0)
    >>> graph = step.get_concrete_function(tf.TensorSpec([8, 8])).graph
    >>> same = compare_rewrites(graph.as_graph_def(), graph.as_graph_def(), device="/device:CPU:0")
    >>> same.agree, same.differences
    (True, ())
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tflms.apply.core import apply_with
from tflms.apply.proto_editor import ProtoEditor
from tflms.graph.view import SWAP_ATTR
from tflms.plan.entries import SCOPE
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.grappler.devices import (
    CPU_DEVICE_BYTES,
    VIRTUAL_GPU,
    VIRTUAL_GPU_BYTES,
    local_cpu,
)
from tflms.simulation.grappler.metagraph import graph_def_with_handles
from tflms.simulation.grappler.optimize import grappler_optimize
from tflms.simulation.grappler.state_order import automatic_control_edges, with_control_edges
from tflms.utils.devices import parse_device

__all__ = [
    "Difference",
    "RewriteCheck",
    "RewriteGuard",
    "check_device",
    "compare_rewrites",
    "grappler_structure",
    "pins",
    "step_fetches",
    "structure_of",
]

_RECOMPUTE_SUFFIX = f"-{SCOPE}/recompute"
_COMMUTATIVE = frozenset(
    {
        "Add",
        "AddV2",
        "Mul",
        "Maximum",
        "Minimum",
        "SquaredDifference",
        "LogicalAnd",
        "LogicalOr",
        "Equal",
        "NotEqual",
    }
)
"""Two-input ops whose result does not depend on the order of their inputs, bit for bit
(Grappler orders them by input name, and a constant's name can move). ``SquaredDifference``
is one: IEEE subtraction rounds ``b - a`` to exactly ``-(a - b)``, and the square drops the
sign (a LayerNorm's variance reads its mean and its input in either order)."""

_FUNCTIONAL_CONTROL_FLOW = frozenset(
    {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}
)
_LOWER = "_lower_using_switch_merge"
_READ_THROUGH = frozenset({"out", "in", "gate", "hold"})
"""tflms ops the comparison reads through: swaps and gates pass their input on (a hold
passes it to no one, but is a reader all the same: :attr:`Structure.readers`)."""


@dataclass
class Structure:
    """A step as Grappler optimized it, reduced to what decides its arithmetic.

    Attributes:
        ops: op name -> ``(type, attributes, data inputs, device type)``;
            inputs are named as in the original graph (through swap ops and
            clones), constants by their value.
        values: op name -> its value number: a digest of its type, attributes
            and its inputs' value numbers (sources by name). Two ops compute
            the same arithmetic exactly when their numbers are equal, whatever
            their names, device or duplicates Grappler merged: a faithful
            recompute clone has its original's number.
        reads: op name -> ``(op, port)`` of each data input, through swap ops.
        preds: node name -> the nodes it waits for (data and control inputs,
            swap ops included): what orders the step.
        readers: node name -> how many data inputs read it (swap ops included).
        raw: node name -> the nodes its data inputs come from, as written.
    """

    ops: dict[str, tuple] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)
    reads: dict[str, tuple] = field(default_factory=dict)
    preds: dict[str, set] = field(default_factory=dict)
    readers: dict[str, int] = field(default_factory=dict)
    raw: dict[str, tuple] = field(default_factory=dict)

    def ancestors(self, name: str, memo: dict) -> set[str]:
        """Every node ``name`` waits for, directly or not (memoized in ``memo``)."""
        if name not in memo:
            seen: set[str] = set()
            stack = list(self.preds.get(name, ()))
            while stack:
                node = stack.pop()
                if node not in seen:
                    seen.add(node)
                    stack.extend(self.preds.get(node, ()))
            memo[name] = seen
        return memo[name]


@dataclass(frozen=True)
class Difference:
    """One op Grappler treats differently with the plan.

    Attributes:
        op: the op's name (in the original graph, or as Grappler made it).
        before: its structure without the plan (``None``: Grappler did not keep it).
        after: its structure with the plan (``None``: Grappler did not keep it).
        lost: the step without the plan computes this op and the step with it
            does not (it was fused or folded, and now is not); False: the step
            with the plan computes it differently, or only that step does.
    """

    op: str
    before: tuple | None
    after: tuple | None
    lost: bool = False

    def mentions(self) -> set[str]:
        """The op and every op it reads, on either side: where the cause lies."""
        names = {self.op}
        for side in (self.before, self.after):
            if side is not None:
                names.update(name.split(":")[0] for name in side[2] if not name.startswith("="))
        return names

    def describe(self) -> str:
        """``op: Type(inputs) -> Type(inputs)`` on one line."""

        def show(side):
            if side is None:
                return "(not kept)"
            return f"{side[0]}({', '.join(side[2])})"

        return f"{self.op}: {show(self.before)} -> {show(self.after)}"


@dataclass(frozen=True)
class RewriteCheck:
    """What :func:`compare_rewrites` found.

    Attributes:
        differences: the first ops whose arithmetic differs, by name.
        ops: how many ops Grappler kept without the plan.
        new: the ops (by their original names) only the step with the plan
            has: Grappler kept none of that name without it.
        ordered: the first ops of the plan's order edges that order an
            ``AddN`` of 3+ inputs (as Grappler made it) against another reader
            of one of its inputs, which the step without the plan leaves
            unordered: which input buffer the sum reuses, hence its float
            summation order, would then follow the plan
            (:data:`tflms.plan.candidates.ORDER_SENSITIVE`).
        summed: inputs of such a sum that the plan reroutes or gives other
            readers (:func:`_summed`), for the same reason.
    """

    differences: tuple[Difference, ...]
    ops: int
    new: tuple[str, ...] = ()
    ordered: tuple[str, ...] = ()
    summed: tuple[str, ...] = ()

    @property
    def agree(self) -> bool:
        """Grappler rewrites the step the same way with and without the plan, and the plan
        orders no sum's readers that the step leaves unordered."""
        return not self.differences and not self.ordered and not self.summed

    def summary(self, limit: int = 5) -> str:
        """One line per difference (at most ``limit``)."""
        if self.agree:
            return f"Grappler's rewrites agree with and without the plan ({self.ops} ops)"
        lines = [d.describe() for d in self.differences[:limit]]
        if self.summed:
            lines.append(
                f"the plan changes how many ops read {', '.join(self.summed[:limit])}, inputs of "
                "a sum of 3+ inputs (which buffer it reuses decides its summation order)"
            )
        if self.ordered:
            lines.append(
                f"order edges from {', '.join(self.ordered[:limit])} order the readers of a "
                "sum of 3+ inputs (its summation order follows which buffer it reuses)"
            )
        more = len(self.differences) - limit
        if more > 0:
            lines.append(f"... and {more} more")
        return (
            f"Grappler rewrites {len(self.differences)} op(s) differently with the plan:\n  "
            + "\n  ".join(lines)
        )


def grappler_structure(
    graph_def: graph_pb2.GraphDef,
    *,
    fetches: Sequence[str] | None = None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
    memory_bytes: int | None = None,
) -> Structure:
    """Grappler's optimized form of ``graph_def``, reduced to what decides the arithmetic.

    Args:
        graph_def: a step's graph, with or without tflms' ops.
        fetches: the nodes the step runs to (default: as :func:`grappler_optimize`).
        device: the compute device; its type (GPU or CPU) selects Grappler's
            device-specific rewrites.
        host_device: the host; ops placed there stay there.
        batch_size: replaces an unknown leading placeholder dimension (shapes
            decide some rewrites).
        memory_bytes: the size of a GPU ``device`` as TensorFlow declares it
            (default :data:`~tflms.simulation.grappler.devices.VIRTUAL_GPU_BYTES`);
            a CPU is always of
            :data:`~tflms.simulation.grappler.devices.CPU_DEVICE_BYTES`, as at run
            time. The memory optimizer's rewrite of sums keys on it. A CPU
            also has this machine's cores, frequency and caches
            (:func:`~tflms.simulation.grappler.devices.local_cpu`), as TensorFlow
            describes it: they set the static schedule that rewrite reads.

    Functional control flow (``While``, ``If``, ``Case``) is kept as one op,
    not lowered into frames: tflms leaves loop bodies alone, and the nodes of
    a lowered loop are numbered by a graph-wide counter.

    Returns:
        ``{op name: (type, attributes, data inputs, device type)}`` for every
        op Grappler keeps that is neither a constant nor a swap op (a recompute
        clone is kept under its own name: the comparison holds it to its original).
    """
    unlowered = graph_pb2.GraphDef()
    unlowered.CopyFrom(graph_def)
    for node in unlowered.node:
        if node.op in _FUNCTIONAL_CONTROL_FLOW:
            node.attr[_LOWER].b = False
    _inputs_as_at_run_time(unlowered)
    on_cpu = (tf.DeviceSpec.from_string(device).device_type or "").upper() == "CPU"
    optimized = grappler_optimize(
        unlowered,
        fetches=fetches,
        device=device,
        host_device=host_device,
        gpu_memory_bytes=CPU_DEVICE_BYTES if on_cpu else memory_bytes or VIRTUAL_GPU_BYTES,
        batch_size=batch_size,
        device_properties=local_cpu() if on_cpu else None,
    )
    return structure_of(optimized)


def _inputs_as_at_run_time(graph_def: graph_pb2.GraphDef) -> None:
    """Give the step's inputs their traced shapes in Grappler's eyes, as its real run does.

    Offline, Grappler feeds every ``Placeholder`` and, not trusting a feed,
    takes its shape as unknown: no activation's shape is known, and the
    rewrites that need two shapes to agree (``AddOpsRewrite`` making one
    ``AddN`` of a sum of three tensors, the folding of a gradient's
    ``BroadcastGradientArgs``) never happen. In the real run the inputs come
    from ``_Arg`` or ``IteratorGetNext`` ops of known (possibly symbolic)
    shape, and those rewrites do happen - to the originals, and not always to
    recompute clones (their symbolic batch dimension can come out as a new
    one). A ``PlaceholderWithDefault`` of the traced shape is no feed, so the
    check sees the shapes the run sees: static where the step was traced
    with a fixed batch, symbolic where it was not (``model.fit``). Its
    default is a zero ``Const`` stored as one value; nothing runs it.
    """
    for node in list(graph_def.node):
        if node.op != "Placeholder":
            continue
        dtype, shape = tf.as_dtype(node.attr["dtype"].type), node.attr["shape"].shape
        if dtype in (tf.resource, tf.variant) or shape.unknown_rank:
            continue
        default = graph_def.node.add(name=f"{node.name}/{SCOPE}-default", op="Const")
        default.device = node.device
        default.attr["dtype"].type = dtype.as_datatype_enum
        zero = b"" if dtype == tf.string else np.zeros((), dtype.as_numpy_dtype)
        dims = [max(dim.size, 1) for dim in shape.dim]
        proto = tf.make_tensor_proto(zero, dtype=dtype, shape=dims)
        default.attr["value"].tensor.CopyFrom(proto)
        node.op = "PlaceholderWithDefault"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(shape)
        node.input[:] = [default.name]


def structure_of(optimized: graph_pb2.GraphDef) -> Structure:
    """What decides the arithmetic of an already optimized graph (see :func:`grappler_structure`).

    Args:
        optimized: a graph as Grappler left it (e.g. one TensorFlow dumped with
            ``TF_DUMP_GRAPH_PREFIX`` before partitioning it).

    Returns:
        As :func:`grappler_structure`.
    """
    nodes = {node.name: node for node in optimized.node}
    constants = {
        name: "=" + _digest(node.attr["dtype"].SerializeToString(), _value(node))
        for name, node in nodes.items()
        if node.op in ("Const", "HostConst")
    }

    def through(ref: str) -> tuple[str, str]:
        name, _, port = ref.partition(":")
        seen = 0
        while name in nodes and _kind(nodes[name]) in _READ_THROUGH and seen < 8:
            name, _, port = nodes[name].input[0].partition(":")
            seen += 1
        return name, "" if port in ("", "0") else port

    def shown(ref: str) -> str:
        name, port = through(ref)
        name = constants.get(name) or _original(name)
        return f"{name}:{port}" if port else name

    structure = Structure()
    for name, node in nodes.items():
        structure.preds[name] = {ref.lstrip("^").split(":")[0] for ref in node.input}
        structure.raw[name] = tuple(r.split(":")[0] for r in node.input if not r.startswith("^"))
        for source in structure.raw[name]:
            structure.readers[source] = structure.readers.get(source, 0) + 1
        if name in constants or _kind(node) in _READ_THROUGH:
            continue
        attrs = tuple(
            sorted(
                (key, _digest(value.SerializeToString()))
                for key, value in node.attr.items()
                if not key.startswith("_")
            )
        )
        data = [ref for ref in node.input if not ref.startswith("^")]
        inputs = tuple(shown(ref) for ref in data)
        if node.op in _COMMUTATIVE and len(inputs) == 2:
            inputs = tuple(sorted(inputs))  # exact in IEEE arithmetic: a + b == b + a
        device_type = node.device.rsplit("/", 1)[-1].split(":")[0].replace("device", "") or ""
        structure.ops[name] = (node.op, attrs, inputs, device_type.upper())
        structure.reads[name] = tuple(through(ref) for ref in data)

    def number(name: str, port: str) -> str:
        if name in constants:
            return constants[name]
        return f"{structure.values[name]}:{port}" if port else structure.values[name]

    # value numbers, inputs first; iterative (a step's longest path exceeds Python's
    # recursion limit); a node is numbered by name when first reached, which cuts
    # the cycles of TF1 loops and is replaced once its inputs are numbered
    for root in structure.ops:
        stack = [(root, False)]
        while stack:
            name, inputs_done = stack.pop()
            reads = structure.reads.get(name, ())
            if inputs_done:
                if reads:
                    op, attrs, *_ = structure.ops[name]
                    read = [number(*ref) for ref in reads]
                    if op in _COMMUTATIVE and len(read) == 2:
                        read.sort()
                    structure.values[name] = _digest(repr((op, attrs, read)).encode())
                continue
            if name in structure.values or name in constants:
                continue
            structure.values[name] = f"@{name}"  # a source keeps it
            stack.append((name, True))
            stack.extend((src, False) for src, _ in reads)
    return structure


def _step_graph_def(graph: graph_pb2.GraphDef | tf.Graph) -> graph_pb2.GraphDef:
    """A step's GraphDef as the check needs it: a ``tf.Graph``'s variables keep their shapes
    (:func:`~tflms.simulation.grappler.metagraph.graph_def_with_handles`; shapes decide some
    of Grappler's rewrites), and a step still being traced gets the control edges its
    tracing will add (:mod:`~tflms.simulation.grappler.state_order`: Grappler's static
    schedule, which some rewrites key on, follows them); a GraphDef is taken as it is."""
    if not isinstance(graph, tf.Graph):
        return graph
    return with_control_edges(graph_def_with_handles(graph), automatic_control_edges(graph))


def compare_rewrites(
    original: graph_pb2.GraphDef | tf.Graph,
    rewritten: graph_pb2.GraphDef | tf.Graph,
    *,
    fetches: Sequence[str] | None = None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
    before: Structure | None = None,
) -> RewriteCheck:
    """Whether Grappler rewrites ``rewritten`` (``original`` + a plan) as it rewrites ``original``.

    Args:
        original: the step's graph without the plan: a ``tf.Graph`` (its
            variables' shapes kept) or a GraphDef (as it is).
        rewritten: the same graph with the plan applied (same names), either form.
        fetches, device, host_device, batch_size: as for :func:`grappler_structure`.
        before: ``grappler_structure(original, ...)`` when already computed
            (the original is then not optimized again).

    Returns:
        A :class:`RewriteCheck`; :attr:`RewriteCheck.agree` is the verdict.
    """

    def structure(graph):
        return grappler_structure(
            _step_graph_def(graph),
            fetches=fetches,
            device=device,
            host_device=host_device,
            batch_size=batch_size,
        )

    if before is None:
        before = structure(original)
    return _compare(before, structure(rewritten))


_RESOURCE_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})


def step_fetches(graph: tf.Graph, outputs=None) -> list[str] | None:
    """The ops a traced step runs to, as TensorFlow will prune it: what Grappler keeps.

    A ``tf.function`` runs its outputs and its control outputs, which
    TensorFlow's automatic control dependencies make of every stateful op
    (variable updates, random ops), resource reads only when something reads
    them. Everything else is pruned before Grappler sees the step, dead
    branches of the gradient included (the gradient with respect to a constant
    divisor), so the check must prune them too.

    Args:
        graph: the step's graph (a ``FuncGraph`` still being traced is fine).
        outputs: what the step's Python function returned (any nest; tensors
            and ops in it count), or the names of the nodes it returns (a
            SavedModel's function: its ``ret`` and ``control_ret``). None: a
            traced ``FuncGraph``'s own outputs and control outputs.

    Returns:
        Op names, each once, outputs first; None when neither ``outputs`` nor
        the graph says (a ``tf.compat.v1`` graph: Grappler keeps its sinks).
    """
    if outputs is None:
        outputs = [*getattr(graph, "outputs", ()), *getattr(graph, "control_outputs", ())]
        if not outputs:
            return None
    names = []
    for item in tf.nest.flatten(outputs, expand_composites=True):
        if isinstance(item, str):
            names.append(item.lstrip("^").split(":")[0])
        elif isinstance(item, (tf.Tensor, tf.Operation)) and item.graph is graph:
            names.append(item.name if isinstance(item, tf.Operation) else item.op.name)
    for op in graph.get_operations():
        if op.op_def is not None and op.op_def.is_stateful:
            if op.type not in _RESOURCE_READS or any(t.consumers() for t in op.outputs):
                names.append(op.name)
    return list(dict.fromkeys(names))


def check_device(view: nx.DiGraph) -> str:
    """The device the check runs the step's compute ops on: its type picks Grappler's rewrites.

    ``LMSConfig.device`` when set, else the device most of the view's compute
    ops name, else a virtual GPU (or ``/device:CPU:0`` on a machine without
    one, where TensorFlow runs the step on the CPU).
    """
    if view.graph.get("compute_device"):
        return _local(view.graph["compute_device"])
    named = Counter(
        _local(data["device"])
        for _, data in view.nodes(data=True)
        if data.get("placement") == "compute" and data.get("device")
    )
    if named:
        return named.most_common(1)[0][0]
    return VIRTUAL_GPU if view.graph.get("default_device_type", "GPU") == "GPU" else "/device:CPU:0"


def _local(device: str) -> str:
    spec = parse_device(device)
    return f"/device:{(spec.type or 'CPU').upper()}:{spec.index or 0}"


class RewriteGuard:
    """Grappler's verdict on plans for one step: :meth:`check` a plan, :func:`pins` from the answer.

    The step's own optimized structure is computed once, at the first check.

    Args:
        graph: the step's graph without tflms' ops: a ``tf.Graph`` (its variables'
            shapes kept) or a GraphDef (only copied).
        fetches: the ops the step runs to (:func:`step_fetches`); ``None``:
            the graph's sinks.
        device: the compute device (:func:`check_device`).
        host_device: the host device.
        batch_size: the batch that sizes open leading dimensions (shapes
            decide some rewrites).
        memory_bytes: the size of a GPU ``device`` (see :func:`grappler_structure`).
    """

    def __init__(
        self,
        graph: graph_pb2.GraphDef | tf.Graph,
        *,
        fetches: Sequence[str] | None,
        device: str,
        host_device: str,
        batch_size: int | None,
        memory_bytes: int | None = None,
    ):
        self.graph_def = _step_graph_def(graph)
        self.fetches, self.device, self.host_device = fetches, device, host_device
        self.batch_size, self.memory_bytes = batch_size, memory_bytes
        self.before: Structure | None = None

    def structure(self, graph_def: graph_pb2.GraphDef) -> Structure:
        """:func:`grappler_structure` of ``graph_def`` with this step's fetches and devices."""
        return grappler_structure(
            graph_def,
            fetches=self.fetches,
            device=self.device,
            host_device=self.host_device,
            batch_size=self.batch_size,
            memory_bytes=self.memory_bytes,
        )

    def check(self, plan: SwapPlan) -> RewriteCheck:
        """Whether Grappler rewrites the step with ``plan`` as it does without.

        Raises:
            UnsupportedGraphError: Grappler rejects the graph.
        """
        if self.before is None:
            self.before = self.structure(self.graph_def)
        rewritten = graph_pb2.GraphDef()
        rewritten.CopyFrom(self.graph_def)
        apply_with(ProtoEditor(rewritten), plan)
        after = self.structure(rewritten)
        check = _compare(self.before, after)
        ordered = _ordered_sums(self.before, after, plan.order)
        return dataclasses.replace(check, ordered=tuple(sorted(ordered))) if ordered else check


def pins(
    check: RewriteCheck, view: nx.DiGraph, plan: SwapPlan
) -> tuple[frozenset[str], frozenset[str]]:
    """The ops to keep out of the next plan: where ``plan`` touched what Grappler treats differently.

    The culprits are the ops the plan touched (:meth:`SwapPlan.touched`) that Grappler
    treats differently: a difference's own op (a swapped ``Sqrt`` Grappler no
    longer turns into ``Rsqrt``, a recomputed op whose clone runs unfused), an
    op only the step with the plan has (:attr:`RewriteCheck.new`: an
    unfused intermediate a swap reads, a dead gradient a swap keeps alive), or
    the first op of an order edge that orders a sum's readers
    (:attr:`RewriteCheck.ordered`); failing those, a touched op Grappler no
    longer computes (:attr:`Difference.lost`). Every op like a culprit
    (:func:`_pattern`) is pinned with it. When there is no culprit, the touched
    ops nearest the changed ones are pinned (a few edges away: a fold
    Grappler applies another way), else every op the differences read. A
    far reader of a recomputed op's clone has no clone of its own: the
    recomputed ops it reads are kept from recomputation with it.

    Returns:
        ``(pinned, not recomputed)``: ops no lever may touch
        (:data:`~tflms.graph.grappler_rules.PINNED`), and ops only
        recomputation touched, kept from it alone
        (:data:`~tflms.graph.grappler_rules.NOT_RECOMPUTED`).
    """
    roles = plan.touched()
    changed = {d.op for d in check.differences if not d.lost} | set(check.new)
    culprits = {
        name
        for name in changed | set(check.ordered) | set(check.summed)
        if name in roles and name in view
    }
    if not culprits:  # what Grappler no longer computes: a fusion the plan broke at its end
        culprits = {d.op for d in check.differences if d.lost and d.op in roles}
    found = set(culprits)
    if not culprits:  # the plan touched only ops near the changed ones
        centers = {d.op for d in check.differences} | set(check.summed)
        near = _near(view, {name for name in centers if name in view}, set(roles))
        found = near or {name for d in check.differences for name in d.mentions() if name in view}
    recompute_only = {
        name for name in found if roles.get(name) == {"recompute"} and name not in check.ordered
    }
    reads = _clones_read(plan)
    for name in list(recompute_only):  # a reader of a clone computes otherwise: its originals
        recompute_only |= reads.get(name, set())  # stay (a reader has no clone)
    full = found - recompute_only
    # ops like a culprit are pinned as it is: kept from recomputation only, or from every lever
    kinds = {
        _pattern(view, name): kind for kind in (recompute_only, full) for name in kind & culprits
    }
    if kinds:
        for name in view:
            kind = kinds.get(_pattern(view, name))
            if kind is not None:
                kind.add(name)
    return frozenset(full), frozenset(recompute_only - full)


def _clones_read(plan: SwapPlan) -> dict[str, set[str]]:
    """The recomputed ops each far consumer of ``plan`` reads the clones of."""
    reads: dict[str, set[str]] = {}
    for group in plan.recomputes:
        for consumer, _, original, _ in group.consumers:
            reads.setdefault(consumer, set()).add(original)
    return reads


_SUMS = frozenset({"AddN", "AccumulateNV2"})


def _ordered_sums(before: Structure, after: Structure, order) -> set[str]:
    """The first ops of order edges that order a sum of 3+ inputs against another reader of
    one of its inputs, where the step without the plan leaves the two unordered."""
    if not order:
        return set()
    readers: dict[str, set[str]] = {}
    for name, reads in after.reads.items():
        for op, _ in reads:
            readers.setdefault(op, set()).add(name)
    memo_before: dict = {}
    memo_after: dict = {}
    found: set[str] = set()
    for total, (kind, *_) in after.ops.items():
        if kind not in _SUMS or len(after.reads[total]) < 3 or total not in before.ops:
            continue
        for producer, _ in after.reads[total]:
            for other in readers.get(producer, set()) - {total}:
                if other not in before.ops:
                    continue
                if other in before.ancestors(total, memo_before) or total in before.ancestors(
                    other, memo_before
                ):
                    continue  # ordered without the plan too
                if other in after.ancestors(total, memo_after):
                    first, then = other, total
                elif total in after.ancestors(other, memo_after):
                    first, then = total, other
                else:
                    continue
                for a, b in order:
                    if (a == first or first in after.ancestors(a, memo_after)) and (
                        b == then or b in after.ancestors(then, memo_after)
                    ):
                        found.add(a)
    return found


def _near(view: nx.DiGraph, ops: set[str], touched_ops: set[str], hops: int = 3) -> set[str]:
    """The touched ops within ``hops`` data or control edges of ``ops``, either way, nearest first."""
    frontier, seen = set(ops), set(ops)
    for _ in range(hops):
        frontier = {n for op in frontier for n in (*view.pred[op], *view.succ[op])} - seen
        seen |= frontier
        found = frontier & touched_ops
        if found:
            return found
    return set()


def _pattern(view: nx.DiGraph, name: str) -> tuple:
    """An op's type and its data consumers' types: Grappler rewrites ops alike by this.

    A fusion (``Conv2D`` into its ``BiasAdd``, ``Sigmoid`` into the ``Mul`` of
    a swish) or a fold (``a / sqrt(b)``) a plan blocked at one op is blocked
    at every op like it, so :func:`pins` pins them all in one round instead of
    finding them one plan at a time.
    """
    readers = sorted(
        {view.nodes[c]["type"] for c, edge in view.succ[name].items() if edge.get("tensors")}
    )
    return view.nodes[name]["type"], tuple(readers)


def _compare(before: Structure, after: Structure) -> RewriteCheck:
    """The ops whose arithmetic one side has and the other has not, where the change starts.

    An op is *changed* when its value number is missing on the other side; a
    change upstream changes every number below it, so only the *first* ops of
    each change are reported: changed ops whose inputs the other side has.
    The names of the ops only the rewritten step has (not merely computed
    differently downstream of a change) are kept for :func:`pins`: a swap
    deep in a dead branch a plan kept alive.
    """
    have_before, have_after = set(before.values.values()), set(after.values.values())

    def first(side: Structure, other: set[str]) -> list[str]:
        return [
            name
            for name, number in side.values.items()
            if number not in other
            and all(side.values[op] in other for op, _ in side.reads[name] if op in side.values)
        ]

    new = [  # kept alive or unfused by the plan: Grappler did not keep the op at all without it
        name
        for name, number in after.values.items()
        if number not in have_before and _original(name) not in before.ops
    ]
    differences = [
        Difference(_original(name), before.ops.get(_original(name)), after.ops[name])
        for name in first(after, have_before)
    ]
    differences += [
        Difference(name, before.ops[name], after.ops.get(name), lost=True)
        for name in first(before, have_after)
    ]
    unique = {(d.op, d.before, d.after): d for d in differences}
    return RewriteCheck(
        differences=tuple(sorted(unique.values(), key=lambda d: d.op)),
        ops=len(before.ops),
        new=tuple(sorted({_original(name) for name in new})),
        summed=tuple(sorted(_summed(before, after))),
    )


def _summed(before: Structure, after: Structure) -> set[str]:
    """The inputs of a sum of 3+ inputs (as Grappler made it) whose buffer the plan changes.

    Such a sum accumulates into an input buffer it may reuse (one reader left at
    run time): an input it reads from a swap-in, or one with more readers than
    without the plan (a swap-out, a clone), changes which, hence the float
    summation order (:data:`tflms.plan.candidates.ORDER_SENSITIVE`).
    """
    found: set[str] = set()
    for total, (kind, *_) in after.ops.items():
        if kind not in _SUMS or len(after.raw[total]) < 3 or total not in before.ops:
            continue
        for source, (producer, _) in zip(after.raw[total], after.reads[total], strict=True):
            if source != producer or after.readers.get(producer) != before.readers.get(producer):
                found.add(_original(producer))
    return found


def _original(name: str) -> str:
    """The op a clone re-runs (``<op>-lms/recompute[_<n>]`` -> ``<op>``); other names as they are."""
    base, found, _ = name.rpartition(_RECOMPUTE_SUFFIX)
    return base if found else name


def _kind(node) -> str:
    """``out``/``in``/``recompute`` (swap-out, swap-in, clone) for a tflms op, else ``""``."""
    if SWAP_ATTR not in node.attr:
        return ""
    return node.attr[SWAP_ATTR].s.decode()


def _value(node) -> bytes:
    return node.attr["value"].SerializeToString()


def _digest(*parts: bytes) -> str:
    h = hashlib.sha1()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:12]
