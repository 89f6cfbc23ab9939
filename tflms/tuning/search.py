"""The search behind :func:`tflms.autotune`: plan, simulate, keep the best.

:class:`Search` memoizes ``compose_plan`` + :func:`tflms.simulate` over option
settings and walks them in the order documented in :mod:`tflms.tuning.autotuner`:
the threshold ladder, ``swapin_ahead`` for the most promising thresholds,
``swapin_groupby``, simulated-time triggers, recomputation (cheap, then
dense over a finite link), ordering, the rescue options (sync modes,
serialization, ``min_tensor_bytes=0``, the most memory-saving plans) when
nothing fits, the last resort's descent (one lever at a time from the
lowest plans, then from those plans composed for slower links) when that
fits nothing either, and finally the fewest swaps that still fit. Every simulated plan is kept as a
:class:`Candidate` for the report.

The plans are all of one view, so the work they share is done once: a
:class:`~tflms.simulation.plans.PlanSimulator` simulates each distinct
rewrite once per link and reuses op times, and each setting is planned by
the one lever composition, :func:`~tflms.compose.levers.compose_plan`, with
a :class:`~tflms.compose.levers.Levers` memo that reuses the recomputation
groups of options that differ only in swap settings and the unordered plan
of a setting's retimed and ordered variants. The
results are those of planning and simulating each setting from scratch
(``tests/tflms/test_autotune_reuse.py``).

The search also skips work that cannot change its answer, or rarely does:
the ladder is bisected (fitting is nearly monotone in the threshold), the
swap-in leads are walked while the plans get better, a plan is simulated
with instantaneous copies only when it is in contention for the best, plans
already slower than the best fitting one are not ordered (an order only
slows a plan), and a trim stops at one swap when that plan is
compute-bound, or, for a plan without order edges, as soon as a swap count
that does not fit is already slower than the best fitting plan (more swaps
are no faster).
:meth:`Search.run` pauses Python's cyclic collector (each
rewritten copy of the view leaves reference cycles, and every automatic
collection rescanned the plans kept so far); :meth:`Search.evaluate`
collects every :data:`_COLLECT_EVERY` plans instead.

Example:
    >>> TUNED_OPTIONS[:3]
    ('swapout_threshold', 'swapin_ahead', 'swapin_groupby')
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from dataclasses import dataclass

from tflms.compose.levers import Levers, compose_plan
from tflms.config import LMSConfig
from tflms.cost.hardware import LINKS, get_link
from tflms.cost.target import Accounting, Target
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.plans import PlanSimulator
from tflms.simulation.simulator import SimulationResult
from tflms.utils.gc_pause import gc_paused

__all__ = ["Search", "Candidate", "TUNED_OPTIONS"]

logger = logging.getLogger(__name__)

TUNED_OPTIONS = (
    "swapout_threshold",
    "swapin_ahead",
    "swapin_groupby",
    "sync_mode",
    "serialization",
    "n_tensors",
    "min_tensor_bytes",
    "recompute",
    "recompute_dense",
    "recompute_segments",
    "reorder",
)
"""The :class:`~tflms.LMSConfig` fields the auto-tuner searches."""

_AHEADS = (1, 2, 4, 8, 16, 32)
_GROUPBYS = (0, 5, 20)
_DEPTH_FRACTIONS = (0.5, 0.35, 0.25, 0.15, 0.1, 0.06, 0.03)
_SMALL_THRESHOLDS = (8, 4, 2, 1)
_SLACKS = (1.0, 1.5, 2.5)
_PROMISING = 3
_DENSE_RATIOS = (0.05, 0.1, 0.25)
_SEGMENTS = (1, 2, 4)
"""Checkpoint spacings tried (``recompute_segments``): every cut, every second, every fourth."""
_LOWEST = 2
"""Plans the last resort descends from, and composes for slower links."""
_DESCENT_ROUNDS = 4
"""Rounds of one-lever moves in the last resort's descent."""
_COLLECT_EVERY = 16
"""Plans evaluated between two explicit garbage collections (the collector is paused)."""


