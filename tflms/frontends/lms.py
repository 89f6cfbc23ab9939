"""LMS: analyse, plan, apply and validate one graph in a single call.

For ``tf.compat.v1`` graphs (Session users) and any ``FuncGraph``; Keras users
use :class:`tflms.LMSCallback`, custom loops :func:`tflms.function`. With
``memory_budget`` the options are auto-tuned (:func:`tflms.autotune`) so the
step fits the budget at the lowest predicted cost.

Example:
    >>> import tensorflow as tf
    >>> import tflms
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [64, 1024], name="x")
    ...     h = tf.nn.relu(tf.matmul(x, tf.ones([1024, 1024])), name="h")
    ...     y = h
    ...     for i in range(12):
    ...         y = tf.nn.relu(y * 1.01, name=f"act{i}")
    ...     out = tf.add(y, h, name="out")  # h lives long: worth swapping
    >>> plan = tflms.LMS(swapout_threshold=10, swapin_ahead=4, min_tensor_bytes=0).run(g)
    >>> [s.tensor for s in plan.swaps]
    ['h:0']
    >>> g.get_operation_by_name("lms/swapout_h_0").device
    '/device:CPU:0'
    >>> small = tf.Graph()
    >>> with small.as_default():
    ...     _ = tf.nn.relu(tf.compat.v1.placeholder(tf.float32, [64, 1024]))
    >>> lms = tflms.LMS(memory_budget="1GiB")  # fits without swapping
    >>> lms.plan(small).swaps, lms.tuning.lms_needed
    ((), False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.pipeline import Pipeline
from tflms.plan.splits import Split
from tflms.plan.swap_plan import SwapPlan

if TYPE_CHECKING:  # the auto-tuner (and simulator) load only when a budget is set
    from tflms.cost.target import Target
    from tflms.tuning.autotuner import AutotuneResult

__all__ = ["LMS", "resolve_config"]


def resolve_config(config: LMSConfig | None, overrides: dict) -> LMSConfig:
    """``config`` (default ``LMSConfig()``) with keyword overrides applied.

    Args:
        config: A base config, or None for the defaults.
        overrides: ``{field name: value}`` to change (the keyword arguments
            of the caller).

    Returns:
        The resulting validated config.

    Raises:
        ConfigError: ``config`` is not an LMSConfig, an override names an
            unknown field, or a value is invalid.
    """
    if config is not None and not isinstance(config, LMSConfig):
        raise ConfigError(f"config must be an LMSConfig, got {type(config).__name__}.")
    config = config or LMSConfig()
    unknown = sorted(set(overrides) - set(LMSConfig.field_names()))
    if unknown:
        raise ConfigError(
            f"Unknown LMS option(s) {unknown}. Valid options: {', '.join(LMSConfig.field_names())}."
        )
    return config.replace(**overrides) if overrides else config


class LMS:
    """Large Model Support for one graph: the pipeline (:mod:`tflms.pipeline`) for one config.

    Args:
        config: an :class:`LMSConfig`; keyword ``overrides`` replace its fields.
        target: the :class:`~tflms.Target` of this config resolved before (a
            front end planning one fit with several configs that differ only
            in levers); default: resolved here.

    Raises:
        ConfigError: an option is invalid, or the target it names cannot be
            resolved (checked here, once; devices are checked at the first
            graph).
    """

    def __init__(
        self, config: LMSConfig | None = None, *, target: Target | None = None, **overrides
    ):
        self.config = resolve_config(config, overrides)
        # device, link, budget, accounting, stack: once
        self.target = self.config.target() if target is None else target
        self.tuning: AutotuneResult | None = None
        self.view = None  # the analysis view of the last graph planned (before any rewrite)
        self.splits: tuple[Split, ...] = ()  # the ops the last run cut into row chunks
        self._pipeline: Pipeline | None = None

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline of this config (made, and the devices checked, at the first graph)."""
        if self._pipeline is None:
            self._pipeline = Pipeline(self.config, self.target)
        return self._pipeline

    @tf.autograph.experimental.do_not_convert
    def plan(
        self, graph: tf.Graph, *, batch_size: int | None = None, batch_source: str | None = None
    ) -> SwapPlan:
        """Analyse ``graph`` and return a plan without changing anything.

        With ``memory_budget`` set, the plan is the one :func:`tflms.autotune`
        picks (kept in :attr:`tuning`); it has no swaps if the step fits.

        Args:
            graph: a ``tf.Graph`` or ``FuncGraph`` of this process.
            batch_size: the batch each step sees, when the graph leaves it
                open (``LMSConfig.batch_size`` wins: :data:`tflms.graph.view.BATCH_RULE`).
            batch_source: where ``batch_size`` came from, for the plan's notes.

        Returns:
            The :class:`SwapPlan` (possibly without swaps; its notes say why).

        Raises:
            ConfigError: a device option names no device of this machine, or
                the batch size is unknown, so tensors could only be sized per
                sample.
            UnsupportedGraphError: the graph has no ops.
            PlanInfeasibleError: with ``memory_budget``, no plan fits.
        """
        _check_graph(graph)
        view = self.pipeline.view(graph, (batch_size, batch_source))
        self.view = view
        plan, self.tuning = self.pipeline.plan(view, graph)
        return plan

    @tf.autograph.experimental.do_not_convert
    def run(
        self,
        graph: tf.Graph,
        *,
        batch_size: int | None = None,
        batch_source: str | None = None,
        known: tuple = (),
        outputs=None,
    ) -> SwapPlan:
        """Plan, rewrite ``graph`` in place, validate it, and return the plan.

        Args:
            graph: a ``tf.Graph`` or ``FuncGraph`` of this process, still
                being built (for a ``FuncGraph``: before tracing ends).
            batch_size: the batch each step sees, as for :meth:`plan`.
            batch_source: where ``batch_size`` came from, for the plan's notes.
            known: further ``(batch size or None, source)`` pairs the caller
                knows, less trusted than ``batch_size`` (a front end's
                fallbacks, e.g. the traced step's leading dimension).
            outputs: what the step's function returned, when ``graph`` is a
                ``FuncGraph`` still being traced: the Grappler check
                (``LMSConfig.check_rewrites``) prunes the step to them and to
                its stateful ops, as TensorFlow will. None: the graph's sinks.

        Returns:
            The :class:`SwapPlan` that was applied.

        Raises:
            ConfigError, UnsupportedGraphError: as for :meth:`plan`.
            AlreadyRewrittenError: ``graph`` already holds tflms swap ops.
            ValidationError: the rewritten graph breaks an invariant.
            PlanInfeasibleError: with ``memory_budget``, no plan fits.
        """
        _check_graph(graph)
        return self.pipeline.run(
            graph, (batch_size, batch_source), *known, into=self, outputs=outputs
        ).plan


def _check_graph(graph) -> None:
    if not isinstance(graph, tf.Graph):
        raise UnsupportedGraphError(
            f"LMS needs a tf.Graph or FuncGraph, got {type(graph).__name__}. For a tf.function "
            "use tflms.function; for a Keras model, tflms.LMSCallback."
        )
    if not graph.get_operations():
        eager = tf.executing_eagerly() and graph is tf.compat.v1.get_default_graph()
        raise UnsupportedGraphError(
            f"The graph {getattr(graph, 'name', '') or ''!r} has no ops, so there is nothing to "
            "plan."
            + (
                " TensorFlow 2 runs eagerly: ops do not go into the default graph. Did you mean "
                "to build the model inside `with graph.as_default():` (or call "
                "tf.compat.v1.disable_eager_execution() first, for Session code), "
                "@tflms.function for a tf.function, or tflms.LMSCallback for Keras?"
                if eager
                else " Build the model into this graph before calling LMS."
            )
        )
