"""``tflms.autotune``: the swap plan that fits a memory budget at the least cost.

Given a training step and a device memory budget, the auto-tuner simulates
(:func:`tflms.simulate`) the step without swaps and, if it does not fit,
searches the planner's options for the plan whose predicted peak fits and
whose predicted step time is lowest:

1. ``swapout_threshold`` over a ladder scaled to the graph depth (large
   thresholds swap only the longest-lived tensors);
2. ``swapin_ahead`` for the three most promising thresholds, then
   ``swapin_groupby`` around the best pair;
3. swap-in triggers chosen by simulated time rather than level distance
   (:func:`tflms.sim_retime.retime_triggers`), with a few slacks;
4. only if nothing fits yet: ``sync_mode`` 1-3, ``serialization`` of the
   levels around the peak, and ``min_tensor_bytes=0``;
5. ``n_tensors``: the fewest (largest-first) swaps that still fit - less
   traffic, less overhead.

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
    ...     for i, k in enumerate(reversed(keep)):
    ...         h = tf.add(h, k, name=f"back{i}")
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
from tflms.errors import ConfigError, PlanInfeasibleError, UnsupportedGraphError
from tflms.graph_view import build_view
from tflms.plan import SwapPlan
from tflms.planner import make_plan
from tflms.sim_hardware import DEVICES, DeviceModel, LinkModel, get_device, get_link
from tflms.sim_retime import retime_triggers
from tflms.sim_schedule import compile_view, first_ready
from tflms.simulator import SimulationResult, simulate
from tflms.units import format_bytes, parse_bytes

__all__ = ["autotune", "AutotuneResult", "Candidate", "resolve_budget", "TUNED_OPTIONS"]

logger = logging.getLogger(__name__)

TUNED_OPTIONS = (
    "swapout_threshold",
    "swapin_ahead",
    "swapin_groupby",
    "sync_mode",
    "serialization",
    "n_tensors",
    "min_tensor_bytes",
)
"""The :class:`~tflms.LMSConfig` fields the auto-tuner searches."""

_AHEADS = (1, 2, 4, 8, 16, 32)
_GROUPBYS = (0, 5, 20)
_DEPTH_FRACTIONS = (0.5, 0.35, 0.25, 0.15, 0.1, 0.06, 0.03)
_SMALL_THRESHOLDS = (8, 4, 2, 1)
_SLACKS = (1.0, 1.5, 2.5)
_PROMISING = 3


@dataclass(frozen=True)
class Candidate:
    """One plan the auto-tuner simulated.

    Attributes:
        options: the searched options it was made with.
        device_peak_bytes: its predicted device peak.
        step_time_s: its predicted step time.
        swaps: tensors swapped; bytes_swapped: bytes swapped out.
        fits: whether the peak is within the usable budget.
        instant_copies_peak_bytes: the peak with instantaneous copies, when
            it was checked (plans that fit over the link).
    """

    options: dict
    device_peak_bytes: int
    step_time_s: float
    swaps: int
    bytes_swapped: int
    fits: bool
    instant_copies_peak_bytes: int | None = None


@dataclass(frozen=True)
class AutotuneResult:
    """The outcome of :func:`autotune`.

    Attributes:
        lms_needed: ``False`` when the step fits without swapping.
        config: the chosen options (the input config with the searched
            fields replaced).
        plan: the chosen plan (no swaps when LMS is not needed).
        result: the simulation of the step with ``plan`` (baseline included).
        baseline: the simulation without swaps.
        budget_bytes: the budget asked for.
        usable_bytes: the budget minus the safety margin: what plans must fit.
        candidates: every plan simulated, in search order.
        device, link: the presets used for time predictions.
        retime: the ``slack`` of :func:`tflms.sim_retime.retime_triggers`
            if the chosen plan's swap-in triggers were chosen by simulated
            time, ``None`` if they are the planner's (level-based) ones.
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
                f"{format_bytes(self.baseline.device_peak_bytes)} without swaps"
            )
        options = {k: getattr(self.config, k) for k in TUNED_OPTIONS}
        return "\n".join(
            [
                head,
                f"  peak {format_bytes(self.baseline.device_peak_bytes)} -> "
                f"{format_bytes(self.result.device_peak_bytes)}, {len(self.plan.swaps)} tensors "
                f"swapped ({format_bytes(self.plan.bytes_swapped)} each way), predicted overhead "
                f"{self.overhead:+.1%} ({len(self.candidates)} plans simulated)",
                f"  options: {options}"
                + (
                    f", swap-ins retimed by simulation (slack {self.retime:g})"
                    if self.retime
                    else ""
                ),
            ]
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
            "bytes_swapped": self.plan.bytes_swapped,
            "result": self.result.to_dict(timeline=False),
            "candidates": [asdict(c) for c in self.candidates],
        }