@dataclass(frozen=True)
class Candidate:
    """One plan the auto-tuner simulated.

    Attributes:
        options: the searched options it was made with.
        device_peak_bytes: its predicted device peak.
        step_time_s: its predicted step time.
        swaps: tensors swapped; bytes_swapped: bytes swapped out.
        fits: whether the peak is within the usable budget, over the link
            and with instantaneous copies; None for a plan that fits over
            the link and was never in contention, so the copies were not
            checked.
        instant_copies_peak_bytes: the peak with instantaneous copies, when
            it was checked (plans in contention that fit over the link).
    """

    options: dict
    device_peak_bytes: int
    step_time_s: float
    swaps: int
    bytes_swapped: int
    fits: bool | None
    instant_copies_peak_bytes: int | None = None


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


class Search:
    """Memoized plan-and-simulate over option settings; keeps every candidate."""

    def __init__(
        self,
        view,
        config: LMSConfig,
        usable: int,
        target: Target,
        robust=True,
    ):
        self.view, self.base, self.usable = view, config, usable
        self.target = target
        self.device, self.link = target.device, target.link
        self.robust = robust and self.link.bandwidth != float("inf")
        self.accounting: Accounting = target.accounting
        # Every plan is of one view: rewrites, op times and plans' results are shared.
        self.plans = PlanSimulator(
            view,
            device=self.device,
            link=self.link,
            accounting=self.accounting,
            stack=target.stack,
        )
        self.baseline = self.plans.baseline
        self._seen: dict[tuple, _Evaluated] = {}
        # what the plans of settings share: recomputations, unordered plans, op times
        self.levers = Levers(view, target, costs=self.plans.costs)
        self._composed_for: dict[str, Levers] = {}  # the last resort's slower links

    # ------------------------------------------------------------ evaluation
    def evaluate(self, retime: float | None = None, **options) -> _Evaluated:
        """Plan and simulate one option setting, or return the memoized result.

        Every new setting is appended to ``candidates``.

        Args:
            retime: Slack factor for simulated-time triggers
                (:func:`~tflms.compose.retime.retime_triggers`); None keeps the
                planner's level-based triggers.
            **options: :class:`~tflms.LMSConfig` fields overriding the base config.
                A ``link`` other than the target's composes the plan for that
                link (its dense recomputations, retimed triggers and order
                edges assume its copies: the last resort's slower presets);
                the plan is simulated over the target's link all the same.

        Returns:
            The evaluation: config, plan, simulation result and retime slack.
        """
        cfg = self.base.replace(**options)
        key = (*(getattr(cfg, name) for name in TUNED_OPTIONS), retime, cfg.link)
        if key in self._seen:
            return self._seen[key]
        levers = self._levers_for(cfg.link)
        plan = compose_plan(
            self.view, cfg, levers.target, retime=retime, levers=levers, order_plain=False
        )
        result = self.plans.simulate(plan, baseline=self.baseline)
        done = _Evaluated(cfg, plan, result, retime)
        if len(self._seen) % _COLLECT_EVERY == _COLLECT_EVERY - 1:
            gc.collect()
        self._seen[key] = done
        logger.debug(
            "autotune %s: peak %d, %.2f ms, %d swaps",
            key,
            result.device_peak_bytes,
            result.step_time_s * 1e3,
            len(plan.swaps),
        )
        return done

    def _levers_for(self, link: str) -> Levers:
        """The composition memo for plans made as if copies ran over ``link``."""
        if link == self.base.link:
            return self.levers
        if link not in self._composed_for:
            target = dataclasses.replace(self.target, link=get_link(link))
            # op times of its own: a swap's copy takes that link's time in the orders
            self._composed_for[link] = Levers(self.view, target)
        return self._composed_for[link]

    def evaluated(self) -> list[_Evaluated]:
        """Every evaluation made so far, in search order."""
        return list(self._seen.values())

    @property
    def candidates(self) -> list[Candidate]:
        """Every plan simulated so far, in search order, as the report shows it."""
        found = []
        for done in self._seen.values():
            checked = done.plan.empty or not self._may_fit(done) or done.instant_peak is not None
            found.append(
                Candidate(
                    options={
                        **{name: _jsonable(getattr(done.config, name)) for name in TUNED_OPTIONS},
                        "retime": done.retime,
                        **(
                            {}
                            if done.config.link == self.base.link
                            else {"composed_for": done.config.link}
                        ),
                    },
                    device_peak_bytes=done.result.device_peak_bytes,
                    step_time_s=done.result.step_time_s,
                    swaps=len(done.plan.swaps),
                    bytes_swapped=done.plan.bytes_swapped,
                    fits=self._may_fit(done) if checked or not self.robust else None,
                    instant_copies_peak_bytes=done.instant_peak,
                )
            )
        return found

    def host_fits(self, done: _Evaluated) -> bool:
        """Whether a plan's simulated host peak is within ``host_memory_budget`` (if set)."""
        limit = self.base.host_memory_budget
        return limit is None or done.result.host_peak_bytes <= limit

    def _may_fit(self, done: _Evaluated) -> bool:
        """Whether a plan fits as far as simulated yet: over the link, and with
        instantaneous copies if that was checked (the device only: the search
        walks towards lower device peaks; the host budget filters after it)."""
        return not done.plan.empty and done.peak <= self.usable

    def fits(self, done: _Evaluated) -> bool:
        """Whether an evaluation's plan fits the usable budget.

        With ``robust`` (and a finite link bandwidth) the peak with instantaneous
        copies must fit too; it is simulated once and cached on ``done``.

        Args:
            done: An evaluation from :meth:`evaluate`.

        Returns:
            False for an empty plan or a peak above the usable bytes, else
            True (the host budget is the caller's: :meth:`host_fits`).
        """
        if done.plan.empty or done.result.device_peak_bytes > self.usable:
            return False
        if self.robust and done.instant_peak is None:
            instant = self.plans.simulate(done.plan, link="ideal")
            done.instant_peak = instant.device_peak_bytes
        return done.peak <= self.usable

    def best(self, pool) -> _Evaluated | None:
        """The fastest evaluation that fits.

        Args:
            pool: Iterable of evaluations from :meth:`evaluate`.

        Returns:
            The fitting one with the lowest step time (ties: fewer bytes swapped,
            then lower peak), or None when none fits.
        """

        def speed(e: _Evaluated) -> tuple:
            return (e.result.step_time_s, e.plan.bytes_swapped, e.peak)

        # The copies are checked (fits) only from the fastest down, until one passes.
        fitting = sorted({id(e): e for e in pool if self._may_fit(e)}.values(), key=speed)
        for n, found in enumerate(fitting):
            if self.fits(found):
                ties = [e for e in fitting[n:] if speed(e)[:2] == speed(found)[:2]]
                return min((e for e in ties if self.fits(e)), key=speed)
        return None

    def rank(self, done: _Evaluated) -> tuple:
        """Sort key: fitting plans by time, then the others by peak.

        Args:
            done: An evaluation from :meth:`evaluate`.

        Returns:
            ``(0, step time, peak)`` for a plan that fits as far as simulated
            yet (the copies are checked only for plans in contention),
            ``(1, peak, step time)`` otherwise; smaller is better.
        """
        if self._may_fit(done):
            return (0, done.result.step_time_s, done.peak)
        return (1, done.peak, done.result.step_time_s)

    def lowest(self, pool=None) -> _Evaluated:
        """The evaluation with the lowest peak.

        Args:
            pool: Iterable of evaluations; None for every evaluation made so far.

        Returns:
            The lowest peak (ties: non-empty plans, then lower step time).
        """
        pool = list(self._seen.values()) if pool is None else list(pool)
        return min(
            pool,
            key=lambda e: (e.peak, e.plan.empty, e.result.step_time_s),
        )

    def pick(self, pool) -> _Evaluated:
        """The best fitting evaluation, else the one with the lowest peak.

        Args:
            pool: Iterable of evaluations from :meth:`evaluate`.

        Returns:
            :meth:`best` of ``pool``, or :meth:`lowest` when nothing fits.
        """
        pool = list(pool)
        return self.best(pool) or self.lowest(pool)

    # ---------------------------------------------------------------- search
    def run(self) -> _Evaluated | None:
        """Search the options (see the module docstring) for the fastest plan that fits.

        Python's cyclic collector is paused meanwhile and :meth:`evaluate`
        collects every :data:`_COLLECT_EVERY` plans instead.

        Returns:
            The best fitting evaluation, or None when no plan fits.
        """
        with gc_paused():
            return self._run()

    def _run(self) -> _Evaluated | None:
        depth = int(self.view.graph.get("depth") or 1)
        rungs = {max(0, int(depth * f)) for f in _DEPTH_FRACTIONS} | set(_SMALL_THRESHOLDS)
        rungs.add(self.base.swapout_threshold)
        ladder = self._ladder(sorted(rungs, reverse=True))
        # How far ahead a swap-in must start depends on the threshold (a short-lived
        # tensor needs a late trigger): sweep the lead for the most promising few.
        promising = sorted(ladder, key=self.rank)[:_PROMISING]
        current = self.pick(ladder + [e for start in promising for e in self._sweep_ahead(start)])
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
        # Recompute cheap activations instead of swapping them, around the best settings.
        top = sorted(self._seen.values(), key=self.rank)[:_PROMISING]
        current = self.pick(
            [current]
            + [self.evaluate(retime=e.retime, **_opts(e.config, recompute=True)) for e in top]
        )
        # Re-run whole segments of the forward pass from checkpoints, around the best
        # recomputing plans (dense ops included: what swaps cannot hide, or no swap at all).
        top = [e for e in sorted(self._seen.values(), key=self.rank) if e.config.recompute]
        current = self.pick(
            [current]
            + [
                self.evaluate(retime=e.retime, **_opts(e.config, recompute_segments=every))
                for e in top[:2]
                for every in _SEGMENTS
            ]
        )
        # Re-run the convolutions whose copies the link cannot hide (a slow link only).
        if self.link.bandwidth != float("inf"):
            top = [e for e in sorted(self._seen.values(), key=self.rank) if e.config.recompute]
            current = self.pick(
                [current]
                + [
                    self.evaluate(retime=e.retime, **_opts(e.config, recompute_dense=ratio))
                    for e in top[:_PROMISING]
                    for ratio in _DENSE_RATIOS
                ]
            )
        # Order the branches that make the peak, on the best plans so far, with and
        # without recomputation (their peaks differ before ordering, not after).
        ranked = sorted(self._seen.values(), key=self.rank)
        top = [e for e in ranked if not e.config.recompute][:2]
        top += [e for e in ranked if e.config.recompute][:2]
        if self.fits(current):  # an order only slows a plan: skip those already slower
            top = [e for e in top if e.result.step_time_s <= current.result.step_time_s]
        current = self.pick(
            [current]
            + [
                self.evaluate(retime=e.retime, **_opts(e.config, reorder=True))
                for e in top
                if not e.plan.empty
            ]
        )
        if not self.fits(current):
            current = self._rescue(current)
        if not self.fits(current):
            current = self._last_resort()
        if not self.fits(current):
            return self.best(self._seen.values())
        # Trim the swaps of the best plan of each kind: a plan that re-runs convolutions
        # often needs only a few swaps, and is fastest with them.
        seen = list(self._seen.values())
        finalists = {id(current): current}
        for dense in (False, True):
            found = self.best(e for e in seen if bool(e.config.recompute_dense) == dense)
            if found is not None:
                finalists[id(found)] = found
        trimmed: list[_Evaluated] = []
        for finalist in finalists.values():
            bar = self.best([current, *trimmed]) or current
            trimmed.append(self._trim(finalist, bar.result.step_time_s))
        return self.best(list(self._seen.values()) + trimmed)

    def _rescue(self, current: _Evaluated) -> _Evaluated:
        """Options that lower the peak at a time cost: sync modes, serialization, everything.

        They are tried on the best plan so far and on the one that swaps most:
        when copies are slower than compute, only a synchronous plan frees
        memory in time. Last, the most memory-saving plans the planner makes
        (:data:`MOST_SAVING`: every candidate swapped from thresholds 0, 1
        and 2 with the latest swap-ins, each with and without recomputation,
        the two lowest peaks of those also with memory-aware order), so that
        a step one of those plans fits is never reported infeasible because
        the ladder above missed it.
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
        # the family unordered first; memory-aware order (up to 24 simulated rounds each)
        # on the two lowest peaks of it only
        family = [self.evaluate(**_opts(self.base, **options)) for options in MOST_SAVING]
        return self.pick(pool + self._ordered_lowest(family))

    def _ordered_lowest(self, family: list[_Evaluated]) -> list[_Evaluated]:
        """``family`` and its two lowest plans again with memory-aware order (up to 24
        simulated rounds each, so on those two only)."""
        lowest = sorted(family, key=lambda e: (e.peak, e.result.step_time_s))[:2]
        return family + [self.evaluate(**_opts(e.config, reorder=True)) for e in lowest]

    def _last_resort(self) -> _Evaluated:
        """When even the rescue fits nothing: a descent on the peak from the lowest plans.

        The paths above make plans in a fixed order of levers, and a plan
        that fits can lie off every one of them. Found so far: VGG16 at 60%
        of its plain peak (the rescue's most-saving plans never re-run dense
        ops: 2.33 GiB against 2.28; with ``recompute_dense=0.25`` added,
        2.22: :meth:`_dense_corner` makes those first), and the zoo's MLP,
        whose ordered plans peak higher over NVLink2 than over PCIe3 and
        lower with fewer swaps. So, from the
        :data:`_LOWEST` lowest plans, each lever is moved one step
        (:meth:`_moves`) for up to :data:`_DESCENT_ROUNDS` rounds while the
        lowest peak falls; then, if nothing fits yet, the lowest plans are
        composed again for each slower preset link, fastest first
        (:func:`_slower_links`; their dense recomputations, retimed triggers
        and order edges assume slower copies and keep less resident),
        simulated over the target's link, and descended the same way; the
        first link with a plan that fits ends the walk.

        Returns:
            The best plan that fits, else the lowest of every plan made.
        """
        self._dense_corner()
        found = self._descend(self._lowest_plans(self.evaluated()))
        # (a link model that is no preset: the config cannot name it, nor one slower)
        slower = _slower_links(self.link) if self.link.name == self.base.link else []
        lowest = self._lowest_plans(self.evaluated())
        for link in slower:
            if found is not None:
                break
            composed = [
                self.evaluate(retime=e.retime, **_opts(e.config, link=link)) for e in lowest
            ]
            found = self._descend(self._lowest_plans(composed))
        return found or self.lowest()

    def _dense_corner(self) -> None:
        """The most-saving recomputing plans with dense ops re-run too (a finite link only).

        The corner no path above reaches, a few levers away from each: every
        candidate of at least the configured ``min_tensor_bytes`` swapped
        from the lowest thresholds with the latest swap-ins, recomputation
        with :data:`_DENSE_RATIOS` of the dense ops re-run, and the two
        lowest of those also ordered. On VGG16 at 60% of its plain peak
        (simulated, PCIe3) the descent alone ends on a synchronous,
        serialized plan (2.25 GiB, 1.93x the plain step); this corner fits
        at 2.22 GiB and 1.47x, four levers away from it. Swapping the small
        tensors too (the most-saving family's ``min_tensor_bytes=0``) undoes
        it: their swaps hold what the re-runs free (2.36 GiB ordered).
        """
        if self.link.bandwidth == float("inf"):  # dense ops are re-run for their copies
            return
        small = self.base.min_tensor_bytes  # the family's 0 swaps the tensors a re-run frees
        family = [
            self.evaluate(
                **_opts(self.base, **{**options, "min_tensor_bytes": small}, recompute_dense=ratio)
            )
            for options in MOST_SAVING
            if options["recompute"]
            for ratio in _DENSE_RATIOS
        ]
        self._ordered_lowest(family)  # memoized: the descent starts from the lowest made

    def _descend(self, starts: list[_Evaluated]) -> _Evaluated | None:
        """One-lever moves from the best plans while they get better; the best fit or None.

        Better is :meth:`rank`: a lower peak until a plan fits, then a
        shorter step among those that fit. So the descent does not stop at
        the first plan that fits: VGG16's ran its copies synchronously,
        1.93x its plain step, and the moves from it re-run dense ops instead
        and copy asynchronously again.
        """
        made = {id(e): e for e in starts}
        frontier = self._lowest_plans(list(made.values()))
        for _ in range(_DESCENT_ROUNDS):
            if not frontier:
                break
            before = min(self.rank(e) for e in made.values())
            for e in frontier:
                for move in self._moves(e):
                    trial = self.evaluate(retime=e.retime, **move)
                    made[id(trial)] = trial
            ranked = sorted(made.values(), key=self.rank)
            frontier = [e for e in ranked[:_LOWEST] if self.rank(e) < before]
        return self.best(made.values())

    def _moves(self, done: _Evaluated) -> list[dict]:
        """The options of ``done`` with one lever moved: each a setting to evaluate.

        Half the swaps (an ordered plan's peak is not monotone in the
        count), order toggled, recomputation toggled (turned on with dense
        ops re-run at each ratio too), small tensors considered or not,
        copies asynchronous again, swap-ins a step earlier or later.
        """
        cfg = done.config
        finite = self.link.bandwidth != float("inf")  # (dense ops are judged by their copies)
        moves = [_opts(cfg, reorder=not cfg.reorder)]
        if len(done.plan.swaps) > 1:
            moves.append(_opts(cfg, n_tensors=len(done.plan.swaps) // 2))
        if cfg.recompute:
            moves.append(_opts(cfg, recompute=False, recompute_dense=0.0, recompute_segments=0))
        else:
            moves.append(_opts(cfg, recompute=True))
        if finite:
            moves += [
                _opts(cfg, recompute=True, recompute_dense=r)
                for r in _DENSE_RATIOS
                if r != cfg.recompute_dense
            ]
        small = 0 if cfg.min_tensor_bytes else self.base.min_tensor_bytes
        moves.append(_opts(cfg, min_tensor_bytes=small))
        if cfg.sync_mode:
            moves.append(_opts(cfg, sync_mode=0))
        if cfg.swapin_ahead in _AHEADS:
            at = _AHEADS.index(cfg.swapin_ahead)
            moves += [
                _opts(cfg, swapin_ahead=_AHEADS[i])
                for i in (at - 1, at + 1)
                if 0 <= i < len(_AHEADS)
            ]
        return moves

    @staticmethod
    def _lowest_plans(pool: list[_Evaluated]) -> list[_Evaluated]:
        """The :data:`_LOWEST` plans of ``pool`` with swaps and the lowest peaks."""
        rewriting = [e for e in pool if e.plan.swaps]
        return sorted(rewriting, key=lambda e: (e.peak, e.result.step_time_s))[:_LOWEST]

    def _trim(self, current: _Evaluated, bar: float) -> _Evaluated:
        """The fewest largest-first swaps of ``current`` that still fit.

        Without order edges, swapping more tensors does not make a step
        faster (nearly: more copies to hide), so once a count that does not
        fit is already slower than ``bar`` (the step time of the best fitting
        plan found), every count above it is slower too and the bisection
        stops (a tie goes on: of equal times, the fewest bytes swapped wins).
        An ordered plan's time is not monotone in the count (each count gets
        its own order edges: on the LSTM language model, one swap was slower
        than seven), so its bisection runs to the end.
        """
        n_max = len(current.plan.swaps)
        best = current
        lo, hi = 1, n_max  # hi fits
        monotone = not current.config.reorder
        if n_max > 1:  # a few swaps often do, as when convolutions are re-run: try one first
            fewest = self.evaluate(retime=current.retime, **_opts(current.config, n_tensors=1))
            if not self.fits(fewest):
                lo = 2
            elif _compute_bound(fewest):  # every other count swaps more and is no faster
                return self.best([best, fewest]) or best
        while lo < hi:
            mid = (lo + hi) // 2
            trial = self.evaluate(retime=current.retime, **_opts(current.config, n_tensors=mid))
            if self.fits(trial):
                hi = mid
                best = self.best([best, trial]) or best
                bar = min(bar, best.result.step_time_s)
            elif monotone and trial.result.step_time_s > bar:
                break
            else:
                lo = mid + 1
        return best

    def _ladder(self, thresholds: list[int]) -> list[_Evaluated]:
        """Swap-out thresholds, fewest swaps first: the first that fits and the next ones.

        A lower threshold swaps more tensors, so fitting is (nearly) monotone
        along the ladder and a bisection finds the first rung that fits; the
        :data:`_PROMISING` rungs from there are evaluated. When even the last
        rung does not fit, every rung is, so that the rescue starts from the
        lowest peaks.
        """
        done: dict[int, _Evaluated] = {}

        def rung(i: int) -> _Evaluated:
            if i not in done:
                done[i] = self.evaluate(
                    swapout_threshold=thresholds[i], n_tensors=None, sync_mode=0
                )
            return done[i]

        last = len(thresholds) - 1
        if not self.fits(rung(last)):
            return [rung(i) for i in range(len(thresholds))]
        lo, hi = 0, last  # hi fits
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(rung(mid)):
                hi = mid
            else:
                lo = mid + 1
        for i in range(lo, min(lo + _PROMISING, len(thresholds))):
            rung(i)
        return list(done.values())

    def _sweep_ahead(self, start: _Evaluated) -> list[_Evaluated]:
        """``start`` with other swap-in leads (:data:`_AHEADS`), walking while the rank improves.

        A longer lead hides more of a copy but holds its tensor longer, so the
        rank is (nearly) unimodal in the lead: walk up from ``start``'s lead
        while each step ranks better; if the first step up does not, walk down.
        """
        own = start.config.swapin_ahead
        up = [a for a in _AHEADS if a > own]
        down = [a for a in reversed(_AHEADS) if a < own]
        seen = [start]
        for direction in (up, down):
            best = start
            for ahead in direction:
                trial = self.evaluate(**_opts(start.config, swapin_ahead=ahead))
                seen.append(trial)
                if self.rank(trial) >= self.rank(best):
                    break
                best = trial
            if best is not start:  # improved going up: no need to look down
                break
        return seen

    def _peak_level(self, done: _Evaluated) -> int | None:
        node = self.view.nodes.get(done.result.peak_op)
        return None if node is None else node.get("level")


MOST_SAVING = tuple(
    dict(
        swapout_threshold=threshold,
        swapin_ahead=1,
        min_tensor_bytes=0,
        recompute=recompute,
        **({} if recompute else {"recompute_dense": 0.0, "recompute_segments": 0}),
        reorder=False,
    )
    for threshold in (0, 1, 2)
    for recompute in (False, True)
)
"""The most memory-saving plans the planner makes (the rescue's last try): every candidate
swapped, from the lowest thresholds, with the latest swap-ins, with and without
recomputation; the two with the lowest peaks are then ordered (memory-aware order).
Neither lever lowers every peak - a recomputed group or an order edge can keep a tensor
alive across the peak: on the zoo's CNN the plan with threshold 2 and order but no
recomputation peaks 23% below the one with both - so each is tried both ways rather than
assumed to help."""


def _slower_links(link) -> list[str]:
    """The preset links slower than ``link``, fastest first (none for an unnamed model)."""
    slower = [other for other in LINKS.values() if other.bandwidth < link.bandwidth]
    return [other.name for other in sorted(slower, key=lambda m: -m.bandwidth)]


def _compute_bound(done: _Evaluated) -> bool:
    """Whether a plan's step is as long as its compute alone: no copy delays it."""
    return done.result.step_time_s <= done.result.compute_time_s * (1 + 1e-9)


def _opts(config: LMSConfig, **changes) -> dict:
    options = {name: getattr(config, name) for name in (*TUNED_OPTIONS, "link")}
    options.update(changes)
    return options


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value
