"""``tflms.autotune``: the swap plan that fits a memory budget at the least cost.

Given a training step and a device memory budget, the auto-tuner simulates
(:func:`tflms.simulate`) the step without swaps and, if it does not fit,
searches the planner's options for the plan whose predicted peak fits and
whose predicted step time is lowest:

1. ``swapout_threshold`` over a ladder scaled to the graph depth (large
   thresholds swap only the longest-lived tensors), bisected for the first
   rung that fits and the two after it (every rung when none fits);
2. ``swapin_ahead`` for the three most promising thresholds, walking the
   leads from the default while the plans get better, then
   ``swapin_groupby`` around the best pair;
3. swap-in triggers chosen by simulated time rather than level distance
   (:func:`tflms.compose.retime.retime_triggers`), with a few slacks;
4. ``recompute=True`` on the most promising settings: cheap activations
   re-run instead of kept or swapped (their compute time is charged), and
   over a finite link ``recompute_dense`` 0.05 / 0.1 / 0.25 on the best of
   those: convolutions re-run where their copies cannot be hidden;
5. ``reorder=True`` on the best plans so far: control edges that stop
   sibling branches from piling up at the peak (no time cost when the
   simulator finds no slowdown);
6. only if nothing fits yet: ``sync_mode`` 1-3, ``serialization`` of the
   levels around the peak, ``min_tensor_bytes=0``, and last the most
   memory-saving plans (every candidate swapped from the lowest thresholds
   with the latest swap-ins, with and without recomputation, the two lowest
   of them also ordered: neither lever always lowers the peak); if still
   nothing fits, a descent from the lowest plans (one lever moved at a
   time: half the swaps, order, recomputation, dense ratios, small
   tensors, asynchronous copies, the swap-in lead; a few rounds while the
   plans get better), then the same from the lowest plans composed as for
   each slower preset link (their order edges and dense recomputations
   assume slower copies and keep less resident), simulated over the given
   link;
7. ``n_tensors``: the fewest (largest-first) swaps that still fit - less
   traffic, less overhead - for the best plan, the best plan that re-runs
   dense ops and the best that does not (one swap first, then a bisection).

Among the plans that fit, the one with the lowest predicted step time wins.

A plan *fits* when its predicted device peak is at most the budget minus the
safety margin (``LMSConfig.safety_margin``), which is kept for what static
sizes miss (workspaces, fragmentation) - over the given link *and* with
instantaneous copies, so that no fit depends on a slow link holding swap-ins
back. If the plain step fits, the answer is
"LMS not needed" and an empty plan; if no plan fits,
:class:`~tflms.errors.PlanInfeasibleError` reports the smallest peak found.

Example:
    >>> import tensorflow as tf, tflms
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     h = x = tf.compat.v1.placeholder(tf.float32, [256, 1024], name="x")
    ...     keep = []
    ...     for i in range(12):
    ...         h = tf.nn.relu(h * 1.5, name=f"act{i}")
    ...         keep.append(h)
    ...     for i, k in enumerate(reversed(keep)):  # (adds would fold: no triggers there)
    ...         h = tf.maximum(h, k, name=f"back{i}")
    >>> view = tflms.build_view(g)
    >>> tflms.autotune(view, "64MiB", safety_margin=0).lms_needed
    False
    >>> tuned = tflms.autotune(view, "12MiB", safety_margin=0)
    >>> tuned.lms_needed, tuned.result.device_peak_bytes <= 12 << 20
    (True, True)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import networkx as nx
import tensorflow as tf

from tflms.config import LMSConfig
from tflms.cost.gpu_memory import SoftwareStack
from tflms.cost.hardware import LINKS, DeviceModel, LinkModel
from tflms.cost.target import Accounting, Target
from tflms.errors import ConfigError, PlanInfeasibleError, UnsupportedGraphError
from tflms.graph.view import build_view, require_batch_size
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.simulator import SimulationResult
from tflms.tuning.search import TUNED_OPTIONS, Candidate, Search
from tflms.utils.gc_pause import gc_frozen
from tflms.utils.units import format_bytes

__all__ = ["autotune", "AutotuneResult", "Candidate", "TUNED_OPTIONS"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutotuneResult:
    """The outcome of :func:`autotune`.

    Attributes:
        lms_needed: ``False`` when the step fits without swapping.
        config: the chosen options (the input config with the searched
            fields replaced); ``tflms.make_plan(view, config)`` makes the
            plan again. Its ``link`` is the link the plan was composed for:
            ``link`` below, or a slower preset when only a plan composed for
            slower copies fits (the search's last resort).
        plan: the chosen plan (no swaps when LMS is not needed).
        result: the simulation of the step with ``plan`` (baseline included).
        baseline: the simulation without swaps.
        budget_bytes: the budget asked for.
        usable_bytes: the budget minus the safety margin: what plans must fit.
        candidates: every plan simulated, in search order.
        device, link: the presets used for time predictions.
        retime: the ``slack`` of :func:`tflms.compose.retime.retime_triggers`
            if the chosen plan's swap-in triggers were chosen by simulated
            time, ``None`` if they are the planner's (level-based) ones.
        target: everything the plans were made for (device, link, budget,
            accounting, stack).
    """

    lms_needed: bool
    config: LMSConfig
    plan: SwapPlan
    result: SimulationResult
    baseline: SimulationResult
    budget_bytes: int
    usable_bytes: int
    candidates: tuple[Candidate, ...]
    device: str
    link: str
    retime: float | None = None
    target: Target | None = None

    @property
    def overhead(self) -> float:
        """Predicted step-time overhead of the chosen plan (0.0 without LMS)."""
        return self.result.overhead if self.lms_needed else 0.0

    def summary(self) -> str:
        """Readable lines: the verdict, the peak before and after, the options."""
        head = (
            f"tflms.autotune {self.result.graph_name or 'graph'}: budget "
            f"{format_bytes(self.budget_bytes)} ({format_bytes(self.usable_bytes)} usable) on "
            f"{self.device} over {self.link}"
        )
        if not self.lms_needed:
            return (
                f"{head}\n  LMS not needed: the step peaks at "
                f"{format_bytes(self.baseline.device_peak_bytes)} without swaps\n"
                + self._state_line()
            )
        options = {k: getattr(self.config, k) for k in TUNED_OPTIONS}
        return "\n".join(
            [
                head,
                f"  peak {format_bytes(self.baseline.device_peak_bytes)} -> "
                f"{format_bytes(self.result.device_peak_bytes)}, {len(self.plan.swaps)} tensors "
                f"swapped ({format_bytes(self.plan.bytes_swapped)} each way), "
                f"{sum(len(r.tensors) for r in self.plan.recomputes)} recomputed, "
                f"{len(self.plan.order)} order edges, predicted overhead "
                f"{self.overhead:+.1%} ({len(self.candidates)} plans simulated)",
                f"  options: {options}"
                + (
                    f", swap-ins retimed by simulation (slack {self.retime:g})"
                    if self.retime
                    else ""
                )
                + (
                    f"; composed as if over {self.config.link} (its recomputations and "
                    f"orders keep less resident), simulated over {self.link}"
                    if self.config.link != self.link
                    and self.config.link in LINKS
                    and self.link in LINKS
                    else ""
                ),
                self._state_line(),
            ]
        )

    def _state_line(self) -> str:
        """Where the model's variables live: the device, the host, and what put them there."""
        moved = [
            what
            for what, on in (
                (
                    "the optimizer's state and update (offload_optimizer)",
                    self.config.offload_optimizer,
                ),
                ("the weights, streamed (offload_weights)", self.config.offload_weights),
            )
            if on
        ]
        return (
            f"  variables: {format_bytes(self.result.variable_bytes)} on the device, "
            f"{format_bytes(self.result.host_variable_bytes)} on the host"
            + (f" ({'; '.join(moved)})" if moved else "")
        )

    def to_dict(self) -> dict:
        """JSON-ready summary (timelines left out)."""
        return {
            "simulated": True,
            "lms_needed": self.lms_needed,
            "budget_bytes": self.budget_bytes,
            "usable_bytes": self.usable_bytes,
            "device": self.device,
            "link": self.link,
            "config": self.config.to_dict(),
            "retime": self.retime,
            "swaps": len(self.plan.swaps),
            "recomputed": sum(len(r.tensors) for r in self.plan.recomputes),
            "order_edges": len(self.plan.order),
            "bytes_swapped": self.plan.bytes_swapped,
            "result": self.result.to_dict(timeline=False),
            "candidates": [asdict(c) for c in self.candidates],
        }


def autotune(
    graph_or_view,
    budget: int | str | DeviceModel | None = None,
    *,
    config: LMSConfig | None = None,
    batch_size: int | None = None,
    device: str | DeviceModel | None = None,
    link: str | LinkModel | None = None,
    safety_margin: float | None = None,
    robust: bool = True,
    accounting: Accounting | None = None,
    stack: str | SoftwareStack | None = None,
    target: Target | None = None,
) -> AutotuneResult:
    """Find the swap plan that fits ``budget`` with the lowest predicted overhead.

    Args:
        graph_or_view: a ``tf.Graph``/``FuncGraph`` or its analysis view.
        budget: bytes, a size such as ``"16GiB"``, or a device preset
            (``"V100-16GB"``); default ``config.memory_budget``.
        config: base options (devices, scope/type filters, ...); the searched
            fields (:data:`TUNED_OPTIONS`) start from its values.
        batch_size: sizes tensors with an unknown batch dimension (graphs
            only; ``config.batch_size`` wins: :data:`tflms.graph.view.BATCH_RULE`).
        device: device model for time predictions; default the budget's
            preset, else :data:`tflms.cost.target.DEFAULT_DEVICE`.
        link: link preset; default ``config.link``.
        safety_margin: fraction of the budget kept free; default
            ``config.safety_margin``.
        robust: a plan fits only if it also fits with instantaneous copies.
            Over a slow link, copies that lag keep swap-ins from being
            allocated early (the consumers stall instead); a plan whose fit
            relied on that would run out of memory on a faster or less busy
            link. Instantaneous copies are also what Grappler assumes.
        accounting: memory conventions plans are judged by (see
            :mod:`tflms.simulation.memory`): ``"realistic"`` (tensors plus what
            a GPU process holds beyond them; the default when the budget names
            a GPU preset such as ``"V100-16GB"``), ``"tensors"`` (the default
            for a budget in bytes or a custom ``DeviceModel``) or ``"grappler"`` (to find plans that Grappler's estimate
            accepts).
        stack: the software stack whose terms ``"realistic"`` counts
            (:data:`tflms.cost.gpu_memory.STACKS`), or a calibrated one
            (:func:`tflms.cost.gpu_memory.calibrated`); default ``"tf2"``.
        target: the device, link, budget, accounting and stack resolved at
            once (:class:`~tflms.cost.target.Target`, e.g. ``config.target()``),
            instead of ``budget``, ``device``, ``link``, ``accounting`` and
            ``stack``; it needs a budget.

    Returns:
        An :class:`AutotuneResult`.

    Raises:
        ConfigError: no or an invalid budget, margin, device or link.
        PlanInfeasibleError: no plan fits; ``best_peak_bytes`` is the smallest
            predicted peak of any plan tried.
    """
    config = config or LMSConfig()
    if not isinstance(config, LMSConfig):
        raise ConfigError(f"config must be an LMSConfig, got {type(config).__name__}.")
    if target is None:
        target = config.target(
            budget=budget, device=device, link=link, accounting=accounting, stack=stack
        )
    elif any(v is not None for v in (budget, device, link, accounting, stack)):
        raise ConfigError(
            "autotune() takes a target or budget/device/link/accounting/stack, not both: the "
            "target already names them (build another with config.target(...))."
        )
    if target.budget_bytes is None:
        raise ConfigError(
            "No memory budget: pass one, e.g. tflms.autotune(view, '16GiB'), set "
            "LMSConfig(memory_budget='16GiB') or give the target one (Target.for_budget(...))."
        )
    budget_bytes = target.budget_bytes
    if safety_margin is not None:  # checked as the config checks it
        config = config.replace(safety_margin=safety_margin)
    margin = config.safety_margin
    device_model, link_model = target.device, target.link
    if link_model.name in LINKS and link_model.name != config.link:
        # The chosen options must reproduce the chosen plan: ordering is
        # simulated over config.link, so it carries the link tuned for.
        config = config.replace(link=link_model.name)
    view = _as_view(graph_or_view, config, batch_size)
    usable = int(budget_bytes * (1.0 - margin))
    search = Search(view, config, usable, target, robust)
    _check_host_budget(search.baseline, config)

    if search.baseline.device_peak_bytes <= usable:
        plan = SwapPlan(
            graph_name=str(view.graph.get("name", "")),
            config=config,
            notes=(
                f"LMS not needed: the step peaks at {format_bytes(search.baseline.device_peak_bytes)}"
                f" without swaps, within {format_bytes(usable)}",
            ),
            batch_size=view.graph.get("batch_size"),
        )
        outcome = AutotuneResult(
            False,
            config,
            plan,
            search.baseline,
            search.baseline,
            budget_bytes,
            usable,
            (),
            device_model.name,
            link_model.name,
            target=target,
        )
        logger.info("%s", outcome.summary())
        return outcome

    with gc_frozen():  # dozens of rewritten copies: spare the view from each collection
        best = search.run()
        if best is not None and not search.host_fits(best):
            # the search walks towards lower device peaks, which swap more: among every
            # plan it made, the fastest that fits both the device and the host budget
            best = search.best(d for d in search.evaluated() if search.host_fits(d))
    if best is None:
        low = search.lowest()
        device_fits = [d for d in search.evaluated() if d.peak <= usable and not d.plan.empty]
        if device_fits and config.host_memory_budget is not None:
            host_low = min(d.result.host_peak_bytes for d in device_fits)
            raise PlanInfeasibleError(
                f"{len(device_fits)} plans bring {view.graph.get('name') or 'the graph'} under "
                f"{format_bytes(usable)} on the device, but each pins more host memory than "
                f"host_memory_budget={format_bytes(config.host_memory_budget)} (the lowest: "
                f"{format_bytes(host_low)}). Raise host_memory_budget, or lower the batch size "
                "(fewer swapped bytes).",
                budget_bytes=budget_bytes,
                best_peak_bytes=low.peak,
            )
        raise PlanInfeasibleError(
            f"No swap plan brings {view.graph.get('name') or 'the graph'} under "
            f"{format_bytes(usable)} ({format_bytes(budget_bytes)} budget less the "
            f"{margin:.0%} safety margin): the smallest predicted peak of the "
            f"{len(search.candidates)} plans tried is {format_bytes(low.peak)}, "
            f"at {low.result.peak_op} ({low.result.peak_op_type}), which needs its live tensors "
            "at once. Lower the batch size or input size, or use a device with more memory."
            + _state_hint(low.result.variable_bytes, config),
            budget_bytes=budget_bytes,
            best_peak_bytes=low.peak,
            usable_bytes=usable,
        )
    outcome = AutotuneResult(
        True,
        best.config,
        best.plan,
        best.result,
        search.baseline,
        budget_bytes,
        usable,
        tuple(search.candidates),
        device_model.name,
        link_model.name,
        best.retime,
        target,
    )
    logger.info("%s", outcome.summary())
    return outcome


def _as_view(graph_or_view, config: LMSConfig, batch_size: int | None) -> nx.DiGraph:
    if isinstance(graph_or_view, nx.DiGraph):
        if any(d.get("tflms") for _, d in graph_or_view.nodes(data=True)):
            raise UnsupportedGraphError(
                "autotune needs the graph without swap ops; this view was already rewritten "
                "by tflms. Pass the view of the original graph."
            )
        require_batch_size(graph_or_view, fix="tflms.build_view(graph, batch_size=N)")
        return graph_or_view
    if isinstance(graph_or_view, tf.Graph):
        view = build_view(graph_or_view, config=config, batch_size=batch_size)
        require_batch_size(view, fix="autotune(graph, batch_size=N)")
        return view
    raise UnsupportedGraphError(
        f"autotune needs a tf.Graph/FuncGraph or its tflms.build_view view, got "
        f"{type(graph_or_view).__name__}. Example: tflms.autotune(step.get_concrete_function("
        "spec).graph, '16GiB')."
    )


def _state_hint(variable_bytes: int, config: LMSConfig) -> str:
    """What moving the model state off the device would free, for a plan that cannot fit."""
    if variable_bytes <= 0:
        return ""
    moves = []
    if not (config.offload_optimizer or config.offload_weights):
        moves.append("offload_optimizer=True (the optimizer's state and update on the host)")
    if not config.offload_weights:
        moves.append(
            "offload_weights=True with the model built inside tflms.keras.weights_on_host() "
            "(the weights on the host, streamed)"
        )
    if not moves:
        return ""
    return (
        f" Its variables take {format_bytes(variable_bytes)} of the device all step; "
        "no swap plan moves them, but " + " or ".join(moves) + " does."
    )


def _check_host_budget(baseline, config: LMSConfig) -> None:
    """Refuse a host budget below what lives on the host before any plan (its variables).

    Raises:
        PlanInfeasibleError: The step without a plan already pins more host memory.
    """
    limit = config.host_memory_budget
    if limit is None or baseline.host_peak_bytes <= limit:
        return
    raise PlanInfeasibleError(
        f"host_memory_budget={format_bytes(limit)} is below what the step pins on the host "
        f"before any swap: {format_bytes(baseline.host_peak_bytes)} (the weights and optimizer "
        "state kept there, offload_weights/offload_optimizer, and the gradients on their way "
        "to the update). Raise host_memory_budget, or keep some state on the device; no plan "
        "was made and nothing changed.",
        budget_bytes=limit,
        best_peak_bytes=baseline.host_peak_bytes,
    )
