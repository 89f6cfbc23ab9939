"""Triggers: group a tensor's far consumers and choose what starts each swap-in.

Far consumers within ``swapin_groupby`` levels of a group's first consumer
(and on the same device) share one swap-in (:func:`group_consumers`). A
swap-in's *trigger* is an ancestor of the group's earliest consumer about
``swapin_ahead`` levels before it, on the compute device and outside control
flow (:func:`find_trigger`). It is found by walking back along the
consumer's deepest inputs (every op at level L has an input at level L-1), so
the search costs O(``swapin_ahead``) and the trigger is a true ancestor:
every inserted edge goes from a lower level to a higher one and the
rewritten graph stays acyclic. Without a trigger the swap-in waits for the
consumer's other inputs (a synchronous fallback, recorded in the plan).

Example:
    >>> import networkx as nx
    >>> v = nx.DiGraph()
    >>> v.add_nodes_from(["a", "b"], device="")
    >>> group_consumers([("a", 0), ("b", 1)], {"a": 10, "b": 30}, v, groupby=5)
    [[('a', 0)], [('b', 1)]]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import networkx as nx

from tflms.config import LMSConfig
from tflms.graph.grappler_rules import PINNED, absent_from_the_run, in_a_fold
from tflms.plan.swap_plan import Swap, SwapIn

__all__ = [
    "group_consumers",
    "plan_swap_in",
    "swap_for_groups",
    "find_trigger",
    "other_inputs",
    "trigger_filter",
]


def trigger_filter(view: nx.DiGraph) -> Callable[[str], bool]:
    """A predicate: may this op trigger a swap-in (compute device, no control flow, not tflms)?

    Args:
        view: The analysis view whose node attributes the predicate reads.

    Returns:
        A function of an op name that is True for ops placed on the compute
        device, outside control flow, not inserted by tflms, not a variable's
        initializer (:mod:`tflms.graph.initializers`), not removed by
        Grappler before the step runs and not inside an arithmetic chain Grappler
        folds (a control fanout would stop the fold). Its answers are kept
        for the view while its node and edge counts stay the same, as
        :func:`~tflms.utils.memo.per_view` keeps whole-view answers.
    """

    # len(edges): number_of_edges sums degrees; pins (grappler_rules.PINNED) change answers too
    size = (view.number_of_nodes(), len(view.edges), view.graph.get(PINNED, frozenset()))
    cached = _TRIGGERS.get(view)
    answers: dict[str, bool] = cached[1] if cached is not None and cached[0] == size else {}
    _TRIGGERS[view] = (size, answers)  # planning the view again (the auto-tuner) reuses them

    def ok(name: str) -> bool:
        if name not in answers:
            node = view.nodes[name]
            answers[name] = (
                node["placement"] == "compute"
                and not node["control_flow"]
                and not node["tflms"]
                and not absent_from_the_run(view, name)  # an edge out of it would keep it
                and not in_a_fold(view, name)  # ... or stop Grappler folding its chain
            )
        return answers[name]

    return ok


_TRIGGERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # view -> (size, answers)


def group_consumers(far, levels, view: nx.DiGraph, groupby: int) -> list[list[tuple[str, int]]]:
    """Split far consumers (sorted by level) into swap-in groups.

    Args:
        far: ``(consumer, input index)`` pairs sorted by level.
        levels: op levels of the view.
        view: the analysis view (for devices).
        groupby: consumers within this many levels of a group's first share it.

    Returns:
        The groups, in order of their first consumer.
    """
    groups: list[list[tuple[str, int]]] = []
    for c, i in far:
        device = view.nodes[c]["device"]
        for group in groups:
            first = group[0][0]
            if view.nodes[first]["device"] == device and levels[c] - levels[first] <= groupby:
                group.append((c, i))
                break
        else:
            groups.append([(c, i)])
    return groups


def plan_swap_in(
    view: nx.DiGraph,
    producer: str,
    lp: int,
    group,
    levels,
    config: LMSConfig,
    trigger_ok: Callable[[str], bool],
) -> tuple[SwapIn | None, str | None]:
    """The swap-in of one consumer group: ``(swap_in, None)`` or ``(None, reason)``.

    Args:
        view: the analysis view.
        producer: the op producing the swapped tensor; ``lp`` its level.
        lp: the producer's level.
        group: the group's ``(consumer, input index)`` pairs, earliest first.
        levels: op levels of the view.
        config: ``swapin_ahead`` and ``sync_mode``.
        trigger_ok: which ops may trigger (see :func:`trigger_filter`).

    Returns:
        The :class:`~tflms.plan.swap_plan.SwapIn`, or why none is possible.
    """
    earliest = group[0][0]
    lc = levels[earliest]
    consumers = tuple(group)
    waits: tuple[str, ...] = ()
    if config.sync_mode in (2, 3):
        waits = other_inputs(view, earliest, producer)
        if not waits:
            return None, "sync mode 2: the consumer has no other input to wait for"
        return SwapIn(consumers=consumers, control_inputs=waits, consumer_level=lc), None

    trigger = find_trigger(view, earliest, lc - config.swapin_ahead, lp, levels, trigger_ok)
    if trigger is not None:
        return (
            SwapIn(
                consumers=consumers,
                trigger=trigger,
                trigger_level=levels[trigger],
                consumer_level=lc,
            ),
            None,
        )
    waits = other_inputs(view, earliest, producer)
    if not waits:
        return None, "no swap-in trigger and the consumer has no other input to wait for"
    reason = (
        f"no op on the compute device between level {lp} and {lc} precedes {earliest}; "
        "the swap-in waits for the consumer's other inputs"
    )
    return SwapIn(
        consumers=consumers, control_inputs=waits, consumer_level=lc, fallback=reason
    ), None


def swap_for_groups(
    view: nx.DiGraph,
    producer: str,
    info,
    groups,
    levels,
    config: LMSConfig,
    trigger_ok: Callable[[str], bool],
    *,
    streamed: bool = False,
) -> tuple[Swap | None, str | None]:
    """The swap of tensor ``info`` of ``producer`` with one swap-in per consumer group.

    Args:
        view: the analysis view.
        producer: the op producing the tensor.
        info: the tensor's :class:`~tflms.graph.view.TensorInfo`.
        groups: the consumer groups (:func:`group_consumers`).
        levels: op levels of the view.
        config: as for :func:`plan_swap_in`.
        trigger_ok: which ops may trigger.
        streamed: the tensor lives on the host (:mod:`tflms.plan.streams`).

    Returns:
        ``(swap, None)``, or ``(None, reason)`` when a group has no swap-in.
    """
    lp = levels[producer]
    swap_ins = []
    for group in groups:
        swap_in, reason = plan_swap_in(view, producer, lp, group, levels, config, trigger_ok)
        if swap_in is None:
            return None, reason
        swap_ins.append(swap_in)
    swap = Swap(
        tensor=info.name,
        producer=producer,
        index=info.index,
        bytes=info.bytes,
        dtype=info.dtype,
        producer_level=lp,
        device=view.nodes[producer]["device"],
        swap_ins=tuple(swap_ins),
        streamed=streamed,
    )
    return swap, None


def find_trigger(
    view: nx.DiGraph, consumer: str, target: int, floor: int, levels, ok
) -> str | None:
    """An eligible ancestor of ``consumer`` at a level in ``(floor, level(consumer))``.

    Walks back along the deepest input of each op, so each step lowers the
    level by exactly one. Prefers the first eligible op at or below
    ``target``; failing that, the eligible op above ``target`` closest to it.

    Args:
        view: The analysis view.
        consumer: The op that reads the swapped tensor.
        target: The level the swap-in should ideally start at (lower is
            earlier).
        floor: Level of the producer; triggers must lie strictly above it.
        levels: Mapping of op name to level (the topological generation).
        ok: Predicate of an op name; only ops it accepts may trigger (see
            :func:`trigger_filter`).

    Returns:
        The trigger op, or None when no eligible op lies between ``floor`` and
        the consumer on that path.
    """
    chain = []
    node = consumer
    while True:
        preds = view.pred[node]
        if not preds:
            break
        node = max(preds, key=lambda p: (levels[p], p))
        if levels[node] <= floor:
            break
        chain.append(node)
        if levels[node] <= target and ok(node):
            return node
    above = [n for n in chain if levels[n] > target and ok(n)]
    return above[-1] if above else None


def other_inputs(view: nx.DiGraph, consumer: str, producer: str) -> tuple[str, ...]:
    """Ops other than ``producer`` (and tflms ops) that feed data into ``consumer``, sorted.

    Args:
        view: The analysis view.
        consumer: The op whose data inputs are read.
        producer: The op to leave out (the producer of the swapped tensor).

    Returns:
        The names, sorted; control-only predecessors are left out, and so are
        ops inside a chain Grappler folds (a wait edge out of one would change
        the fold, see :func:`~tflms.graph.grappler_rules.in_a_fold`).
    """
    return tuple(
        sorted(
            p
            for p, edge in view.pred[consumer].items()
            if p != producer
            and edge.get("tensors")
            and not view.nodes[p]["tflms"]
            and not in_a_fold(view, p)
        )
    )
