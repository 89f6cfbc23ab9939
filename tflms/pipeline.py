"""The tflms pipeline: graph -> view -> cut -> plan or auto-tune -> apply -> validate.

Every front end runs this one pipeline: :class:`tflms.LMS` (``tf.compat.v1``
graphs and ``FuncGraph``\\ s), on which :class:`tflms.LMSCallback` (Keras
``fit``) and :func:`tflms.function` (custom loops) build, and the SavedModel
path behind ``tflms analyze | simulate | rewrite``
(:mod:`tflms.saved_model.rewrite`). ``tflms.make_plan`` is its plan stage
alone, for a view you built yourself.

What a step is planned for is resolved once, when the :class:`Pipeline` is
made, and handed to every stage below it, none of which has a default of its
own:

* the **target** (:class:`~tflms.cost.target.Target`: device model, host link,
  budget, memory accounting, software stack) is ``config.target()``;
  the recomputation planner, the retiming and ordering levers, the simulator
  and the auto-tuner all take it as an argument;
* the **devices** ``LMSConfig.device`` and ``host_device`` are checked
  against this machine's logical devices, for graphs of this process (a
  SavedModel may be rewritten on a machine other than the one that trains);
* the **batch size** tensors with an open first dimension are sized for
  follows one rule, :data:`~tflms.graph.view.BATCH_RULE`: ``LMSConfig.batch_size``
  when set; else the batch the front end knows (the batch ``fit`` feeds, then
  the traced step's static leading dimension; the argument of
  :meth:`tflms.LMS.run`); else the graph's input signature; else unknown,
  which planning refuses with the fix.

The stages, each in its own sub-package: :func:`~tflms.graph.view.build_view`
(analysis, read only); the cut of ops larger than ``max_op_bytes`` into row
chunks (:mod:`tflms.plan.splits`, :mod:`tflms.apply.split`: it rewrites the
graph before planning, so the view is built again from the cut graph);
:func:`~tflms.compose.levers.compose_plan` (the levers, one setting) or
:func:`~tflms.tuning.autotuner.autotune` (the cheapest setting that fits
``memory_budget``, composed the same way); the Grappler check
(``LMSConfig.check_rewrites``, :meth:`Pipeline.keep_rewrites`: planned again
until Grappler rewrites the step alike with and without the plan);
:func:`~tflms.apply.core.apply_plan`
or :func:`~tflms.apply.core.apply_with` (the only stage that mutates);
:func:`~tflms.apply.validation.validate`.

Example:
    >>> import tensorflow as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None, 1024], name="x")
    ...     h = tf.nn.relu(tf.matmul(x, tf.ones([1024, 1024])), name="h")
    ...     y = h
    ...     for i in range(12):
    ...         y = tf.nn.relu(y * 1.01, name=f"act{i}")
    ...     out = tf.add(y, h, name="out")
    >>> pipeline = Pipeline(LMSConfig(swapout_threshold=10, swapin_ahead=4, min_tensor_bytes=0))
    >>> pipeline.target.describe()
    'V100-16GB over pcie3, no budget, tensors accounting (tf2 stack)'
    >>> done = pipeline.run(g, (64, "the caller"))
    >>> [s.tensor for s in done.plan.swaps], done.view.graph["batch_size"]
    (['h:0'], 64)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import networkx as nx
import tensorflow as tf

from tflms.apply.core import apply_plan
from tflms.apply.split import finish_view, split_graph
from tflms.apply.validation import validate
from tflms.compose.levers import compose_plan
from tflms.config import LMSConfig
from tflms.cost.target import Target
from tflms.errors import AlreadyRewrittenError, ConfigError, PlanInfeasibleError, ValidationError
from tflms.graph.grappler_rules import NOT_RECOMPUTED, PINNED
from tflms.graph.view import build_view, require_batch_size, resolve_batch
from tflms.plan.splits import Split, plan_deferrals, plan_splits
from tflms.plan.swap_plan import SwapPlan, pins_broken
from tflms.utils.devices import check_local_device

if TYPE_CHECKING:  # the auto-tuner (and simulator) load only when a budget is set
    from tflms.tuning.autotuner import AutotuneResult

__all__ = ["Known", "Pipeline", "Planned", "make_plan"]

logger = logging.getLogger(__name__)

CHECK_ROUNDS = 6
"""Rounds of the Grappler check (``LMSConfig.check_rewrites``) before the last plan is kept."""

Known = tuple[int | None, str | None]
"""A batch size the front end knows, or None, and where it came from (for the plan's notes)."""


@dataclass(frozen=True)
class Planned:
    """What the pipeline made for one graph.

    Attributes:
        view: the analysis view planned on (of the cut graph, when ops were
            cut; before the swaps, recomputations and order edges).
        plan: the plan (possibly empty: its notes say why).
        tuning: the auto-tuner's result when ``memory_budget`` chose the plan.
        splits: the ops cut into row chunks (``max_op_bytes``).
    """

    view: nx.DiGraph
    plan: SwapPlan
    tuning: AutotuneResult | None = None
    splits: tuple[Split, ...] = ()


class Pipeline:
    """The pipeline for one set of options: target and devices resolved once (module docstring).

    Args:
        config: the options every stage reads.
        target: what plans are made for; default ``config.target()``.
        local: the graphs are of this process, so ``config.device`` and
            ``config.host_device`` must be devices of this machine (checked
            here); False for a SavedModel, which may train elsewhere.

    Raises:
        ConfigError: a device option names no device of this machine
            (``local``), the target cannot be resolved from ``config``, or
            ``swap=False`` leaves no lever on (the pipeline would plan nothing).
    """

    def __init__(self, config: LMSConfig, target: Target | None = None, *, local: bool = True):
        levers = (
            config.swap
            or config.recompute
            or config.reorder
            or config.serialization
            or config.offload_weights
        )
        if not levers and config.memory_budget is None:
            raise ConfigError(
                "LMSConfig(swap=False) with no other lever plans nothing: set recompute=True, "
                "reorder=True and/or offload_weights=True (or a memory_budget, to let the auto-tuner choose them), "
                "or leave swap on."
            )
        if local:
            check_local_device("host_device", config.host_device)
            check_local_device("device", config.device)
        self.config = config
        self.target = config.target() if target is None else target
        self.local = local

    def view(self, graph: tf.Graph, *known: Known, fix: str = "LMSConfig(batch_size=N)"):
        """The analysis view of ``graph``, sized by the batch rule; refused if the batch is unknown.

        Args:
            graph: a ``tf.Graph`` or ``FuncGraph`` (only read).
            *known: the batch sizes the front end knows, most trusted first
                (:func:`~tflms.graph.view.resolve_batch`).
            fix: how the user passes a batch size, for the error.

        Returns:
            The view (:func:`~tflms.graph.view.build_view`).

        Raises:
            ConfigError: the graph has an open batch dimension and no batch
                size was found.
        """
        batch = resolve_batch(self.config, *known)
        reason = next((source for size, source in known if size is None and source), None)
        view = build_view(
            graph,
            config=self.config,
            batch_size=batch[0] if batch else None,
            batch_source=batch[1] if batch else None,
        )
        require_batch_size(view, fix=fix, reason=reason)
        return view

    def plan(
        self, view: nx.DiGraph, graph: tf.Graph | None = None, *, outputs: Any = None
    ) -> tuple[SwapPlan, AutotuneResult | None]:
        """``(plan, tuning)``: the levers' plan, or the auto-tuned one with ``memory_budget``.

        With ``graph`` (and ``LMSConfig.check_rewrites``), the plan is checked
        against Grappler and made again without the ops it rewrites
        differently, until Grappler treats the step alike with and without it
        (:meth:`keep_rewrites`).

        Args:
            view: the analysis view of one training graph (without tflms ops).
            graph: the graph ``view`` was built from, to check the plan on;
                None plans without the check.
            outputs: what the step's function returned (a ``FuncGraph`` being
                traced has no outputs yet); None: the graph's sinks.

        Returns:
            ``(plan, tuning)``; ``tuning`` is None without a budget.

        Raises:
            PlanInfeasibleError: with ``memory_budget``, no plan fits.
        """
        plan, tuning = self._plan(view)
        if graph is None or not self.config.check_rewrites or plan.empty:
            return plan, tuning
        return self.keep_rewrites(view, graph, outputs, plan, tuning)

    def keep_rewrites(
        self,
        view: nx.DiGraph,
        graph: tf.Graph,
        outputs: Any,
        plan: SwapPlan,
        tuning: AutotuneResult | None,
    ) -> tuple[SwapPlan, AutotuneResult | None]:
        """Plan again until Grappler rewrites the step alike with and without the plan.

        Each round runs Grappler offline on the step with the plan
        (:class:`~tflms.simulation.grappler.rewrites.RewriteGuard`), pins the
        ops it treats differently in ``view``
        (:data:`~tflms.graph.grappler_rules.PINNED`) and plans again; a
        plan Grappler agrees with is returned with a note. After
        :data:`CHECK_ROUNDS` rounds, or when a round pins nothing new, the last
        plan is kept with a warning and a note naming the differences.

        Returns:
            ``(plan, tuning)`` as :meth:`plan`.

        Raises:
            PlanInfeasibleError: with ``memory_budget``, no plan fits once the
                ops are pinned (the message says so, and names the way out).
        """
        from tflms.simulation.grappler.rewrites import (  # Grappler: only when a plan is made
            RewriteGuard,
            check_device,
            pins,
            step_fetches,
        )

        guard = RewriteGuard(
            graph,
            fetches=step_fetches(graph, outputs),
            device=check_device(view),
            host_device=self.config.host_device,
            batch_size=view.graph.get("batch_size"),
            memory_bytes=self.target.device.memory_bytes,
        )
        pinned = frozenset(view.graph.get(PINNED, ()))
        not_recomputed = frozenset(view.graph.get(NOT_RECOMPUTED, ()))
        for rounds in range(1, CHECK_ROUNDS + 1):
            check = guard.check(plan)
            full, recompute_only = pins(check, view, plan)
            found = (full - pinned) | (recompute_only - not_recomputed)
            if not check.agree:
                logger.info(
                    "tflms: Grappler check, round %d: %s\npinned: %s; kept from recomputation: %s",
                    rounds,
                    check.summary(10),
                    _names(full, 12),
                    _names(recompute_only, 12),
                )
            if check.agree or not found or rounds == CHECK_ROUNDS:
                break
            pinned |= full
            not_recomputed |= recompute_only
            view.graph.update({PINNED: pinned, NOT_RECOMPUTED: not_recomputed})
            try:
                plan, tuning = self._plan(view)
            except PlanInfeasibleError as err:
                raise PlanInfeasibleError(
                    f"{err}\n(after Grappler's check pinned {len(pinned | not_recomputed)} op(s) "
                    f"whose rewrite a plan changed: {_names(pinned | not_recomputed)}. "
                    "LMSConfig(check_rewrites=False) allows plans that change the step's float "
                    "arithmetic in the last bits.)",
                    budget_bytes=err.budget_bytes,
                    best_peak_bytes=err.best_peak_bytes,
                    usable_bytes=err.usable_bytes,
                ) from err
            _keeps_pins(view, plan)
            if plan.empty:
                break
        kept = f"{len(pinned)} op(s) pinned" + (f": {_names(pinned)}" if pinned else "")
        if not_recomputed:
            kept += f", {len(not_recomputed)} kept from recomputation: {_names(not_recomputed)}"
        if plan.empty or check.agree:
            note = f"Grappler rewrites the step alike with and without the plan ({rounds} round(s), {kept})"
            if plan.empty:
                note = f"Grappler rewrote every plan differently; nothing is moved ({kept})"
        else:
            note = (
                f"not bit for bit: {check.summary(3)}\n(after {rounds} round(s), {kept}; "
                "LMSConfig.check_rewrites=False skips the check)"
            )
            logger.warning("tflms: %s: %s", view.graph.get("name") or "graph", note)
        plan = dataclasses.replace(plan, notes=(*plan.notes, note))
        if tuning is not None:  # the tuning's plan is the one applied
            tuning = dataclasses.replace(tuning, plan=plan)
        return plan, tuning

    def _plan(self, view: nx.DiGraph) -> tuple[SwapPlan, AutotuneResult | None]:
        if self.config.memory_budget is None:
            return compose_plan(view, self.config, self.target), None
        from tflms.tuning.autotuner import autotune  # the simulator: only with a budget

        tuning = autotune(view, config=self.config, target=self.target)
        return tuning.plan, tuning

    def cut(self, graph: tf.Graph, view: nx.DiGraph, *known: Known):
        """Cut the ops larger than ``max_op_bytes`` into row chunks: ``(view, splits)``.

        The cut rewrites ``graph`` (a ``tf.Graph`` still being built) before
        anything is planned, and the view is built again from the cut graph,
        sized by the same batch.

        Returns:
            ``(view of the graph as it now is, the splits made)``; the view
            given back unchanged when nothing is cut.
        """
        max_op_bytes = self.config.max_op_bytes
        splits = plan_splits(view, max_op_bytes)
        deferrals = plan_deferrals(view, max_op_bytes)
        if not splits and not deferrals:
            return view, splits
        inserted = split_graph(graph, splits, self.config.host_device, deferrals)
        logger.info(
            "tflms: split %d ops of %s into row chunks (%d ops inserted)",
            len(splits),
            view.graph.get("name") or "graph",
            inserted,
        )
        return finish_view(self.view(graph, *known), splits), splits

    def run(self, graph: tf.Graph, *known: Known, into: Any = None, outputs: Any = None) -> Planned:
        """Analyse, cut, plan, rewrite ``graph`` in place and validate it.

        Args:
            graph: a ``tf.Graph`` or ``FuncGraph`` of this process, still
                being built (for a ``FuncGraph``: before tracing ends).
            *known: the batch sizes the front end knows, most trusted first.
            into: an object whose ``view``, ``splits`` and ``tuning``
                attributes are set as soon as each is known (:class:`tflms.LMS`:
                so that they are there to inspect when a later stage raises).
            outputs: what the step's function returned, for the Grappler
                check (:meth:`plan`) and the view's ``returns`` (what the
                simulator keeps of a step still being traced); None: the
                graph's sinks.

        Returns:
            The :class:`Planned` view, plan, tuning and splits.

        Raises:
            AlreadyRewrittenError: ``graph`` already holds tflms swap ops.
            ConfigError: the batch size is unknown.
            ValidationError: the rewritten graph breaks an invariant.
            PlanInfeasibleError: with ``memory_budget``, no plan fits.
        """
        view = self.view(graph, *known)
        _tell(into, view=view, splits=(), tuning=None)
        rewritten = [n for n, d in view.nodes(data=True) if d["tflms"]]
        if rewritten:
            raise AlreadyRewrittenError(
                f"Graph {view.graph['name']!r} was already rewritten by tflms "
                f"({len(rewritten)} swap ops, e.g. {rewritten[0]!r}); run LMS once per graph."
            )
        view, splits = self.cut(graph, view, *known)
        if outputs is not None and view.graph.get("returns") is None:
            # a step still being traced has no results yet: what its function returned are
            # they, so the simulator prunes what TensorFlow will not run (simulation.bypass)
            from tflms.simulation.grappler.rewrites import step_fetches

            view.graph["returns"] = tuple(sorted(step_fetches(graph, outputs) or ())) or None
        _tell(into, view=view, splits=tuple(splits))
        plan, tuning = self.plan(view, graph, outputs=outputs)
        _tell(into, tuning=tuning)
        if plan.empty:  # a plan may recompute or order without swapping: it is applied then
            logger.info(
                "tflms: nothing to swap, recompute or reorder in %s\n%s",
                plan.graph_name,
                plan.summary(),
            )
        else:
            apply_plan(graph, plan)
            validate(graph, plan)
        return Planned(view, plan, tuning, tuple(splits))


def _keeps_pins(view: nx.DiGraph, plan: SwapPlan) -> None:
    """Refuse a plan that touches an op Grappler's check pinned.

    Every lever refuses pinned ops by itself; this is the one place that
    holds them all to it, so a lever that forgets fails here instead of
    changing the step's float arithmetic.

    Raises:
        ValidationError: naming the pinned ops the plan touches and how.
    """
    broken = pins_broken(view, plan)
    if broken:
        listed = "; ".join(
            f"{op} ({', '.join(sorted(roles))})" for op, roles in sorted(broken.items())[:8]
        )
        raise ValidationError(
            f"tflms: the plan for {view.graph.get('name') or 'the graph'} touches "
            f"{len(broken)} op(s) Grappler's check pinned: {listed}. This is a tflms bug "
            "(please report it with the model); LMSConfig(check_rewrites=False) plans without "
            "the check, and the step may then differ from plain training in the last bits."
        )


def _names(ops, limit: int = 4) -> str:
    shown = sorted(ops)[:limit]
    return ", ".join(shown) + (f" and {len(ops) - limit} more" if len(ops) > limit else "")


def _tell(into: Any, **facts: Any) -> None:
    if into is not None:
        for name, value in facts.items():
            setattr(into, name, value)


def make_plan(
    view: nx.DiGraph, config: LMSConfig | None = None, *, target: Target | None = None
) -> SwapPlan:
    """Plan recomputations, swaps and order edges for ``view`` under fixed options.

    The pipeline's plan stage without the auto-tuner: ``memory_budget``, if
    set, only names the device the levers are timed on (use
    :func:`tflms.autotune` to fit a budget).

    Args:
        view: the analysis view of a graph (from :func:`tflms.build_view`).
        config: planner options; defaults to ``LMSConfig()`` (swaps only).
        target: the device the recomputations are timed on and the link
            ordering simulates; default ``config.target()``, so that a config
            always reproduces its plan.

    Returns:
        The :class:`~tflms.SwapPlan`; possibly empty, in which case
        ``plan.skipped`` and ``plan.notes`` say why (an example:
        :mod:`tflms.compose.levers`).
    """
    config = config or LMSConfig()
    return compose_plan(view, config, config.target() if target is None else target)
