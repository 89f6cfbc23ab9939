"""The lever composition: one plan from recomputation, swaps, retiming and order.

The levers are planned in the order they are applied, each on the graph the
earlier ones produce:

1. recomputation, if ``LMSConfig.recompute``: segments of the forward pass
   re-run from checkpoints (:func:`~tflms.plan.segments.plan_segments`, with
   ``recompute_segments``), then cheap ops re-run before their far consumers
   (:func:`~tflms.plan.recompute.plan_recomputes`);
2. swaps (:func:`~tflms.plan.planner.plan_swaps`) on the view rewritten by
   the recomputations, so a tensor a clone reads may be swapped for it;
3. swap-in triggers by simulated time
   (:func:`~tflms.compose.retime.retime_triggers`), when a ``retime``
   slack is given (the auto-tuner's lever; not an ``LMSConfig`` field);
4. order edges (:func:`~tflms.compose.ordering.order_edges`), if
   ``LMSConfig.reorder``, chosen by simulating the view rewritten by all of
   the above under the target's accounting.

:func:`compose_plan` is that composition, and the only one: ``tflms.make_plan``
(:mod:`tflms.pipeline`) calls it for one setting, the auto-tuner's search
(:mod:`tflms.tuning.search`) for each setting it tries, with a
:class:`Levers` memo that shares what settings have in common. The
:class:`~tflms.cost.target.Target` is an argument, never a default: the
front end resolves it once.

Example:
    >>> import tensorflow as tf, tflms
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [64, 1024], name="x")
    ...     h = tf.nn.relu(x * 2.0, name="h")
    ...     y = tf.matmul(h, tf.ones([1024, 1024]))
    ...     for i in range(12):
    ...         y = tf.nn.relu(y * 1.01, name=f"act{i}")
    ...     out = tf.multiply(y, h, name="out")  # h lives long
    >>> view = tflms.build_view(g)
    >>> config = tflms.LMSConfig(swapout_threshold=10, swapin_ahead=4, min_tensor_bytes=0)
    >>> [s.tensor for s in compose_plan(view, config, config.target()).swaps]
    ['h:0']
    >>> config = config.replace(recompute=True)
    >>> plan = compose_plan(view, config, config.target())
    >>> [r.ops for r in plan.recomputes], plan.swaps  # x is at hand: re-run x * 2 and the ReLU
    ([('mul', 'h')], ())
"""

from __future__ import annotations

import dataclasses
import logging

import networkx as nx

from tflms.apply.core import apply_to_view
from tflms.config import LMSConfig
from tflms.cost.ops import updates_a_variable
from tflms.cost.target import Target
from tflms.plan.entries import Recompute
from tflms.plan.planner import plan_swaps
from tflms.plan.recompute import plan_recomputes
from tflms.plan.segments import plan_segments
from tflms.plan.streams import plan_host_casts, plan_stream_clones
from tflms.plan.swap_plan import SwapPlan
from tflms.plan.updates import update_waits
from tflms.utils.units import format_bytes

__all__ = ["Levers", "compose_plan"]

logger = logging.getLogger(__name__)


_SWAPS_ONLY = dict(swapin_groupby=0, n_tensors=None, sync_mode=0, serialization=(), reorder=False)
"""Options the recomputations do not read: plans that differ only in them share their groups."""


