"""Swap-in triggers chosen by simulated time instead of by level distance.

The planner triggers a swap-in ``swapin_ahead`` *levels* before its consumer.
Levels are a poor clock: a few levels of a ResNet's backward pass last tens
of microseconds, while bringing back a 1 GiB activation over PCIe3 takes
90 ms, so the consumer stalls. :func:`retime_triggers` rewrites a plan so
that each copy back is started by the op that ends just in time for the copy
to finish when its consumer starts - as late as possible (to keep memory
low), as early as needed (to hide the copy):

1. time every op of the graph without swaps (FirstReady schedule, roofline
   times of :mod:`tflms.simulation.schedule`);
2. walk the swap-ins from the last consumer to the first, packing their
   copies back to back on the host-to-device stream, each finishing by its
   consumer's start (``slack`` stretches each copy's lead time);
3. trigger each swap-in by the last op that may trigger (the planner's
   :func:`~tflms.plan.triggers.trigger_filter`: no op of a Grappler fold) and ends before its
   copy must start and sits at a lower level than the consumer - so every
   inserted edge still goes up in level and the graph stays acyclic. A
   consumer that is a recomputed clone counts as the ops reading the clones
   (levels of ``view``: the plan's own consumer level counts the view with
   the clones, where the backward pass is deeper), and a clone read by
   another group's clone or gate (streamed weights with recomputation) as
   that group's readers, recursively.

It is a plan-to-plan transform: the result is an ordinary
:class:`~tflms.plan.swap_plan.SwapPlan`, applied and validated like any other.

Example:
    >>> from tflms.cost.target import Target
    >>> from tflms.plan.swap_plan import SwapPlan
    >>> retime_triggers(None, SwapPlan(), Target.for_device("V100-16GB", "pcie3")).swaps
    ()
"""

from __future__ import annotations

import bisect
import dataclasses
import logging

import networkx as nx

from tflms.cost.target import Target
from tflms.plan.swap_plan import SwapPlan
from tflms.plan.triggers import trigger_filter
from tflms.simulation.schedule import compile_view, first_ready

__all__ = ["retime_triggers"]

logger = logging.getLogger(__name__)


def retime_triggers(
    view: nx.DiGraph | None,
    plan: SwapPlan,
    target: Target,
    *,
    slack: float = 1.0,
    timed: tuple | None = None,
) -> SwapPlan:
    """Re-trigger the swap-ins of ``plan`` by simulated time (see the module docstring).

    Args:
        view: the analysis view ``plan`` was made from (without swap ops).
        plan: the plan to retime; swap-ins without a trigger (synchronous
            ones, sync modes 2 and 3) are kept as they are.
        target: its device times the ops, its link the copies.
        slack: each copy is started this many copy-times before it must end
            (1.0: just in time on an otherwise idle stream).
        timed: ``(compile_view(view, ...), first_ready(...))`` computed
            before, to reuse across calls on the same view and target.

    Returns:
        A new plan with the same swaps and retimed triggers.
    """
    if not plan.swaps:
        return plan
    assert view is not None  # only a plan without swaps may come without its view
    link = target.link
    if timed is None:
        graph = compile_view(view, device=target.device, link=link)
        timed = (graph, first_ready(graph))
    graph, schedule = timed
    index = {name: i for i, name in enumerate(graph.names)}
    levels = nx.get_node_attributes(view, "level")
    trigger_ok = trigger_filter(view)  # the planner's rule: no fold member, nothing Grappler drops
    eligible = sorted(
        (schedule.end[i], i)
        for i, name in enumerate(graph.names)
        if graph.lanes[i] == "compute" and trigger_ok(name)
    )
    ends = [t for t, _ in eligible]

    clone_due, clone_level = _clone_times(plan, schedule, index, levels)
    entries = []
    for s, swap in enumerate(plan.swaps):
        for k, swap_in in enumerate(swap.swap_ins):
            if swap_in.trigger is None:
                continue
            due = min(
                clone_due[c] if c in clone_due else schedule.start[index[c]]
                for c, _ in swap_in.consumers
            )
            # the trigger sits below every consumer in the view's levels: never downstream
            # of one (a plan's consumer_level may count levels of the view with the clones)
            below = min(
                clone_level[c] if c in clone_level else levels.get(c, swap_in.consumer_level)
                for c, _ in swap_in.consumers
            )
            entries.append((due, s, k, link.seconds(swap.bytes), below))
    entries.sort(reverse=True)

    chosen: dict[tuple[int, int], str] = {}
    stream_free_after = float("inf")  # the copy stream is busy from here on
    for due, s, k, copy, below in entries:
        finish = min(due, stream_free_after)
        stream_free_after = finish - copy
        start = finish - slack * copy
        consumer_level = min(plan.swaps[s].swap_ins[k].consumer_level, below)
        pos = bisect.bisect_right(ends, start) - 1
        while pos >= 0 and levels[graph.names[eligible[pos][1]]] >= consumer_level:
            pos -= 1
        if pos >= 0:
            chosen[(s, k)] = graph.names[eligible[pos][1]]

    swaps = []
    moved = 0
    for s, swap in enumerate(plan.swaps):
        swap_ins = []
        for k, swap_in in enumerate(swap.swap_ins):
            trigger = chosen.get((s, k))
            if trigger is None or trigger == swap_in.trigger:
                swap_ins.append(swap_in)
                continue
            moved += 1
            swap_ins.append(
                dataclasses.replace(swap_in, trigger=trigger, trigger_level=levels[trigger])
            )
        swaps.append(dataclasses.replace(swap, swap_ins=tuple(swap_ins)))
    logger.debug("retimed %d of %d swap-in triggers (slack %.2f)", moved, len(entries), slack)
    return dataclasses.replace(
        plan,
        swaps=tuple(swaps),
        notes=(
            *plan.notes,
            f"swap-in triggers chosen by simulated time ({link.name}, slack {slack:g})",
        ),
    )


def _clone_times(plan: SwapPlan, schedule, index: dict, levels: dict) -> tuple[dict, dict]:
    """When each recompute clone (and gate) is due, and the view level it sits below.

    A clone reading a swap-in is due when the clone's own consumers start,
    less the clones' compute time (which the copy must precede); its level
    is that of the ops reading it. A consumer may itself be another group's
    clone (chained groups: a weight's host cast read by its streamed views,
    a segment read by a cheap op's clone): it counts by its own group's due
    time and level, resolved recursively.

    Returns:
        ``(due time by inserted op, view level by inserted op)``.
    """
    group_of = {op: r for r in plan.recomputes for op in r.inserted}
    due: dict = {}
    level: dict = {}

    def resolve(r) -> None:
        first = r.inserted[0]
        if first in due:
            return
        due[first] = None  # in progress: a cycle counts the consumer by its schedule
        starts, readers = [], []
        for c, _, _, _ in r.consumers:
            other = group_of.get(c)
            if other is not None and other is not r:
                resolve(other)
                head = other.inserted[0]
                if due.get(head) is not None:
                    starts.append(due[head])
                    readers.append(level[head])
                    continue
            if c in index:
                starts.append(schedule.start[index[c]])
            if c in levels:
                readers.append(levels[c])
        start = min(starts, default=0.0) - r.seconds
        low = min(readers, default=r.consumer_level)
        due.update(dict.fromkeys(r.inserted, start))  # gates: as their clones
        level.update(dict.fromkeys(r.inserted, low))

    for r in plan.recomputes:
        resolve(r)
    return due, level