def resolve_budget(
    budget: int | str | DeviceModel | None, config: LMSConfig | None = None
) -> tuple[int, DeviceModel | None]:
    """``(bytes, device preset or None)`` from a budget or ``config.memory_budget``.

    Raises:
        ConfigError: no budget was given, or it is not a size or a preset.

    Example:
        >>> resolve_budget("16GiB")[0], resolve_budget("A100-80GB")[1].name
        (17179869184, 'A100-80GB')
    """
    value = budget if budget is not None else (config.memory_budget if config else None)
    if value is None:
        raise ConfigError(
            "No memory budget: pass one, e.g. tflms.autotune(view, '16GiB'), or set "
            "LMSConfig(memory_budget='16GiB')."
        )
    if isinstance(value, DeviceModel):
        return value.memory_bytes, value
    if isinstance(value, str) and value.strip().lower() in {n.lower() for n in DEVICES}:
        device = get_device(value.strip())
        return device.memory_bytes, device
    try:
        size = parse_bytes(value)
    except ValueError as err:
        raise ConfigError(
            f"memory budget must be a byte count, a size such as '16GiB' or a device preset "
            f"({', '.join(DEVICES)}). Received {value!r}."
        ) from err
    if size <= 0:
        raise ConfigError(f"memory budget must be positive. Received {value!r}.")
    return size, None


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
    accounting: str = "tensorflow",
) -> AutotuneResult:
    """Find the swap plan that fits ``budget`` with the lowest predicted overhead.

    Args:
        graph_or_view: a ``tf.Graph``/``FuncGraph`` or its analysis view.
        budget: bytes, a size such as ``"16GiB"``, or a device preset
            (``"V100-16GB"``); default ``config.memory_budget``.
        config: base options (devices, scope/type filters, ...); the searched
            fields (:data:`TUNED_OPTIONS`) start from its values.
        batch_size: sizes tensors with an unknown batch dimension (graphs only).
        device: device model for time predictions; default the budget's
            preset, else ``"V100-16GB"``.
        link: link preset; default ``config.link``.
        safety_margin: fraction of the budget kept free; default
            ``config.safety_margin``.
        robust: a plan fits only if it also fits with instantaneous copies.
            Over a slow link, copies that lag keep swap-ins from being
            allocated early (the consumers stall instead); a plan whose fit
            relied on that would run out of memory on a faster or less busy
            link. Instantaneous copies are also what Grappler assumes.
        accounting: memory conventions plans are judged by (see
            :mod:`tflms.sim_memory`): ``"tensorflow"`` (a GPU, the default) or
            ``"grappler"`` (to find plans that Grappler's estimate accepts).

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
    budget_bytes, preset = resolve_budget(budget, config)
    margin = config.safety_margin if safety_margin is None else safety_margin
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 0.9:
        raise ConfigError(
            f"safety_margin must be a fraction in [0, 0.9). Received safety_margin={margin!r}."
        )
    device_model = get_device(device) if device is not None else (preset or get_device("V100-16GB"))
    link_model = get_link(link if link is not None else config.link)
    view = _as_view(graph_or_view, config, batch_size)
    usable = int(budget_bytes * (1.0 - margin))
    search = _Search(view, config, usable, device_model, link_model, robust, accounting)

    if search.baseline.device_peak_bytes <= usable:
        plan = SwapPlan(
            graph_name=str(view.graph.get("name", "")),
            config=config.to_dict(),
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
        )
        logger.info("%s", outcome.summary())
        return outcome

    best = search.run()
    if best is None:
        low = search.lowest()
        raise PlanInfeasibleError(
            f"No swap plan brings {view.graph.get('name') or 'the graph'} under "
            f"{format_bytes(usable)} ({format_bytes(budget_bytes)} budget less the "
            f"{margin:.0%} safety margin): the smallest predicted peak of the "
            f"{len(search.candidates)} plans tried is {format_bytes(low.peak)}, "
            f"at {low.result.peak_op} ({low.result.peak_op_type}), which needs its live tensors "
            "at once. Lower the batch size or input size, or use a device with more memory.",
            budget_bytes=budget_bytes,
            best_peak_bytes=low.peak,
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
        return graph_or_view
    if isinstance(graph_or_view, tf.Graph):
        return build_view(graph_or_view, config=config, batch_size=batch_size)
    raise UnsupportedGraphError(
        f"autotune needs a tf.Graph/FuncGraph or its tflms.build_view view, got "
        f"{type(graph_or_view).__name__}. Example: tflms.autotune(step.get_concrete_function("
        "spec).graph, '16GiB')."
    )


@dataclass
class _Evaluated:
    config: LMSConfig
    plan: SwapPlan
    result: SimulationResult
    retime: float | None = None
    instant_peak: int | None = None  # the peak with instantaneous copies, once computed

    @property
    def peak(self) -> int:
        """The peak over the link, or with instantaneous copies if that is higher."""
        return max(self.result.device_peak_bytes, self.instant_peak or 0)


class _Search:
    """Memoized plan-and-simulate over option settings; keeps every candidate."""

    def __init__(
        self, view, config: LMSConfig, usable: int, device, link, robust=True, accounting=None
    ):
        self.view, self.base, self.usable = view, config, usable
        self.device, self.link = device, link
        self.robust = robust and link.bandwidth != float("inf")
        self.accounting = accounting or "tensorflow"
        self.baseline = simulate(view, device=device, link=link, accounting=self.accounting)
        self.candidates: list[Candidate] = []
        self._seen: dict[tuple, _Evaluated] = {}
        self._timed = None

    # ------------------------------------------------------------ evaluation
    def evaluate(self, retime: float | None = None, **options) -> _Evaluated:
        cfg = self.base.replace(**options)
        key = (*(getattr(cfg, name) for name in TUNED_OPTIONS), retime)
        if key in self._seen:
            return self._seen[key]
        plan = make_plan(self.view, cfg)
        if retime is not None and plan.swaps:
            if self._timed is None:
                compiled = compile_view(self.view, device=self.device, link=self.link)
                self._timed = (compiled, first_ready(compiled))
            plan = retime_triggers(
                self.view, plan, device=self.device, link=self.link, slack=retime, timed=self._timed
            )
        result = simulate(
            self.view,
            plan,
            device=self.device,
            link=self.link,
            baseline=self.baseline,
            accounting=self.accounting,
        )
        done = _Evaluated(cfg, plan, result, retime)
        self._seen[key] = done
        fits = self.fits(done)
        self.candidates.append(
            Candidate(
                options={
                    **{name: _jsonable(getattr(cfg, name)) for name in TUNED_OPTIONS},
                    "retime": retime,
                },
                device_peak_bytes=result.device_peak_bytes,
                step_time_s=result.step_time_s,
                swaps=len(plan.swaps),
                bytes_swapped=plan.bytes_swapped,
                fits=fits,
                instant_copies_peak_bytes=done.instant_peak,
            )
        )
        logger.debug(
            "autotune %s: peak %d, %.2f ms, %d swaps",
            key,
            result.device_peak_bytes,
            result.step_time_s * 1e3,
            len(plan.swaps),
        )
        return done

    def fits(self, done: _Evaluated) -> bool:
        if not done.plan.swaps or done.result.device_peak_bytes > self.usable:
            return False
        if self.robust and done.instant_peak is None:
            instant = simulate(
                self.view,
                done.plan,
                device=self.device,
                link="ideal",
                baseline=False,
                accounting=self.accounting,
            )
            done.instant_peak = instant.device_peak_bytes
        return done.peak <= self.usable

    def best(self, pool) -> _Evaluated | None:
        fitting = [e for e in pool if self.fits(e)]
        if not fitting:
            return None
        return min(
            fitting,
            key=lambda e: (
                e.result.step_time_s,
                e.plan.bytes_swapped,
                e.peak,
            ),
        )

    def rank(self, done: _Evaluated) -> tuple:
        """Sort key: fitting plans by time, then the others by peak."""
        if self.fits(done):
            return (0, done.result.step_time_s, done.peak)
        return (1, done.peak, done.result.step_time_s)

    def lowest(self, pool=None) -> _Evaluated:
        pool = list(self._seen.values()) if pool is None else list(pool)
        return min(
            pool,
            key=lambda e: (e.peak, not e.plan.swaps, e.result.step_time_s),
        )

    def pick(self, pool) -> _Evaluated:
        """The best fitting evaluation, else the one with the lowest peak."""
        pool = list(pool)
        return self.best(pool) or self.lowest(pool)

    # ---------------------------------------------------------------- search
    def run(self) -> _Evaluated | None:
        depth = int(self.view.graph.get("depth") or 1)
        ladder = {max(0, int(depth * f)) for f in _DEPTH_FRACTIONS} | set(_SMALL_THRESHOLDS)
        ladder.add(self.base.swapout_threshold)
        thresholds = sorted(ladder, reverse=True)
        ladder = [
            self.evaluate(swapout_threshold=t, n_tensors=None, sync_mode=0) for t in thresholds
        ]
        # How far ahead a swap-in must start depends on the threshold (a short-lived
        # tensor needs a late trigger): sweep the lead for the most promising few.
        promising = sorted(ladder, key=self.rank)[:_PROMISING]
        current = self.pick(
            ladder
            + [
                self.evaluate(**_opts(start.config, swapin_ahead=a))
                for start in promising
                for a in _AHEADS
            ]
        )
        current = self.pick(
            [current]
            + [self.evaluate(**_opts(current.config, swapin_groupby=k)) for k in _GROUPBYS]
        )
        current = self.pick(
            [current]
            + [
                self.evaluate(retime=slack, **_opts(current.config))
                for slack in _SLACKS
                if current.plan.swaps
            ]
        )
        if not self.fits(current):
            current = self._rescue(current)
        if not self.fits(current):
            return self.best(self._seen.values())
        trimmed = self._trim(current)
        return self.best(list(self._seen.values()) + [trimmed])

    def _rescue(self, current: _Evaluated) -> _Evaluated:
        """Options that lower the peak at a time cost: sync modes, serialization.

        They are tried on the best plan so far and on the one that swaps most:
        when copies are slower than compute, only a synchronous plan frees
        memory in time.
        """
        most = max(self._seen.values(), key=lambda e: (len(e.plan.swaps), -e.result.step_time_s))
        pool = [current]
        for start in {id(current): current, id(most): most}.values():
            pool += [
                self.evaluate(retime=start.retime, **_opts(start.config, sync_mode=m))
                for m in (1, 2, 3)
            ]
        current = self.pick(pool)
        level = self._peak_level(current)
        if level is not None:
            for half in (2, 8):
                span = ((max(0, level - half), level + half),)
                pool.append(
                    self.evaluate(
                        retime=current.retime, **_opts(current.config, serialization=span)
                    )
                )
        pool.append(
            self.evaluate(retime=current.retime, **_opts(current.config, min_tensor_bytes=0))
        )
        return self.pick(pool)

    def _trim(self, current: _Evaluated) -> _Evaluated:
        """The fewest largest-first swaps of ``current`` that still fit."""
        n_max = len(current.plan.swaps)
        lo, hi = 1, n_max  # hi fits
        best = current
        while lo < hi:
            mid = (lo + hi) // 2
            trial = self.evaluate(retime=current.retime, **_opts(current.config, n_tensors=mid))
            if self.fits(trial):
                hi = mid
                best = self.best([best, trial]) or best
            else:
                lo = mid + 1
        return best

    def _peak_level(self, done: _Evaluated) -> int | None:
        node = self.view.nodes.get(done.result.peak_op)
        return None if node is None else node.get("level")


def _opts(config: LMSConfig, **changes) -> dict:
    options = {name: getattr(config, name) for name in TUNED_OPTIONS}
    options.update(changes)
    return options


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value
