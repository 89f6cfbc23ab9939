"""Schedule of the simulator: when each op of a view runs, and on which stream.

:func:`compile_view` turns an analysis view into flat arrays (one pass over
networkx, then plain lists) and :func:`first_ready` runs them.

The schedule is the one Grappler's ``VirtualScheduler`` uses with its default
``FirstReady`` ready-node manager, so that our peak can be checked against
TensorFlow's own estimate op for op:

* an op becomes *ready* when its last data or control input finishes;
* among ready ops, the one that became ready first runs first, ties broken by
  op name;
* each stream runs one op at a time; an op starts at the later of its ready
  time and the moment its stream is free.

Streams (lanes): ``compute`` (the GPU's compute stream), ``d2h`` and ``h2d``
(one copy stream per direction, as CUDA runs swap copies), ``host`` (ops
placed on the host) and one lane per other device. Swap-outs run on ``d2h``
and swap-ins on ``h2d``, so a copy overlaps with compute and a consumer waits
for its swap-in. A swap-in is a GPU op: the executor dispatches it in
FirstReady order among the compute ops (allocating its device buffer then),
and its copy starts when the host-to-device stream is free. A copy is a
``tflms`` swap op or any ``Identity`` whose input sits on the other side of
the link (so hand-made swaps are understood too).

Why this is a fair model of TensorFlow's executor: TensorFlow also runs an op
as soon as its inputs are ready, from a ready queue, and a GPU executes the
kernels of one stream in the order they were enqueued. On a single compute
stream FirstReady reduces to "first in, first out by readiness": the order of
a training step's forward and backward ops does not depend on the op
durations, except among ops that become ready at the same instant (name
order, as in Grappler). Our op times (a roofline, :mod:`tflms.cost.ops`)
differ from Grappler's analytical ones, yet the order - which decides the
memory peak - stays the same; the durations only decide how copies overlap.

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph()
    >>> for name in ("a", "c", "b", "d"):
    ...     v.add_node(name, type="Relu", device="", placement="compute", tflms=None,
    ...                outputs=(TensorInfo(name + ":0", 0, "float32", (1024,), 4096),))
    >>> v.add_edge("a", "c", tensors=[(0, 0)], control=False)
    >>> v.add_edge("a", "b", tensors=[(0, 0)], control=False)
    >>> v.add_edge("b", "d", tensors=[(0, 0)], control=False)
    >>> v.add_edge("c", "d", tensors=[(0, 1)], control=False)
    >>> g = compile_view(v, device="V100-16GB", link="pcie3")
    >>> [g.names[i] for i in first_ready(g).order]  # b and c tie: name order
    ['a', 'b', 'c', 'd']
"""

from __future__ import annotations

import dataclasses
import heapq
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, chain

import networkx as nx

from tflms.cost.hardware import HOST, DeviceModel, LinkModel, get_device, get_link
from tflms.cost.ops import MIN_SECONDS, op_cost
from tflms.cost.temporaries import TEMPORARY_OPS, temporary_bytes
from tflms.errors import UnsupportedGraphError
from tflms.graph.grappler_rules import removed_at_run_time
from tflms.simulation import native
from tflms.simulation.bypass import bypass, dead_at_run_time, prune

__all__ = [
    "CompiledGraph",
    "Schedule",
    "compile_view",
    "relinked",
    "first_ready",
    "replayed",
    "LANES",
]

LANES = ("compute", "d2h", "h2d", "host")
"""The fixed lanes; ops on other devices get a lane named after the device."""

_LOOP_BACK = ("NextIteration", "RefNextIteration")


