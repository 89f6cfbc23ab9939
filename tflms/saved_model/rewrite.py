"""Analyse, plan and rewrite every training graph of a saved model.

The model-level pipeline behind ``tflms analyze | simulate | rewrite``:

1. :func:`analyze_model` imports each target that trains (see
   :mod:`tflms.saved_model.read`) into a ``tf.Graph`` - shape inference only -,
   and runs the pipeline's analysis and plan stages on it
   (:class:`tflms.pipeline.Pipeline`: the view, then the levers' plan or,
   with ``memory_budget``, the one :func:`tflms.autotune` chooses). Nothing
   is modified.
2. :func:`rewrite_model` applies the plans to a *copy* of the model through
   :class:`tflms.apply.proto_editor.ProtoEditor` and the shared applier core, then
   re-imports every rewritten graph and checks it with :func:`tflms.validate`.
   Targets that do not train are not touched: their bytes stay identical.

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tflms import LMSConfig
    >>> from tflms.saved_model.read import read_model
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [64, 1024], name="x")
    ...     w = tf.compat.v1.get_variable("w", [1024, 1024], use_resource=True)
    ...     h = x
    ...     for i in range(8):
    ...         h = tf.nn.relu(h @ w, name=f"relu{i}")
    ...     train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(h))
    >>> path = os.path.join(tempfile.mkdtemp(), "train.pb")
    >>> _ = tf.io.write_graph(g, os.path.dirname(path), "train.pb", as_text=False)
    >>> analysis = analyze_model(read_model(path), LMSConfig(swapout_threshold=4, min_tensor_bytes=0))
    >>> [(t.name, len(t.plan.swaps)) for t in analysis.training]
    [('graph', 7)]
    >>> rewritten = rewrite_model(analysis)
    >>> sum(n.name.startswith("lms/swapout_") for n in rewritten.message.node)
    7
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from tflms.apply.core import apply_with
from tflms.apply.proto_editor import ProtoEditor
from tflms.apply.validation import validate
from tflms.config import LMSConfig
from tflms.errors import AlreadyRewrittenError, ConfigError
from tflms.graph.view import SWAP_ATTR, build_view
from tflms.pipeline import Pipeline
from tflms.plan.swap_plan import SwapPlan
from tflms.saved_model.read import Model, Target

if TYPE_CHECKING:  # the auto-tuner (and simulator) load only when a budget is set
    from tflms.tuning.autotuner import AutotuneResult

__all__ = ["TargetAnalysis", "ModelAnalysis", "analyze_model", "rewrite_model"]

logger = logging.getLogger(__name__)


@dataclass
class TargetAnalysis:
    """The analysis of one training graph or function.

    Attributes:
        target: the graph or function.
        view: its analysis view (:func:`tflms.build_view`).
        plan: the swap plan for it.
        tuning: the :func:`tflms.autotune` result when a memory budget chose the plan.
    """

    target: Target
    view: nx.DiGraph
    plan: SwapPlan
    tuning: AutotuneResult | None = None

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def arguments(self) -> frozenset:
        """Names of a function's arguments (placeholders or variable handles in the view)."""
        if self.target.kind != "function":
            return frozenset()
        return frozenset(arg.name for arg in self.target.proto.signature.input_arg)

    def op_types(self, top: int = 8) -> list[tuple[str, int]]:
        """The most common op types of the body (a function's arguments left out).

        Args:
            top: How many op types to list at most.

        Returns:
            ``(op type, count)`` pairs, most common first.
        """
        args = self.arguments
        types = Counter(d["type"] for n, d in self.view.nodes(data=True) if n not in args)
        return types.most_common(top)

    def devices(self) -> dict[str, int]:
        args = self.arguments
        counts = Counter(
            d["device"] or "(unassigned)" for n, d in self.view.nodes(data=True) if n not in args
        )
        return dict(counts.most_common())

    def to_dict(self) -> dict:
        """JSON-ready facts and the plan."""
        g = self.view.graph
        return {
            "name": self.name,
            "kind": self.target.kind,
            "ops": self.view.number_of_nodes() - len(self.arguments),
            "arguments": len(self.arguments),
            "gradient_ops": self.target.gradient_ops,
            "depth": g.get("depth"),
            "op_types": dict(self.op_types()),
            "devices": self.devices(),
            "batch_size": g.get("batch_size"),
            "batch_source": g.get("batch_source"),
            "unsized_resources": self.target.unsized_resources,
            "swaps": len(self.plan.swaps),
            "bytes_swapped": self.plan.bytes_swapped,
            "plan": self.plan.to_dict(),
        }


@dataclass
class ModelAnalysis:
    """The analysis of a whole model.

    Attributes:
        model: the parsed model (never modified).
        config: the options used.
        targets: every graph and function of the model.
        training: analyses of the targets that train, in model order.
    """

    model: Model
    config: LMSConfig
    targets: list[Target]
    training: list[TargetAnalysis] = field(default_factory=list)

    @property
    def swaps(self) -> int:
        return sum(len(t.plan.swaps) for t in self.training)

    @property
    def changed(self) -> list:
        """The training graphs whose plans change something (swaps, recomputes or order)."""
        return [t for t in self.training if not t.plan.empty]

    @property
    def plans(self) -> dict[str, SwapPlan]:
        return {t.name: t.plan for t in self.training}

    def with_plans(self, plans: dict[str, SwapPlan]) -> ModelAnalysis:
        """This analysis with the plans of some targets replaced (``tflms rewrite --plan``).

        Args:
            plans: ``{training graph name: plan}``, typically read from a plan
                file; targets not named keep their plan.

        Returns:
            A new analysis; this one is unchanged.

        Raises:
            ConfigError: ``plans`` names a graph that is not one of the model's
                training graphs.
        """
        names = {t.name for t in self.training}
        unknown = sorted(set(plans) - names)
        if unknown:
            raise ConfigError(
                f"The plan file names graphs {unknown} that are not training graphs of "
                f"'{self.model.path}'; its training graphs are {sorted(names)}. Make the plan "
                "from this model: `tflms rewrite SRC DST --dry-run > plan.json`."
            )
        training = [
            TargetAnalysis(t.target, t.view, plans.get(t.name, t.plan), t.tuning)
            for t in self.training
        ]
        return ModelAnalysis(self.model, self.config, self.targets, training)


