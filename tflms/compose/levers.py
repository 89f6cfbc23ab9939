"""``tflms.make_plan``: one plan from the three levers - recompute, swap, order.

The levers are planned in the order they are applied, each on the graph the
earlier ones produce:

1. recomputation (:func:`~tflms.plan.recompute.plan_recomputes`), if
   ``LMSConfig.recompute``: cheap ops re-run before their far consumers;
2. swaps (:func:`~tflms.plan.planner.plan_swaps`) on the view rewritten by
   the recomputations, so a tensor a clone reads may be swapped for it;
3. order edges (:func:`~tflms.compose.ordering.order_edges`), if
   ``LMSConfig.reorder``, chosen by simulating the view rewritten by both.

With ``LMSConfig.memory_budget`` use :func:`tflms.autotune`, which searches
these options for the cheapest plan that fits.

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
    >>> [s.tensor for s in tflms.make_plan(view, config).swaps]
    ['h:0']
    >>> plan = tflms.make_plan(view, config.replace(recompute=True))
    >>> [r.ops for r in plan.recomputes], plan.swaps  # x is at hand: re-run x * 2 and the ReLU
    ([('mul', 'h')], ())
"""

from __future__ import annotations

import dataclasses
import logging

import networkx as nx

from tflms.apply.core import apply_to_view
from tflms.config import LMSConfig
from tflms.cost.target import Target
from tflms.plan.planner import plan_swaps
from tflms.plan.recompute import plan_recomputes
from tflms.plan.swap_plan import SwapPlan
from tflms.utils.units import format_bytes

__all__ = ["make_plan"]

logger = logging.getLogger(__name__)


_SWAPS_ONLY = dict(swapin_groupby=0, n_tensors=None, sync_mode=0, serialization=(), reorder=False)
"""Options the recomputations do not read: plans that differ only in them share their groups."""


def make_plan(
    view: nx.DiGraph,
    config: LMSConfig | None = None,
    *,
    memo: dict | None = None,
    target: Target | None = None,
) -> SwapPlan:
    """Plan recomputations, swaps and order edges for ``view`` under ``config``.

    Args:
        view: the analysis view of a graph (from :func:`tflms.build_view`).
        config: planner options; defaults to ``LMSConfig()`` (swaps only).
        memo: a dict kept between calls on the same ``view`` (the
            auto-tuner's): the recomputation groups and the view they
            rewrite, reused by options that differ only in what the groups
            do not depend on. None: nothing is kept.
        target: the device the recomputations are timed on and the link
            ordering simulates; default the config's own
            (``memory_budget``'s preset, else
            :data:`~tflms.cost.target.DEFAULT_DEVICE`, over ``config.link``), so
            that a config always reproduces its plan.

    Returns:
        The :class:`~tflms.SwapPlan`; possibly empty, in which case
        ``plan.skipped`` and ``plan.notes`` say why.
    """
    config = config or LMSConfig()
    if target is None:  # the stack and accounting are not read: tensor_factor is left out
        target = Target.for_budget(config.memory_budget, link=config.link)
    device = target.device
    key = config.replace(**_SWAPS_ONLY) if config.recompute else None
    if memo is not None and key in memo:
        recomputes, staged = memo[key]
    else:
        recomputes = plan_recomputes(view, config, target=target) if config.recompute else ()
        staged = (
            apply_to_view(view, SwapPlan(recomputes=recomputes, config=config))
            if recomputes
            else view
        )
        if memo is not None and key is not None:
            memo[key] = (recomputes, staged)
    plan = plan_swaps(staged, config)
    notes = list(plan.notes)
    if recomputes:
        notes.append(
            f"{len(recomputes)} groups recomputed ({format_bytes(sum(r.bytes for r in recomputes))} "
            f"not kept, {sum(r.seconds for r in recomputes) * 1e3:.2f} ms predicted on {device.name})"
        )
    plan = dataclasses.replace(plan, recomputes=recomputes, notes=tuple(notes))
    if config.reorder:
        plan = with_order(view, plan, device=device, link=target.link)
    return plan


def with_order(view: nx.DiGraph, plan: SwapPlan, *, device, link, **options) -> SwapPlan:
    """``plan`` with the order edges the simulator finds for the graph it rewrites.

    Args:
        view: the analysis view ``plan`` was made for (without tflms ops).
        plan: a plan without order edges.
        device: device preset (or model) for the simulation.
        link: link preset (or model) for the simulation.
        **options: passed to :func:`~tflms.compose.ordering.order_edges`.

    Returns:
        The plan with :attr:`~tflms.SwapPlan.order` set (unchanged when no
        order lowers the peak).
    """
    from tflms.compose.ordering import order_edges  # the simulator: only when ordering

    base = dataclasses.replace(plan, order=())
    rewritten = apply_to_view(view, base) if not base.empty else view
    found = order_edges(rewritten, device=device, link=link, **options)
    if not found.edges:
        return base
    note = (
        f"{len(found.edges)} order edges: simulated peak {format_bytes(found.peak_before)} -> "
        f"{format_bytes(found.peak_after)} ({getattr(device, 'name', device)}, "
        f"{getattr(link, 'name', link)})"
    )
    return dataclasses.replace(base, order=found.edges, notes=(*base.notes, note))