@dataclass
class CompiledGraph:
    """A view flattened into lists indexed by op number.

    Attributes:
        names, types: op names and types.
        lanes: the stream each op runs on (see :data:`LANES`).
        spaces: memory each op's outputs live in: ``"device"``, ``"host"`` or
            ``None`` (another device, not tracked).
        outputs: :class:`~tflms.graph.view.TensorInfo` per output.
        inputs: data inputs as ``(producer, output index, input index)``,
            ordered by input index.
        consumers: ``{(op, output index): [consumer ops]}`` for data edges.
        preds_count: number of distinct predecessors (data or control).
        succs: distinct successors (data or control).
        durations: predicted seconds per op.
        flops: counted FLOPs per op.
        copy: ``"d2h"``/``"h2d"`` for copy ops, else ``None``.
        device, link: the models used for the durations.
        scratch: bytes each op holds while it runs besides its outputs (a
            loop's iterations in flight, :mod:`tflms.graph.loops`).
        temporaries: bytes each op's kernel allocates for its run besides
            its outputs (an ``Einsum``'s transposed operands,
            :mod:`tflms.cost.temporaries`); TensorFlow's allocator sees them,
            Grappler's estimate does not.
        held: bytes of the variable behind each variable handle the view
            knows the size of (``variable_bytes``), else 0.
        crossing: bytes each op (not a copy) reads from the other memory
            space, host or device: TensorFlow copies them over the link
            before the op runs (an optimizer's update on the host reads each
            gradient so, :mod:`tflms.keras.offload`); timed into the op.
        derived: values computed once from the ops, their outputs and data
            edges (not the timing or the control edges), by :meth:`derive`:
            shared by :func:`relinked` copies, which change only times.
    """

    names: list
    types: list
    lanes: list
    spaces: list
    outputs: list
    inputs: list
    consumers: dict
    preds_count: list
    succs: list
    durations: list
    flops: list
    copy: list
    device: DeviceModel
    link: LinkModel
    scratch: list = field(default_factory=list)
    temporaries: list = field(default_factory=list)
    crossing: list = field(default_factory=list)
    held: list = field(default_factory=list)
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.names)

    def derive(self, key, compute):
        """``compute(self)``, computed on the first call for ``key`` and kept in :attr:`derived`.

        Args:
            key: Names the value; it must depend only on what ``derived`` may.
            compute: A function of the graph.

        Returns:
            The value.
        """
        if key not in self.derived:
            self.derived[key] = compute(self)
        return self.derived[key]


@dataclass(frozen=True)
class Schedule:
    """When each op runs.

    Attributes:
        order: op numbers in the order the scheduler dispatched them.
        start, end: seconds, per op number.
        lanes: busy seconds per lane.
        makespan: end of the last op (the predicted step time).
        alloc: when each op's outputs are allocated: its start, except for a
            swap-in, whose buffer is allocated when it is dispatched, even if
            the copy then waits for the host-to-device stream (``None``:
            ``start``).
    """

    order: tuple
    start: list
    end: list
    lanes: dict
    makespan: float
    alloc: list | None = None

    def alloc_time(self, i: int) -> float:
        """When op ``i`` allocates its outputs.

        Args:
            i: Op number in the compiled graph.

        Returns:
            Seconds since the step began: ``alloc[i]`` if set, else the op's start.
        """
        return self.start[i] if self.alloc is None else self.alloc[i]


_PLACED: dict[str, tuple[str, str | None]] = {
    "compute": ("compute", "device"),
    "host": ("host", "host"),
}
"""Lane and memory space of an op by its placement; any other placement runs on
``device:<its device>`` and holds no memory the simulator counts."""


