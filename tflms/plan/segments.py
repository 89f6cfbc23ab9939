"""Segments: whole stretches of the forward pass re-run from kept checkpoints.

Chen et al.'s checkpointing (arXiv:1604.06174) keeps a few tensors of the
forward pass and re-runs everything between two of them just before the
backward pass needs it, so a network of n layers holds about sqrt(n) layers'
activations at its peak instead of n. This module plans that for a step's
analysis view, as :class:`~tflms.plan.entries.Recompute` groups like the
cheap-op groups of :mod:`tflms.plan.recompute`, dense ops included:

1. **The turn.** The end of the forward pass: the first gradient op that reads
   another (by TensorFlow's gradient scopes and op types), else the
   level where the most bytes are held from before to after it. Consumers
   before it are the forward pass, consumers after it the backward pass.
2. **Cuts.** Levels of the forward pass that one tensor alone carries on (the
   residual stream between two transformer blocks, the link of a chain): the
   tensors produced up to the level and read by the forward pass after it are
   that tensor, plus small ones (labels, shapes, masks; at most
   :data:`STRAGGLERS` of its bytes) that stay kept.
3. **Checkpoints.** Every ``LMSConfig.recompute_segments``-th cut is kept,
   counted from whichever of the first N cuts makes the groups re-run
   materially less predicted compute for about the same bytes
   (:func:`_cheapest`: on a transformer, the residual stream after each block
   rather than after each attention); the forward pass between two
   checkpoints is a segment.
4. **Groups.** Each segment's tensors that the backward pass reads are re-run
   from the checkpoint before it, however soon after the turn the reader
   comes (the last block before the loss too, as ``RematScope`` re-runs every
   block: ``swapout_threshold`` is the distance a swap needs to hide its
   copy, and a re-run copies nothing), unless the reader comes within
   :data:`RERUN_AHEAD` levels of the tensor's making (nothing to free): the group grows back from them through every op the
   tensors depend on, to checkpoints, resident tensors (weights, inputs, small
   tensors) and tensors of other segments. An op that cannot be re-run (a
   stateful op, control flow, an op Grappler rewrites differently once it is
   cloned) keeps its outputs instead, and the clones read what is kept rather
   than re-run it. The backward readers are rerouted to the clones, which
   start at a trigger :data:`RERUN_AHEAD` levels before the first of them; the
   forward readers keep the originals, and a *hold* stands in for the
   rerouted ones, so Grappler rewrites the forward pass as it does without the
   plan (:class:`~tflms.plan.entries.Recompute`). The re-run also waits for
   the other readers of the backward tensors that die before its trigger
   (:mod:`tflms.plan.release`), so that it never runs beside them.

Each group costs its ops' predicted time once more (the forward pass of its
segment, as Chen's and Keras's ``RematScope(mode="full")`` do); with
``memory_budget`` the auto-tuner weighs it against swaps and cheap-op groups.
Clones read their inputs through gates, so Grappler fuses them as it fuses
the originals (:class:`~tflms.plan.entries.Recompute`), and the Grappler check
(``LMSConfig.check_rewrites``) holds the rest to the same arithmetic.

Example:
    >>> import networkx as nx
    >>> from tflms.config import LMSConfig
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph(name="chain")
    >>> def op(name, kind, *ins, nbytes=1 << 20):
    ...     out = TensorInfo(f"{name}:0", 0, "float32", (8, nbytes // 32), nbytes)
    ...     v.add_node(name, type=kind, device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    >>> op("x", "Placeholder")
    >>> for i in range(6):  # six layers of two ops each: tanh(x) * 2
    ...     op(f"t{i}", "Tanh", f"m{i - 1}" if i else "x")
    ...     op(f"m{i}", "Mul", f"t{i}")
    >>> op("loss", "Sum", "m5", nbytes=4)
    >>> for i in reversed(range(6)):  # the backward pass reads each layer's tanh
    ...     op(f"g{i}", "TanhGrad", f"t{i}", "loss" if i == 5 else f"g{i + 1}")
    >>> assign_levels(v)
    >>> [op for op, _ in forward_cuts(v, turn_level(v))]  # a chain: every tensor is a cut
    ['t0', 'm0', 't1', 'm1', 't2', 'm2', 't3', 'm3', 't4', 'm4', 't5']
    >>> config = LMSConfig(recompute=True, recompute_segments=4, swapout_threshold=2,
    ...                    swapin_ahead=1, min_tensor_bytes=0)
    >>> [g.ops for g in plan_segments(v, config, config.target())]  # m1 and m3 kept
    [('t0', 'm0', 't1'), ('t2', 'm2', 't3'), ('t4',)]
"""

from __future__ import annotations

import logging

import networkx as nx

