"""Memory-aware ordering: control edges that stop two branches from piling up at the peak.

In a backward pass, sibling branches (a ResNet block's shortcut and main
path, the two halves of a U-Net skip connection) become ready together, and
a FirstReady executor interleaves them: the full-size temporaries of both
are alive at once, only because of the order. :func:`order_edges` finds such
a pair at the simulated peak and serializes it:

1. the big buffers live at the peak and the *joins* that free them (their
   last consumers) are read off the simulated schedule;
2. for two joins ``J1``, ``J2`` that no path orders, the branch of ``J2`` is
   ``B = ancestors(J2) - ancestors(J1)`` (the work only ``J2`` needs), and
   control edges ``J1 -> e`` go to every op ``e`` of ``B`` with an input from
   outside ``B`` (swap-ins included), so ``B`` starts once ``J1`` is done;
3. the simulator judges both directions of every candidate pair; the best
   one that lowers the peak without slowing the step by more than
   ``max_slowdown`` is kept, and the search repeats at the new peak.

No edge can close a cycle: nothing in ``B`` is an ancestor of ``J1``. No edge
may change which input buffer an ``AddN`` of 3+ inputs sums into (TensorFlow
reuses a buffer only when its other readers are done, and the summation
order follows): an edge set that would newly order such an ``AddN`` and
another reader of one of its inputs is discarded, and so is one that starts at
an op of a chain Grappler's arithmetic optimizer folds (a control fanout
changes that rewrite). Training stays bitwise identical.

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph(name="fork")
    >>> def op(name, nbytes, *ins):
    ...     out = TensorInfo(f"{name}:0", 0, "float32", (nbytes // 4,), nbytes)
    ...     v.add_node(name, type="Relu", device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    >>> op("dy", 1 << 20)
    >>> for b in "ab":  # two branches of two big temporaries each, then a small result
    ...     op(f"{b}1", 64 << 20, "dy"); op(f"{b}2", 64 << 20, f"{b}1"); op(f"{b}3", 4, f"{b}1", f"{b}2")
    >>> op("join", 4, "a3", "b3")
    >>> assign_levels(v)
    >>> from tflms.cost.target import Target
    >>> result = order_edges(v, Target.for_device("V100-16GB", "ideal"))
    >>> result.edges, result.peak_after < result.peak_before
    ((('a3', 'b1'),), True)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import networkx as nx

from tflms.cost.target import Target
from tflms.graph.grappler_rules import absent_from_the_run, in_a_fold, pinned
from tflms.plan.candidates import ORDER_SENSITIVE
from tflms.simulation.allocator import Accounting
from tflms.simulation.memory import trace_memory
from tflms.simulation.schedule import CompiledGraph, compile_view, first_ready

__all__ = ["OrderResult", "order_edges"]

logger = logging.getLogger(__name__)

_PAIRS = 6  # joins of the largest live buffers considered per round
_MAX_BRANCH = 4000  # ops; larger "branches" are the rest of the step, not a branch
_MAX_ENTRIES = 96


@dataclass(frozen=True)
class OrderResult:
    """The order edges :func:`order_edges` chose and what they do (simulated).

    Attributes:
        edges: ``(before, after)`` op names.
        peak_before, peak_after: simulated device peaks without and with them.
        step_before_s, step_after_s: simulated step times.
        rounds: search rounds run.
    """

    edges: tuple[tuple[str, str], ...]
    peak_before: int
    peak_after: int
    step_before_s: float
    step_after_s: float
    rounds: int


class _Graph:
    """A compiled graph plus extra control edges, re-simulated cheaply.

    ``written`` holds the dependencies of the graph as it is written (``IdentityN``
    nodes kept), which ancestry checks use: the simulation may bypass those nodes as
    Grappler does at run time, but an order edge must not close a cycle through them
    in the graph tflms rewrites.
    """

    def __init__(
        self,
        compiled: CompiledGraph,
        accounting: Accounting,
        written: CompiledGraph,
        fixed=frozenset(),
        view: nx.DiGraph | None = None,
    ):
        self.g = compiled
        # an order moves tensors; the process terms of "realistic" are the same for every order
        self.accounting = "tensors" if accounting == "realistic" else accounting
        self.base_preds = list(compiled.preds_count)
        self.base_succs = [list(s) for s in compiled.succs]
        self.written_succs = [list(s) for s in written.succs]
        self.preds: list[list[int]] = [[] for _ in range(len(compiled))]
        self.run_preds: list[list[int]] = [[] for _ in range(len(compiled))]
        for preds, succs in ((self.preds, self.written_succs), (self.run_preds, compiled.succs)):
            for i, succ in enumerate(succs):
                for j in succ:
                    preds[j].append(i)
        self.fixed = fixed  # ops Grappler removes: an order edge would make Grappler keep them
        self.view = view  # the view compiled, for in_fold
        self._folds: dict[int, bool] = {}
        self._chains: dict[int, list[int]] | None = None

    def in_fold(self, i: int) -> bool:
        """Whether op ``i`` is in a chain Grappler's arithmetic optimizer folds: no order
        edge may start there (:func:`~tflms.graph.grappler_rules.in_a_fold`; asked only of
        the few ops an edge would start at, so memoized rather than computed for all)."""
        if i not in self._folds:
            self._folds[i] = self.view is not None and in_a_fold(self.view, self.g.names[i])
        return self._folds[i]

    def pinned(self, i: int) -> bool:
        """Whether op ``i`` is pinned (:func:`~tflms.graph.grappler_rules.pinned`): no order
        edge may end there either (seen: a control input into a gradient's ``Mul`` moved
        where Grappler's constant folding pushed a constant factor)."""
        return self.view is not None and pinned(self.view, self.g.names[i])

    def closes_cycle(self, edges) -> bool:
        """Whether adding ``edges`` closes a cycle once TensorFlow orders the step's state.

        A step traced by ``tf.function`` is rewritten before tracing ends; TensorFlow's
        automatic control dependencies then order the ops on each resource (variable
        reads and writes) as they were created, edges the view does not hold yet
        (:meth:`state_chains`). An order edge the view sees as free can close a cycle
        with them (seen: an edge into an RMSprop slot's read), and TensorFlow refuses
        to run the step.
        """
        chains = self.state_chains()
        for a, b in edges:
            seen, stack = {b}, [b]
            while stack:
                node = stack.pop()
                if node == a:
                    return True
                for s in (*self.written_succs[node], *chains.get(node, ())):
                    if s not in seen:
                        seen.add(s)
                        stack.append(s)
        return False

    def state_chains(self) -> dict[int, list[int]]:
        """``op -> [the next op on each resource it reads or writes]``, in creation order.

        A chain per resource, every op on it after the one before: stricter than
        TensorFlow's (reads between two writes run in any order), so an edge it allows
        is safe.
        """
        if self._chains is None:
            self._chains = {}
            if self.view is not None:
                index = {name: i for i, name in enumerate(self.g.names)}
                last: dict[str, int] = {}
                for name, data in self.view.nodes(data=True):  # creation order
                    if not data.get("stateful") or name not in index:
                        continue
                    for resource in _resources(self.view, name):
                        if resource in last:
                            self._chains.setdefault(last[resource], []).append(index[name])
                        last[resource] = index[name]
        return self._chains

    def simulate(self, extra=()):
        g = self.g
        g.preds_count = list(self.base_preds)
        g.succs = [list(s) for s in self.base_succs]
        for a, b in extra:
            g.succs[a].append(b)
            g.preds_count[b] += 1
        schedule = first_ready(g)
        return schedule, trace_memory(g, schedule, accounting=self.accounting, top=40)

    def add(self, edges) -> None:
        for a, b in edges:
            self.base_succs[a].append(b)
            self.written_succs[a].append(b)
            self.base_preds[b] += 1
            self.preds[b].append(a)
            self.run_preds[b].append(a)
        for a, _ in edges:
            self.base_succs[a].sort(key=lambda j: self.g.names[j])

    def ancestors(self, node: int, *, run_time: bool = False) -> set[int]:
        """``node`` and its ancestors in the graph as written (``run_time``: as Grappler
        runs it, bypassed nodes removed)."""
        preds = self.run_preds if run_time else self.preds
        seen, stack = {node}, [node]
        while stack:
            for p in preds[stack.pop()]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    def descendants(self, node: int) -> set[int]:
        seen, stack = {node}, [node]
        while stack:
            for s in self.written_succs[stack.pop()]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen


def order_edges(
    view: nx.DiGraph,
    target: Target,
    *,
    rounds: int = 24,
    max_slowdown: float = 0.02,
    min_buffer_fraction: float = 0.02,
    costs: dict | None = None,
) -> OrderResult:
    """Find control edges that lower the simulated peak of ``view`` (see the module docstring).

    Args:
        view: the analysis view, already rewritten by the plan's swaps and
            recomputations (their ops are ordinary nodes here).
        target: its device times the ops, its link the copies, and its
            accounting (:mod:`tflms.simulation.memory`) weighs the buffers;
            the plan is replayed under the target it was found for.
        rounds: at most this many edge sets are added.
        max_slowdown: an edge set may lengthen the simulated step by at most
            this fraction.
        min_buffer_fraction: live buffers smaller than this fraction of the
            peak are not considered.
        costs: a memo of op times shared with other compilations of rewrites
            of one view on ``device`` (``compile_view``'s); None: none.

    Returns:
        An :class:`OrderResult`; ``edges`` is empty when no order helps.
    """
    device, link, accounting = target.device, target.link, target.accounting
    bypass = accounting != "grappler"  # as Grappler runs it; ancestry as written
    costs = {} if costs is None else costs  # the two compilations share most ops
    compiled = compile_view(view, device=device, link=link, bypass_identity_n=bypass, costs=costs)
    written = (
        compile_view(view, device=device, link=link, bypass_identity_n=False, costs=costs)
        if bypass
        else compiled
    )
    removed = {i for i, name in enumerate(compiled.names) if absent_from_the_run(view, name)}
    graph = _Graph(compiled, accounting, written, removed, view)
    g = graph.g
    concern = _addn_concerns(graph)
    schedule, memory = graph.simulate()
    peak0, step0 = memory.device_peak, schedule.makespan
    chosen: list[tuple[int, int]] = []
    done = 0
    for done in range(1, rounds + 1):  # noqa: B007 - reported
        best = None
        for edges in _candidates(graph, schedule, memory, min_buffer_fraction):
            if graph.fixed.intersection(op for edge in edges for op in edge):
                continue
            if not _safe(graph, edges, concern):
                continue
            s, m = graph.simulate(edges)
            if m.device_peak >= memory.device_peak or s.makespan > step0 * (1 + max_slowdown):
                continue
            key = (m.device_peak, s.makespan)
            if best is None or key < best[0]:
                best = (key, edges, s, m)
        if best is None:
            break
        _, edges, schedule, memory = best
        graph.add(edges)
        chosen.extend(edges)
        logger.debug("order round %d: %d edges, peak %d", done, len(edges), memory.device_peak)
    names = g.names
    result = OrderResult(
        edges=tuple((names[a], names[b]) for a, b in chosen),
        peak_before=peak0,
        peak_after=memory.device_peak,
        step_before_s=step0,
        step_after_s=schedule.makespan,
        rounds=done,
    )
    logger.info(
        "tflms ordering %s: %d edges, peak %d -> %d bytes",
        view.graph.get("name", ""),
        len(result.edges),
        peak0,
        result.peak_after,
    )
    return result


def _live(graph: _Graph, schedule, memory, min_fraction: float):
    """``(producer, last reader)`` of the big buffers live at the peak, largest first."""
    g = graph.g
    index = {name: i for i, name in enumerate(g.names)}
    found = []
    for buffer in memory.live_at_peak:
        if buffer.bytes < min_fraction * memory.device_peak:
            continue
        op, _, k = buffer.tensor.rpartition(":")
        if not k.isdigit():  # a loop's iterations, TensorFlow's copy across the link
            continue
        producer = index.get(op)
        readers = g.consumers.get((producer, int(k)), []) if producer is not None else []
        if readers:
            found.append((producer, max(readers, key=lambda c: (schedule.end[c], c))))
    return found


def _candidates(graph: _Graph, schedule, memory, min_fraction: float):
    """Edge sets that move work at the peak: branch serializations, then just-in-time moves."""
    live = _live(graph, schedule, memory, min_fraction)
    yield from _serializations(graph, schedule, live)
    yield from _just_in_time(graph, schedule, live)


def _just_in_time(graph: _Graph, schedule, live):
    """Start the producers of buffers that wait long for their reader only once the reader's
    last input is done (``last -> producer``), so the buffers are born just in time: each
    buffer alone, then all the early inputs of one reader together."""
    g = graph.g
    by_reader: dict[int, list[int]] = {}
    for producer, reader in live:
        if g.lanes[producer] in ("compute", "h2d"):
            by_reader.setdefault(reader, []).append(producer)
    for reader, producers in by_reader.items():
        inputs = {p for p, _, _ in g.inputs[reader]}
        moves = []
        for producer in producers:
            others = [p for p in inputs if p != producer and p not in producers]
            if not others:
                continue
            last = max(others, key=lambda p: (schedule.end[p], p))
            if schedule.end[last] <= schedule.start[producer] or g.lanes[last] != "compute":
                continue
            if producer in graph.ancestors(last):
                continue  # the other input needs this buffer: no earlier order possible
            moves.append((last, _chain_head(graph, producer, last)))
        yield from ([m] for m in moves)
        if len(moves) > 1:
            yield moves


def _chain_head(graph: _Graph, producer: int, last: int) -> int:
    """The first op of the chain that only feeds ``producer`` (``Tile -> RealDiv``): delaying
    it rather than ``producer`` keeps the chain's earlier outputs from waiting instead."""
    g = graph.g

    def size(op):
        return sum(t.bytes for t in g.outputs[op]) if g.spaces[op] == "device" else 0

    head = producer
    while True:
        sources = {p for p, _, _ in g.inputs[head]}
        big = [p for p in sources if size(p) >= size(head) // 2 > 0]
        if len(big) != 1:
            return head
        (source,) = big
        readers = {c for key, cs in g.consumers.items() if key[0] == source for c in cs}
        if (
            readers != {head}
            or g.lanes[source] != "compute"
            or source == last
            or source in graph.ancestors(last)
        ):
            return head
        head = source


def _serializations(graph: _Graph, schedule, live):
    """Serialize the branches of two joins no path orders (see the module docstring)."""
    g = graph.g
    joins = []
    for _, reader in live:
        if g.lanes[reader] == "compute" and reader not in joins:
            joins.append(reader)
        if len(joins) >= _PAIRS:
            break
    ancestors = {j: graph.ancestors(j) for j in joins}
    for a in joins:
        for b in joins:
            if a == b or a in ancestors[b] or b in ancestors[a]:
                continue
            # the branch: work only b needs; swap-outs stay where they are (a delayed
            # swap-out keeps its tensor on the device)
            branch = {i for i in ancestors[b] - ancestors[a] if g.lanes[i] in ("compute", "h2d")}
            started = {i for i in branch if schedule.start[i] < schedule.start[b]}
            if not started or len(branch) > _MAX_BRANCH:
                continue
            entries = sorted(i for i in branch if any(p not in branch for p in graph.preds[i]))
            if entries and len(entries) <= _MAX_ENTRIES:
                yield [(a, e) for e in entries]


def _addn_concerns(graph: _Graph) -> list[tuple[int, int]]:
    """``(AddN, other reader)`` pairs that no path orders: their order at run time decides
    which input buffer the AddN reuses, hence its summation order."""
    g = graph.g
    pairs = []
    for i, kind in enumerate(g.types):
        if kind not in ORDER_SENSITIVE or len(g.inputs[i]) < 3:
            continue
        ancestors = graph.ancestors(i, run_time=True)  # unordered once Grappler bypasses
        for p, k, _ in g.inputs[i]:
            for c in g.consumers.get((p, k), ()):
                if c != i and c not in ancestors and i not in graph.ancestors(c, run_time=True):
                    pairs.append((i, c))
    return pairs


def _resources(view: nx.DiGraph, name: str) -> list[str]:
    """The resources (variable handles) op ``name`` reads a handle of, as ``producer:index``."""
    found = []
    for src, edge in view.pred[name].items():
        outputs = view.nodes[src].get("outputs") or ()
        for k, _ in edge.get("tensors", ()):
            if k < len(outputs) and outputs[k].dtype == "resource":
                found.append(f"{src}:{k}")
    return found


def _safe(graph: _Graph, edges, concern) -> bool:
    """Whether ``edges`` leave every unordered concern pair unordered and every fold alone.

    An op of a chain Grappler's arithmetic optimizer folds must not gain a control
    fanout (:func:`~tflms.graph.grappler_rules.in_a_fold`): the rewrite, and the float
    rounding, would change.
    """
    if any(graph.in_fold(a) for a, _ in edges) or any(graph.pinned(b) for _, b in edges):
        return False
    if graph.closes_cycle(edges):
        return False
    if not concern:
        return True
    before = set()
    for a, _ in edges:
        before |= graph.ancestors(a)
    after = set()
    for _, b in edges:
        after |= graph.descendants(b)
    return not any((x in before and y in after) or (y in before and x in after) for x, y in concern)