def compile_view(
    view: nx.DiGraph,
    *,
    device: str | DeviceModel,
    link: str | LinkModel,
    bypass_identity_n: bool = True,
    costs: dict | None = None,
    prune_dead: bool | None = None,
) -> CompiledGraph:
    """Flatten ``view`` and time every op on ``device`` / ``link``.

    Args:
        view: an analysis view, with or without swap ops.
        device: a :class:`~tflms.cost.hardware.DeviceModel` or preset name.
        link: a :class:`~tflms.cost.hardware.LinkModel` or preset name.
        bypass_identity_n: consumers of an ``IdentityN`` of several inputs read
            its inputs directly, as after Grappler's dependency optimizer, which
            removes such nodes before TensorFlow runs a graph: Keras' optimizers
            pass all gradients through one, and without it each variable's
            update runs as soon as its gradient exists. ``False`` keeps the
            node (Grappler's own estimate simulates the graph unoptimized).
        costs: a memo of op times shared by views rewritten from one view on
            one device (see :class:`tflms.simulation.plans.PlanSimulator`):
            ``{(op name, its data inputs): (seconds, FLOPs)}``. An op name
            must mean the same op in every view that shares it, as it does
            for the rewrites of one view (clones and swap ops are named after
            what they copy). None: every op is timed.
        prune_dead: the ops TensorFlow prunes from a traced function
            (:func:`~tflms.simulation.bypass.dead_at_run_time`: nothing its
            results, control outputs or stateful ops need) take no time, read
            nothing and hold nothing. ``None`` (default): as ``bypass_identity_n``
            (TensorFlow's run-time graph; Grappler's own estimate keeps them).

    Returns:
        A :class:`CompiledGraph`.
    """
    device, link = get_device(device), get_link(link)
    names, nodes = [], []
    for name, node in view.nodes(data=True):
        names.append(name)
        nodes.append(node)
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    lanes: list[str] = []
    spaces: list[str | None] = []
    for node in nodes:
        lane, space = _PLACED.get(node["placement"]) or (f"device:{node['device']}", None)
        lanes.append(lane)
        spaces.append(space)
    inputs: list[list] = [[] for _ in range(n)]
    consumers: dict = {}
    preds_count = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, (_, targets) in enumerate(view.adjacency()):  # view.edges' order
        if nodes[i]["type"] in _LOOP_BACK:
            continue  # TF1 loop back edge: one iteration is simulated
        for dst, edge in targets.items():
            j = index[dst]
            preds_count[j] += 1
            succs[i].append(j)
            for out_idx, in_idx in edge.get("tensors", ()):
                inputs[j].append((i, out_idx, in_idx))
                consumers.setdefault((i, out_idx), []).append(j)
    outputs = [node["outputs"] for node in nodes]
    if bypass_identity_n:
        for i in range(n):
            if nodes[i]["type"] == "IdentityN" and removed_at_run_time(view, names[i]):
                bypass(view, names, index, i, inputs, consumers, preds_count, succs, outputs)
    dead: list[int] = []
    if bypass_identity_n if prune_dead is None else prune_dead:
        pruned = dead_at_run_time(view)
        dead = [i for i in range(n) if names[i] in pruned] if pruned else []
        for i in dead:
            prune(i, inputs, consumers, outputs)
    for lst in inputs:
        if len(lst) > 1:
            lst.sort(key=lambda t: t[2])
    for lst in succs:
        if len(lst) > 1:
            lst.sort(key=lambda j: names[j])

    copy: list = [None] * n
    durations = [0.0] * n
    flops = [0.0] * n
    crossing = [0] * n
    never_run = set(dead)
    for i, node in enumerate(nodes):
        if i in never_run:
            continue  # pruned: takes no time
        kind = _copy_kind(node, inputs[i], spaces) if node["type"] == "Identity" else None
        if kind is not None:
            copy[i] = kind
            lanes[i] = kind
            spaces[i] = "host" if kind == "d2h" else "device"
            durations[i] = link.seconds(sum(t.bytes for t in node["outputs"]))
            continue
        key = None
        if costs is not None and node.get("body") is None:  # a loop's time depends on the link
            key = (names[i], tuple([(names[p], k) for p, k, _ in inputs[i]]))
            if key in costs:
                durations[i], flops[i] = costs[key]
                continue
        durations[i], flops[i] = _op_time(node, nodes, inputs[i], lanes[i], device, link)
        if costs is not None and key is not None:
            costs[key] = (durations[i], flops[i])
    for i in range(n):
        space = spaces[i]
        if copy[i] is None and space is not None:
            crossing[i] = _crossing_bytes(inputs[i], space, spaces, outputs)
            if crossing[i]:
                durations[i] += link.seconds(crossing[i])
    return CompiledGraph(
        names=names,
        types=[node["type"] for node in nodes],
        lanes=lanes,
        spaces=spaces,
        outputs=outputs,
        inputs=inputs,
        consumers=consumers,
        preds_count=preds_count,
        succs=succs,
        durations=durations,
        flops=flops,
        copy=copy,
        device=device,
        link=link,
        scratch=[node["loop"].scratch_bytes if "loop" in node else 0 for node in nodes],
        crossing=crossing,
        held=[node.get("variable_bytes", 0) for node in nodes],
        temporaries=[
            temporary_bytes(
                node["type"],
                node,
                [nodes[p]["outputs"][k] for p, k, _ in inputs[i]],
                node["outputs"],
            )
            if node["type"] in TEMPORARY_OPS and i not in never_run
            else 0
            for i, node in enumerate(nodes)
        ],
    )


def _crossing_bytes(inputs_of_op, space: str, spaces, outputs) -> int:
    """Bytes an op reads from the other memory space (data, not variable handles)."""
    total = 0
    for p, k, _ in inputs_of_op:
        source = spaces[p]
        if source is None or source == space or k >= len(outputs[p]):
            continue
        tensor = outputs[p][k]
        if tensor.dtype != "resource":
            total += tensor.bytes
    return total