from tflms.config import LMSConfig
from tflms.cost.target import Target
from tflms.graph.grappler_rules import aliases_a_variable, folded_to_constants, pinned
from tflms.graph.view import consumers as tensor_consumers
from tflms.plan.candidates import NEVER_SWAP_PRODUCERS
from tflms.plan.entries import Recompute
from tflms.plan.phases import batch_dependent, turn_level
from tflms.plan.recompute import make_group
from tflms.plan.release import release_waits
from tflms.plan.rerun_cost import data_inputs, rerun_seconds
from tflms.plan.triggers import trigger_filter

__all__ = [
    "plan_segments",
    "forward_cuts",
    "STRAGGLERS",
    "MAX_SEGMENT_OPS",
]

logger = logging.getLogger(__name__)

STRAGGLERS = 0.1
"""A cut's other crossing tensors may hold at most this fraction of its
tensor's bytes (they are kept: labels, masks, shape tensors)."""

STREAM_FRACTION = 8
"""A cut's tensor holds at least 1/this of the median cut tensor's bytes."""

MAX_SEGMENT_OPS = 2000
"""A segment of more ops is not re-run (its group would not be cheap to check)."""

RERUN_AHEAD = 2
"""A segment's re-run starts at most this many levels before its first reader
(``swapin_ahead`` when that is smaller): a re-run has no copy to hide, and each
level earlier holds the segment's tensors through that much more of the
backward pass, beside the next segment's."""