class Levers:
    """What the plans of one view and one target share, kept between :func:`compose_plan` calls.

    The auto-tuner plans dozens of settings of one view: the recomputation
    groups (and the view they rewrite) are shared by settings that differ
    only in swap options, the unordered plan by its retimed and ordered
    variants, the op times and the timed plain schedule by every retiming
    and ordering. Plans are immutable, so sharing them changes no result
    (``tests/tflms/test_autotune_reuse.py``).

    Args:
        view: the analysis view every plan is made for.
        target: the target every plan is made for.
        costs: op times shared with the simulator's compilations of the
            same view and device (``compile_view``'s memo); None: a new one.
    """

    def __init__(self, view: nx.DiGraph, target: Target, costs: dict | None = None):
        self.view, self.target = view, target
        self.costs: dict = {} if costs is None else costs
        self.staged: dict = {}  # recomputations and the view they rewrite, by _SWAPS_ONLY key
        self.unordered: dict[LMSConfig, SwapPlan] = {}  # plans before retiming and ordering
        self.timed: tuple | None = None  # the plain view compiled and scheduled, for retiming

    def recomputed(self, config: LMSConfig):
        """``(recompute groups, the view they rewrite)`` for ``config``."""
        if not (config.recompute or config.offload_weights):
            return (), self.view
        key = config.replace(**_SWAPS_ONLY)
        if key not in self.staged:
            recomputes: tuple[Recompute, ...] = ()
            if config.recompute:
                recomputes = plan_segments(self.view, config, self.target)
                segments = frozenset(op for r in recomputes for op in r.ops)
                recomputes += plan_recomputes(self.view, config, self.target, taken=segments)
            if config.offload_weights:
                # a weight's cast to float16 on the host, then its views re-run from a copy
                recomputes += plan_host_casts(self.view, config)
                cast = apply_to_view(self.view, SwapPlan(recomputes=recomputes, config=config))
                taken = {op for r in recomputes for op in r.ops}
                recomputes += plan_stream_clones(cast, config, self.target, taken)
            staged = (
                apply_to_view(self.view, SwapPlan(recomputes=recomputes, config=config))
                if recomputes
                else self.view
            )
            self.staged[key] = (recomputes, staged)
        return self.staged[key]

    def swapped(self, config: LMSConfig) -> SwapPlan:
        """Recomputations and swaps for ``config`` (``reorder`` not read)."""
        config = config.replace(reorder=False)
        if config not in self.unordered:
            recomputes, staged = self.recomputed(config)
            plan = dataclasses.replace(plan_swaps(staged, config), recomputes=recomputes)
            notes = list(plan.notes)
            if recomputes:
                notes.append(
                    f"{len(recomputes)} groups recomputed "
                    f"({format_bytes(sum(r.bytes for r in recomputes))} not kept, "
                    f"{sum(r.seconds for r in recomputes) * 1e3:.2f} ms predicted on "
                    f"{self.target.device.name})"
                )
            waits = update_waits(self.view, plan.waited_for())
            if waits:
                notes.append(
                    f"{len(waits)} update waits: {_updates(self.view, waits)} variable updates "
                    "wait for the backward matmuls that read their variables, and write them in "
                    "place"
                )
            self.unordered[config] = dataclasses.replace(plan, order=waits, notes=tuple(notes))
        return self.unordered[config]

    def retimed(self, plan: SwapPlan, slack: float) -> SwapPlan:
        """``plan`` with its swap-ins triggered by simulated time (``slack``)."""
        from tflms.compose.retime import retime_triggers  # the simulator: only when retiming
        from tflms.simulation.schedule import compile_view, first_ready

        if not plan.swaps:
            return plan
        if self.timed is None:
            compiled = compile_view(self.view, device=self.target.device, link=self.target.link)
            self.timed = (compiled, first_ready(compiled))
        retimed = retime_triggers(self.view, plan, self.target, slack=slack, timed=self.timed)
        waits = update_waits(self.view, retimed.waited_for())  # new triggers
        return retimed if waits == retimed.order else dataclasses.replace(retimed, order=waits)

    def ordered(self, plan: SwapPlan) -> SwapPlan:
        """``plan`` with the order edges the simulator finds for the graph it rewrites."""
        from tflms.compose.ordering import order_edges  # the simulator: only when ordering

        base = plan  # its order edges, the update waits, stay: the found ones add to them
        rewritten = apply_to_view(self.view, base) if not base.empty else self.view
        found = order_edges(rewritten, self.target, costs=self.costs)
        if not found.edges:
            return base
        note = (
            f"{len(found.edges)} order edges: simulated peak {format_bytes(found.peak_before)} -> "
            f"{format_bytes(found.peak_after)} ({self.target.device.name}, {self.target.link.name})"
        )
        return dataclasses.replace(
            base, order=(*base.order, *found.edges), notes=(*base.notes, note)
        )


def compose_plan(
    view: nx.DiGraph,
    config: LMSConfig,
    target: Target,
    *,
    retime: float | None = None,
    levers: Levers | None = None,
    order_plain: bool = True,
) -> SwapPlan:
    """Plan recomputations, swaps, retimed triggers and order edges for ``view``.

    Args:
        view: the analysis view of a graph (from :func:`tflms.build_view`).
        config: the planner options.
        target: the device the recomputations and orders are timed on, the
            link copies are timed over, the accounting orders are judged by.
        retime: the ``slack`` of simulated-time swap-in triggers
            (:func:`~tflms.compose.retime.retime_triggers`); None keeps the
            planner's level-based triggers.
        levers: the memo of earlier calls on the same ``view`` and
            ``target`` (the auto-tuner's); None: nothing is shared.
        order_plain: with ``reorder``, order the graph even when nothing
            is swapped or recomputed (a plan of order edges alone); the
            auto-tuner passes False: it only orders plans that rewrite the
            step, and judges the plain step by its baseline.

    Returns:
        The :class:`~tflms.SwapPlan`; possibly empty, in which case
        ``plan.skipped`` and ``plan.notes`` say why.
    """
    if levers is None:
        levers = Levers(view, target)
    elif levers.view is not view or levers.target != target:
        raise ValueError("compose_plan: the levers memo was made for another view or target")
    plan = levers.swapped(config)
    if retime is not None:
        plan = levers.retimed(plan, retime)
    if config.reorder and (order_plain or not plan.empty):  # last: edges depend on triggers
        plan = levers.ordered(plan)
    return dataclasses.replace(plan, config=config)  # shared plans: the setting asked for


def _updates(view: nx.DiGraph, waits) -> int:
    """How many variable updates ``waits`` hold back (their own reads aside)."""
    return len({b for _, b in waits if updates_a_variable(view.nodes[b]["type"])})