def _op_time(node: dict, nodes, inputs, lane: str, device, link) -> tuple[float, float]:
    """Seconds and FLOPs of one op that is not a copy (a loop: its iterations)."""
    ins = [nodes[p]["outputs"][k] for p, k, _ in inputs if k < len(nodes[p]["outputs"])]
    model = device if lane != "host" else HOST
    cost = op_cost(node["type"], ins, node["outputs"], model)
    seconds, flops = cost.seconds, cost.flops
    trips = node["loop"].trips if node.get("loop") is not None else None
    if trips and node.get("body") is not None:  # a loop: its body, once per iteration
        body_seconds, body_flops = _iteration(node["body"], model, link)
        seconds = max(seconds, trips * body_seconds)
        flops = trips * body_flops
    return seconds, flops


def relinked(graph: CompiledGraph, view: nx.DiGraph, link: str | LinkModel) -> CompiledGraph:
    """``graph`` (compiled from ``view``) with its copies and loops timed over ``link``.

    The same as compiling ``view`` again over ``link``: only copy times and
    loop bodies' iterations depend on the link.

    Args:
        graph: A graph from :func:`compile_view` of ``view``.
        view: The view it was compiled from.
        link: The link preset (or model) to time the copies with.

    Returns:
        A new :class:`CompiledGraph`; ``graph`` is unchanged.
    """
    link = get_link(link)
    durations, flops = list(graph.durations), list(graph.flops)
    nodes = [view.nodes[name] for name in graph.names]
    crossing = graph.crossing or [0] * len(graph)
    for i, node in enumerate(nodes):
        if graph.copy[i] is not None:
            durations[i] = link.seconds(sum(t.bytes for t in node["outputs"]))
        elif node.get("body") is not None:
            durations[i], flops[i] = _op_time(
                node, nodes, graph.inputs[i], graph.lanes[i], graph.device, link
            )
            durations[i] += link.seconds(crossing[i]) if crossing[i] else 0.0
        elif crossing[i]:
            durations[i] += link.seconds(crossing[i]) - graph.link.seconds(crossing[i])
    return dataclasses.replace(graph, durations=durations, flops=flops, link=link)


def _iteration(body: nx.DiGraph, device: DeviceModel, link: LinkModel) -> tuple[float, float]:
    """Seconds and FLOPs of one iteration of a loop body's view, its ops one after another."""
    cache = body.graph.setdefault("iteration_cost", {})
    key = (device, link)
    if key not in cache:
        compiled = compile_view(body, device=device, link=link)
        cache[key] = (sum(compiled.durations), sum(compiled.flops))
    return cache[key]


def _copy_kind(node: dict, data_inputs, spaces) -> str | None:
    kind = node.get("tflms")
    if kind == "out":
        return "d2h"
    if kind == "in":
        return "h2d"
    if node["type"] != "Identity" or len(data_inputs) != 1:
        return None
    source = spaces[data_inputs[0][0]]
    if node["placement"] == "host" and source == "device":
        return "d2h"
    if node["placement"] == "compute" and source == "host":
        return "h2d"
    return None


def _cycle_error(names, waiting) -> UnsupportedGraphError:
    stuck = [name for name, left in zip(names, waiting, strict=True) if left > 0][:5]
    return UnsupportedGraphError(
        f"The graph cannot be scheduled: ops such as {stuck} never become ready (a cycle "
        "that is not a TF1 loop). Simulate an acyclic training step."
    )


def first_ready(graph: CompiledGraph, *, compiled: bool | None = None) -> Schedule:
    """Run ``graph`` with Grappler's FirstReady policy (see the module docstring).

    Args:
        graph: The compiled step graph (op durations, lanes, dependencies).
        compiled: the compiled kernel (True), the Python reference (False),
            or the kernel when it was built (None; :mod:`tflms.simulation.native`):
            the same schedule to the last bit.

    Returns:
        The :class:`Schedule`.

    Raises:
        UnsupportedGraphError: the graph has a cycle (not a TF1 loop).
        ConfigError: ``compiled=True`` where the kernels were not built.
    """
    if not native.use_compiled(compiled):
        return _first_ready_py(graph)
    assert native.kernels is not None
    codes = {"compute": 0, "h2d": 1}  # the lanes the kernel treats apart
    lanes = array("i", [codes.setdefault(lane, len(codes)) for lane in graph.lanes])
    order, start, end, alloc, busy, used = native.kernels.first_ready(
        lanes,
        array("d", graph.durations),
        array("q", accumulate(map(len, graph.succs), initial=0)),
        array("q", chain.from_iterable(graph.succs)),
        array("q", graph.preds_count),
        array("q", graph.derive("name rank", _name_rank)),
        codes["compute"],
        codes["h2d"],
        MIN_SECONDS,
    )
    if len(order) != len(graph):
        return _first_ready_py(graph)  # raises the cycle's error, naming ops that never ran
    lane_names = list(codes)
    return Schedule(
        order=tuple(order),
        start=start,
        end=end,
        lanes={lane_names[code]: busy[code] for code in used},
        makespan=max(end, default=0.0),
        alloc=alloc,
    )