def forward_cuts(view: nx.DiGraph, turn: int) -> list[tuple[str, int]]:
    """The forward pass's cut tensors, ``(producer, output index)`` by level (see the module doc).

    Args:
        view: the analysis view, with levels.
        turn: :func:`turn_level`.

    Returns:
        One tensor per cut level, in level order.
    """
    levels = nx.get_node_attributes(view, "level")
    activations = batch_dependent(view)
    spans = []  # (first level it crosses, last level it crosses, bytes, tensor)
    for name, data in view.nodes(data=True):
        lp = levels[name]
        if (
            lp >= turn
            or name not in activations
            or data["type"] in NEVER_SWAP_PRODUCERS
            or data["control_flow"]
        ):
            continue
        for info in data["outputs"]:
            forward = [levels[c] for c, _ in tensor_consumers(view, name, info.index)]
            last = max((lc for lc in forward if lc < turn), default=lp)
            if last > lp:
                spans.append((lp, last, info.bytes, (name, info.index)))
    crossing: dict[int, list[tuple[int, tuple[str, int]]]] = {}
    for first, last, nbytes, tensor in spans:
        for level in range(first, last):  # produced at or before, read after
            crossing.setdefault(level, []).append((nbytes, tensor))
    found: list[tuple[int, tuple[str, int]]] = []
    for level in sorted(crossing):
        held = sorted(crossing[level], reverse=True)
        top, tensor = held[0]
        if top and sum(b for b, _ in held[1:]) <= STRAGGLERS * top:
            if levels[tensor[0]] == level and (not found or found[-1][1] != tensor):
                found.append((top, tensor))
    # a tiny tensor alone at a level (a label's cast, a pooled vector) is no stream to cut
    sizes = sorted(nbytes for nbytes, _ in found)
    typical = sizes[len(sizes) // 2] if sizes else 0
    return [tensor for nbytes, tensor in found if nbytes * STREAM_FRACTION >= typical]


def plan_segments(
    view: nx.DiGraph, config: LMSConfig, target: Target, *, taken: frozenset[str] = frozenset()
) -> tuple[Recompute, ...]:
    """Plan the segment groups of ``view`` (see the module docstring).

    Args:
        view: the analysis view (without tflms ops).
        config: ``recompute_segments`` (every how many cuts a checkpoint is
            kept), ``swapin_ahead`` (triggers, at most :data:`RERUN_AHEAD`),
            ``min_tensor_bytes`` (smaller tensors are kept).
        target: the device that times the clones.
        taken: ops other groups already re-run.

    Returns:
        The groups, in forward order.
    """
    if not config.recompute_segments:
        return ()
    levels = nx.get_node_attributes(view, "level")
    turn = turn_level(view)
    cuts = forward_cuts(view, turn)
    every = config.recompute_segments
    kept_free = folded_to_constants(view)
    activations = batch_dependent(view)  # the rest (a weight's cast, a mask) is kept
    trigger_ok = trigger_filter(view)
    memo: dict[str, tuple[bool, float]] = {}
    ahead = min(config.swapin_ahead, RERUN_AHEAD)
    rerun_config = config.replace(swapin_ahead=ahead)

    def rerunnable(op: str) -> bool:
        if op not in memo:
            seconds = None
            if not (
                op in taken
                or op not in activations
                or op in kept_free
                or aliases_a_variable(view, op)
                or pinned(view, op, recompute=True)
            ):
                seconds = rerun_seconds(view, op, target.device)
            memo[op] = (seconds is not None, seconds or 0.0)
        return memo[op][0]

    def far(op: str, consumer: str) -> bool:  # a backward reader the re-run can start for
        return levels[consumer] >= turn and levels[consumer] - levels[op] > ahead

    def plan_phase(phase: int) -> tuple[Recompute, ...]:
        checkpoints = set(cuts[phase::every])
        bounds = sorted(levels[op] for op, _ in checkpoints) + [turn]
        return _plan_groups(view, bounds, checkpoints, far, rerunnable, plan_group, config)

    def plan_group(ordered: list[str]) -> Recompute | None:
        return make_group(
            view, ordered, levels, rerun_config, trigger_ok, memo, far=far, per_tensor=True
        )

    # the default phase (every N-th cut, counted from the first) first: it wins ties
    phases = {phase: plan_phase(phase) for phase in (every - 1, *range(every - 1))}
    phase = _cheapest(phases)
    groups = release_waits(view, phases[phase], turn=turn, min_bytes=config.min_tensor_bytes)
    logger.debug(
        "%d cuts before the turn at level %d, checkpoints every %d from cut %d, "
        "%d segment groups (%.3g s re-run; phases: %s)",
        len(cuts),
        turn,
        every,
        phase,
        len(groups),
        sum(g.seconds for g in groups),
        {k: round(sum(g.seconds for g in v), 6) for k, v in phases.items()},
    )
    return groups


PHASE_BYTES = 0.95
"""A phase of the checkpoints that re-runs less compute is taken only if its groups
free at least this fraction of the bytes that the most freeing phase does."""

PHASE_SAVING = 0.05
"""... and only if it re-runs at least this fraction less predicted compute than the
default phase (a smaller difference is within the time model's error)."""


def _cheapest(phases: dict[int, tuple[Recompute, ...]]) -> int:
    """The phase whose groups re-run the least predicted compute, at about the most bytes freed.

    Every N-th cut can be counted from any of the first N: on a transformer
    with two cuts per block, one phase keeps the residual stream after each
    block, the other after each attention; the first re-runs the attention's
    output projection to rebuild the mid-block stream, the second the MLP's
    down projection (four times the multiply-adds). The memory they free is
    about the same; the compute is not. The default phase (the first key of
    ``phases``) stays unless another is materially cheaper
    (:data:`PHASE_SAVING`) or frees clearly more (:data:`PHASE_BYTES`).

    >>> from types import SimpleNamespace as G
    >>> _cheapest({1: (G(seconds=5.0, bytes=100),), 0: (G(seconds=3.0, bytes=99),)})
    0
    >>> _cheapest({1: (G(seconds=5.0, bytes=100),), 0: (G(seconds=3.0, bytes=50),)})
    1
    >>> _cheapest({1: (G(seconds=5.0, bytes=100),), 0: (G(seconds=4.9, bytes=100),)})
    1
    """
    seconds = {phase: sum(g.seconds for g in groups) for phase, groups in phases.items()}
    freed = {phase: sum(g.bytes for g in groups) for phase, groups in phases.items()}
    most = max(freed.values(), default=0)
    near = [phase for phase in phases if freed[phase] >= PHASE_BYTES * most]
    best = min(near, key=seconds.__getitem__)
    default = next(iter(phases))
    if default in near and seconds[best] > (1 - PHASE_SAVING) * seconds[default]:
        return default
    return best


def _plan_groups(view, bounds, checkpoints, far, rerunnable, plan_group, config):
    """One group per segment between ``bounds`` (the checkpoints' levels, then the turn)."""
    levels = nx.get_node_attributes(view, "level")
    turn = bounds[-1]
    groups = []
    lo = -1
    for hi in bounds:
        targets = [
            op
            for op in view
            if lo < levels[op] <= hi
            and levels[op] < turn
            and rerunnable(op)
            and any(
                info.bytes >= max(config.min_tensor_bytes, 1)
                and (op, info.index) not in checkpoints
                and any(far(op, c) for c, _ in tensor_consumers(view, op, info.index))
                for info in view.nodes[op]["outputs"]
            )
        ]
        group = _grow(view, targets, lo, checkpoints, rerunnable, config)
        lo = hi
        if not group or len(group) > MAX_SEGMENT_OPS:
            continue
        entry = plan_group(sorted(group, key=lambda op: (levels[op], op)))
        if entry is not None:
            groups.append(entry)
    return tuple(groups)


def _grow(view, targets, lo, checkpoints, rerunnable, config) -> set[str]:
    """The ops re-run for ``targets``: back through inputs to what is kept (see the module doc)."""
    levels = view.nodes
    group: set[str] = set()
    todo = list(targets)
    while todo:
        op = todo.pop()
        if op in group:
            continue
        group.add(op)
        for src, k in data_inputs(view, op):
            info = view.nodes[src]["outputs"][k]
            if (
                (src, k) in checkpoints
                or src in group
                or levels[src]["level"] <= lo  # another segment's: kept for its forward readers
                or info.bytes < config.min_tensor_bytes
                or not rerunnable(src)
            ):
                continue
            todo.append(src)
    return group