def analyze_model(
    model: Model, config: LMSConfig | None = None, *, progress=None, plan: bool = True
) -> ModelAnalysis:
    """Analyse and plan every training target of ``model`` (which is not modified).

    Args:
        model: from :func:`tflms.saved_model.read.read_model`.
        config: planner options; defaults to ``LMSConfig()``.
        progress: an object with ``stage(text)`` (see :mod:`tflms.cli.progress`).
        plan: make plans; ``False`` analyses only (plans read from a file
            replace them, see :meth:`ModelAnalysis.with_plans`), and then an
            open batch dimension is no error.

    Returns:
        The :class:`ModelAnalysis`: every target, and a view and plan per training target.

    Raises:
        UnsupportedGraphError: a training graph cannot be imported or analysed
            (unknown op types, inconsistent graph).
        AlreadyRewrittenError: a training graph already holds tflms swap ops.
        ConfigError: a training graph has an open batch dimension and
            ``config.batch_size`` is not set (sizes would be per sample), or
            ``config.max_op_bytes`` is set (splits apply to traced steps only).
        PlanInfeasibleError: with ``memory_budget``, no plan fits.
    """
    config = config or LMSConfig()
    if config.offload_optimizer or config.offload_weights:
        raise ConfigError(
            "offload_optimizer and offload_weights keep a training model's state on the host, "
            "and a SavedModel's variables live where its loader puts them. Drop them here, or "
            "train with LMSCallback(offload_optimizer=True) / LMSCallback(offload_weights=True)."
        )
    if config.max_op_bytes is not None:
        raise ConfigError(
            f"max_op_bytes={config.max_op_bytes} (the split of ops larger than a plan can hold) "
            "is applied to traced train steps only: train with tflms.LMSCallback or "
            "@tflms.function to use it; a SavedModel is rewritten without splits, so leave "
            "max_op_bytes unset here."
        )
    pipeline = Pipeline(config, local=False)  # the target resolved once, for every graph
    targets = model.targets()
    analysis = ModelAnalysis(model, config, targets)
    training = [t for t in targets if t.trains]
    for i, target in enumerate(training, 1):
        if progress is not None:
            progress.stage(f"analysing {target.kind} {target.name} ({i}/{len(training)})")
        swapped = [n.name for n in target.nodes if SWAP_ATTR in n.attr]
        if swapped:
            raise AlreadyRewrittenError(
                f"The {target.kind} {target.name!r} of '{model.path}' was already rewritten by "
                f"tflms ({len(swapped)} swap ops, e.g. {swapped[0]!r}). Rewrite the original model."
            )
        if not plan:
            view = build_view(target.import_graph(), config=config)
            view.graph["name"] = target.name
            empty = SwapPlan(graph_name=target.name, config=config)
            analysis.training.append(TargetAnalysis(target, view, empty, None))
            continue
        graph = target.import_graph()
        view = pipeline.view(graph, fix="--batch-size N (LMSConfig(batch_size=N))")
        view.graph["name"] = target.name
        if progress is not None:
            progress.stage(f"planning {target.name} ({view.number_of_nodes()} ops)")
        target_plan, tuning = pipeline.plan(view, graph, outputs=target.fetches())
        analysis.training.append(TargetAnalysis(target, view, target_plan, tuning))
        logger.debug(
            "%s: %d ops, %d swaps", target.name, view.number_of_nodes(), len(target_plan.swaps)
        )
    return analysis


def rewrite_model(analysis: ModelAnalysis, *, progress=None) -> Model:
    """A rewritten copy of ``analysis.model``: every plan applied and validated.

    Args:
        analysis: The model's analysis, with a plan per training graph;
            graphs whose plan changes nothing (no swap, recompute or order
            edge) are left untouched.
        progress: Optional object with a ``stage(text)`` method, told about
            each graph being rewritten; None for silence.

    Returns:
        A new :class:`Model` (the analysed model is not modified).

    Raises:
        ValidationError: a rewritten graph breaks an invariant (a tflms bug).
    """
    rewritten = analysis.model.copy()
    by_name = {t.name: t for t in rewritten.targets()}
    for i, done in enumerate(analysis.training, 1):
        if done.plan.empty:
            continue
        if progress is not None:
            progress.stage(f"rewriting {done.name} ({i}/{len(analysis.training)})")
        target = by_name[done.name]
        inserted = apply_with(ProtoEditor(target.proto, library=target.library), done.plan)
        check = build_view(target.import_graph(), config=analysis.config)
        validate(check, done.plan)
        logger.info("tflms: %s: %d swap ops inserted and validated", done.name, inserted)
    return rewritten