def _first_ready_py(graph: CompiledGraph) -> Schedule:
    """:func:`first_ready` in Python: the reference the compiled kernel is held to."""
    n = len(graph)
    names, lanes, durations, succs = graph.names, graph.lanes, graph.durations, graph.succs
    waiting = list(graph.preds_count)
    ready_at = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    alloc = [0.0] * n
    lane_free: dict[str, float] = {}
    busy: dict[str, float] = {}
    rank = graph.derive("name rank", _name_rank)  # ties break by name, as integers
    heap = [(0.0, rank[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        t_ready, _, i = heapq.heappop(heap)
        lane = lanes[i]
        if lane == "h2d":  # dispatched by the compute stream's executor, in order
            dispatch = max(t_ready, lane_free.get("compute", 0.0))
            lane_free["compute"] = dispatch + MIN_SECONDS
            t_ready = dispatch + MIN_SECONDS
        t0 = max(t_ready, lane_free.get(lane, 0.0))
        t1 = t0 + durations[i]
        start[i], end[i] = t0, t1
        alloc[i] = t_ready if lane == "h2d" else t0
        lane_free[lane] = t1
        busy[lane] = busy.get(lane, 0.0) + durations[i]
        order.append(i)
        for j in succs[i]:
            if t1 > ready_at[j]:
                ready_at[j] = t1
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (ready_at[j], rank[j], j))
    if len(order) != n:
        raise _cycle_error(names, waiting)
    return Schedule(
        order=tuple(order),
        start=start,
        end=end,
        lanes=busy,
        makespan=max(end, default=0.0),
        alloc=alloc,
    )


def _name_rank(graph: CompiledGraph) -> list[int]:
    """Each op's position among the op names sorted."""
    rank = [0] * len(graph.names)
    for r, i in enumerate(sorted(range(len(graph.names)), key=graph.names.__getitem__)):
        rank[i] = r
    return rank


def replayed(graph: CompiledGraph, observed) -> Schedule:
    """Run ``graph`` one op at a time in the order an executor was seen to run it.

    Separates the schedule from the rest of the memory model: given the op
    order TensorFlow's executor really used (e.g. from the profiler, see
    :func:`tflms.simulation.measure.measure_cpu_step`), the simulated peak
    differs from the measured one only by liveness and allocator effects.
    Among ready ops the one seen earliest in ``observed`` runs first; ops
    never seen (constants folded away, ops too short for the profiler) run as
    soon as they are ready. Dependencies always win over ``observed``, so any
    order yields a valid schedule.

    Args:
        graph: the compiled graph.
        observed: op names in the order they started; names not in the graph
            are ignored, and only the first occurrence of a name counts.

    Returns:
        The :class:`Schedule` (ops back to back on their lanes, one at a time).

    Raises:
        UnsupportedGraphError: the graph has a cycle.
    """
    position: dict[str, int] = {}
    index = set(graph.names)
    for name in observed:
        if name in index and name not in position:
            position[name] = len(position)
    n = len(graph)
    names, succs = graph.names, graph.succs
    waiting = list(graph.preds_count)
    heap = [(position.get(names[i], -1), names[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    order, start, end, now = [], [0.0] * n, [0.0] * n, 0.0
    busy: dict[str, float] = {}
    while heap:
        _, _, i = heapq.heappop(heap)
        start[i], now = now, now + graph.durations[i]
        end[i] = now
        busy[graph.lanes[i]] = busy.get(graph.lanes[i], 0.0) + graph.durations[i]
        order.append(i)
        for j in succs[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (position.get(names[j], -1), names[j], j))
    if len(order) != n:
        raise _cycle_error(names, waiting)
    return Schedule(order=tuple(order), start=start, end=end, lanes=busy, makespan=now)
