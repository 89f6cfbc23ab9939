"""LMSCallback: Large Model Support for Keras 3 ``fit``.

At the first training step the callback builds the model's train function
around a *rewriting* train step: when TensorFlow traces it, the train
function's own graph (a ``FuncGraph``) is analysed, planned, rewritten in
place and validated, sized for the batch ``fit`` feeds. ``evaluate`` and
``predict`` are untouched. Whatever ends the ``fit`` - success, a plan that
does not fit, an error in another callback or in validation, Ctrl-C - the
model comes out as it went in (see :mod:`tflms.keras.session`), so a later
``fit`` without the callback trains without LMS.

XLA clusters swallow device placement, so LMS cannot work inside them: a
model compiled for XLA trains with XLA off for the rewritten step (one warning says so); TensorFlow's
global XLA auto-clustering is refused with the fix.
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import ConfigError, PlanInfeasibleError
from tflms.frontends.fit_report import FitReport, fit_report, visible_gpu_preset
from tflms.frontends.lms import LMS, resolve_config
from tflms.graph.view import resolve_batch
from tflms.keras.compat import check_keras_version, running_fit
from tflms.keras.offload import (
    check_host,
    check_weights_on_host,
    is_offloaded,
    movable_state_bytes,
    offload_state,
    offload_unbuilt,
    unbuilt_state_bytes,
    variable_bytes,
)
from tflms.keras.session import FitSession, check_xla, fit_batch_size, leading_dim
from tflms.keras.state_trial import device_state_refusal
from tflms.plan.swap_plan import SwapPlan
from tflms.utils.devices import same_device
from tflms.utils.units import format_bytes

if TYPE_CHECKING:
    import networkx as nx

    from tflms.tuning.autotuner import AutotuneResult

__all__ = ["LMSCallback", "Trace"]

logger = logging.getLogger(__name__)


@dataclass
class Trace:
    """One traced train step of a fit: its plan, its auto-tuning, and whether it runs.

    Attributes:
        plan: the plan applied to the traced graph.
        tuning: the :class:`~tflms.tuning.autotuner.AutotuneResult` (with a budget).
        view: the analysis view of the graph before the rewrite.
        input_shapes: the shapes of the batch the step was traced for.
    """

    plan: SwapPlan
    tuning: AutotuneResult | None = None
    view: nx.DiGraph | None = None
    _graph: weakref.ref | None = field(default=None, repr=False)
    input_shapes: tuple = ()

    @property
    def in_use(self) -> bool:
        """Whether TensorFlow kept the traced function (its graph is still alive).

        TensorFlow may trace a step and throw the trace away (a retrace with a
        relaxed shape replaces it); only kept traces run.
        """
        return self._graph is not None and self._graph() is not None


@dataclass
class _Kept:
    """A rewritten train function kept for the next ``fit`` of the same model.

    Keras keeps a model's train function between fits until ``compile`` (or a
    change of ``jit_compile``/``steps_per_execution``) replaces it; the callback
    does the same with its rewritten one, so a second ``fit`` neither retraces
    nor replans. ``key`` holds what invalidates it: the model's optimizer and
    metric objects (``compile`` makes new ones), its step settings, the LMS
    options and the batch size the plans were sized for.
    """

    model: weakref.ref
    key: tuple
    function: object
    traces: list[Trace] = field(default_factory=list)

    @staticmethod
    def _key(model, config: LMSConfig, batch_size: int | None) -> tuple:
        return (
            id(model.optimizer),
            tuple(id(m) for m in model.metrics),
            model.steps_per_execution,
            config,
            batch_size,
        )

    @classmethod
    def of(cls, model, config: LMSConfig, batch_size: int | None, function, traces) -> _Kept:
        return cls(weakref.ref(model), cls._key(model, config, batch_size), function, traces)

    def matches(self, model, config: LMSConfig, batch_size: int | None) -> bool:
        return self.model() is model and self.key == self._key(model, config, batch_size)


class _RewritingTrainStep:
    """Callable standing in for ``model.train_step``; rewrites each traced graph."""

    def __init__(self, original, callback: LMSCallback):
        self.original = original
        self.callback = callback

    def __call__(self, data):
        outputs = self.original(data)
        graph = tf.compat.v1.get_default_graph()
        if tf.executing_eagerly() or not hasattr(graph, "inputs"):
            raise ConfigError(
                "LMSCallback found no graph to rewrite (the train step ran eagerly). "
                "Compile the model with run_eagerly=False."
            )
        callback = self.callback
        lms = callback._lms or LMS(callback.config)  # noqa: SLF001 - the fit's, resolved once
        traced = (leading_dim(data), "the traced step's input tensors")
        try:
            plan = lms.run(
                graph,
                batch_size=callback.batch_size,
                batch_source=callback.batch_source,
                known=(traced,),
                outputs=outputs,
            )
        except PlanInfeasibleError as error:
            advice = callback._state_advice(error)  # noqa: SLF001
            if advice is None:
                raise
            raise PlanInfeasibleError(
                f"{error} {advice}",
                budget_bytes=error.budget_bytes,
                best_peak_bytes=error.best_peak_bytes,
                usable_bytes=error.usable_bytes,
            ) from error
        shapes = tuple(
            tuple(t.shape.as_list()) if t.shape.rank is not None else None
            for t in tf.nest.flatten(data)
            if isinstance(t, tf.Tensor)
        )
        trace = Trace(plan, lms.tuning, lms.view, weakref.ref(graph), shapes)
        self.callback._add_trace(trace)  # noqa: SLF001
        return outputs


class LMSCallback(keras.callbacks.Callback):
    """Swap long-lived activations to host memory while ``fit`` trains.

    Args:
        config: an :class:`~tflms.LMSConfig`; keyword ``overrides`` replace
            its fields (``LMSCallback(swapout_threshold=20)``). With
            ``memory_budget`` (``LMSCallback(memory_budget="16GiB")``) the
            swap options are auto-tuned for each traced step (see
            :func:`tflms.autotune`): no swaps when the step fits, the plan
            with the lowest predicted overhead otherwise, and a
            :class:`~tflms.errors.PlanInfeasibleError` before training if
            nothing fits. Tensors are sized for the batch ``fit`` feeds (its
            ``batch_size``, the dataset's element spec, or its first batch);
            ``batch_size`` in the config wins, and is needed when none of
            those says.
        verbose: 0 is silent; 1 prints the plan summary (and the auto-tuning
            verdict) when the train function is traced.
        **overrides: :class:`~tflms.LMSConfig` fields.

    Raises:
        ConfigError: an option is invalid (at construction), or at the start
            of ``fit``: the model runs eagerly, is compiled for XLA, the
            backend is not TensorFlow, a device option names no device of
            this machine, or the batch size cannot be known.

    Attributes:
        traces: one :class:`Trace` per train step traced during the last
            ``fit``, in trace order.

    Example:
        >>> import keras, numpy as np, tflms
        >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64),
        ...                           keras.layers.LayerNormalization(), keras.layers.Dense(64),
        ...                           keras.layers.LayerNormalization(), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse", jit_compile=False)
        >>> lms = tflms.LMSCallback(swapout_threshold=4, min_tensor_bytes=0)
        >>> _ = model.fit(np.ones((16, 32)), np.ones((16, 1)), batch_size=8, verbose=0, callbacks=[lms])
        >>> len(lms.plan.swaps) > 0, lms.plan.batch_size
        (True, 8)
    """

    def __init__(self, config: LMSConfig | None = None, verbose: int = 0, **overrides):
        super().__init__()
        self.config = resolve_config(config, overrides)
        if not isinstance(verbose, int) or isinstance(verbose, bool) or verbose < 0:
            raise ConfigError(
                f"LMSCallback verbose must be an int >= 0. Received verbose={verbose!r}."
            )
        self.verbose = verbose
        self.traces: list[Trace] = []
        self.fit_reports: list[FitReport] = []
        """Without ``memory_budget`` on a GPU with a preset: whether each traced plan fits it."""
        self.batch_size: int | None = None
        """The batch size tensors are sized for in the last ``fit``."""
        self.batch_source: str | None = None
        """Where :attr:`batch_size` came from (or why it is unknown)."""
        self.reused = False
        """Whether the last ``fit`` reused the rewritten train function of an earlier one."""
        self.state_moved: str | None = None
        """What the last ``fit`` moved to the host to meet ``memory_budget``
        (``offload_optimizer=None``), in words; None when it moved nothing."""
        self._session: FitSession | None = None
        self._kept: _Kept | None = None  # the rewritten train function of the last good fit
        self._function: Any = None  # the rewritten train function of the running fit
        self._lms: LMS | None = None  # the running fit's pipeline: options resolved once

    # -------------------------------------------------------------- results
    @property
    def plans(self) -> list[SwapPlan]:
        """The plans of :attr:`traces`, in trace order."""
        return [t.plan for t in self.traces]

    @property
    def tunings(self) -> list:
        """With ``memory_budget``: the auto-tuning result of each trace."""
        return [t.tuning for t in self.traces if t.tuning is not None]

    @property
    def trace(self) -> Trace | None:
        """The trace in use: the latest one TensorFlow kept (``None`` before ``fit``)."""
        if len(self.traces) > 1:
            gc.collect()  # discarded traces hold reference cycles
        kept = [t for t in self.traces if t.in_use]
        traces = kept or self.traces
        return traces[-1] if traces else None

    @property
    def plan(self) -> SwapPlan | None:
        """The plan of the train step in use (``None`` before ``fit``)."""
        return self.trace.plan if self.trace is not None else None

    @property
    def tuning(self):
        """The auto-tuning result of the train step in use (``None`` without a budget)."""
        return self.trace.tuning if self.trace is not None else None

    @property
    def view(self):
        """The analysis view of the train step in use (see :meth:`simulate`)."""
        return self.trace.view if self.trace is not None else None

    def simulate(self, **kwargs):
        """Simulate the train step in use without and with :attr:`plan`.

        Args:
            **kwargs: passed to :func:`tflms.simulate` (``device``, ``link``,
                ``accounting``, ``stack``, or a ``target``). By default the step
                is simulated on the target the plan was made for
                (``LMSConfig.target()``: ``memory_budget``'s device, ``link``,
                the TensorFlow 2.x stack calibrated with ``tensor_factor``);
                without a budget, on :func:`tflms.simulate`'s default device over
                ``LMSConfig.link``.

        Returns:
            The :class:`~tflms.simulation.simulator.SimulationResult`; every figure is simulated.

        Raises:
            ConfigError: no train function was traced yet.
        """
        if self.view is None:
            raise ConfigError("LMSCallback.simulate() needs a traced train step: call fit first.")
        from tflms.cost.gpu_memory import configured_stack
        from tflms.simulation.simulator import simulate

        if kwargs.get("target") is None and self.config.memory_budget is not None:
            # the target the plan was made for; keywords given here win over it
            names = ("device", "link", "accounting", "stack")
            overrides = {k: kwargs.pop(k, None) for k in names}
            if self._lms is not None and all(v is None for v in overrides.values()):
                kwargs["target"] = self._lms.target  # resolved once, when fit began
            else:
                if overrides["stack"] is not None:  # a stack given here is used as it is
                    overrides["tensor_factor"] = 1.0
                kwargs["target"] = self.config.target(**overrides)
        elif kwargs.get("target") is None:
            kwargs.setdefault("link", self.config.link)
            kwargs.setdefault("stack", configured_stack("tf2", self.config.tensor_factor))
        return simulate(self.view, self.plan, **kwargs)

    def summary(self) -> str:
        """Readable report of each traced step's plan, saying which one runs.

        Returns:
            The plan summaries, each headed by whether its trace is in use.
        """
        if not self.traces:
            return "LMSCallback: no train function traced yet (call fit first)."
        in_use = self.trace
        blocks = (
            [
                "reused from an earlier fit of this model (same compile, same options): not "
                "traced or planned again"
            ]
            if self.reused
            else []
        )
        if self.state_moved:
            blocks.append(self.state_moved)
        for k, t in enumerate(self.traces, 1):
            status = (
                "in use"
                if t is in_use
                else "discarded by TensorFlow (never ran)"
                if not t.in_use
                else "kept by TensorFlow (another input shape)"
                if in_use is None or t.input_shapes != in_use.input_shapes
                else "kept by TensorFlow for the same input shapes (it traced the step again, "
                "e.g. after a first trace created variables)"
            )
            head = f"trace {k} of {len(self.traces)} ({status}):" if len(self.traces) > 1 else ""
            blocks.append((head + "\n" if head else "") + t.plan.summary())
        return "\n".join(blocks)

    # ----------------------------------------------------------------- hooks
    def on_train_begin(self, logs=None):
        """Check the model and find the batch size; nothing on the model changes yet.

        Args:
            logs: Unused (Keras passes None or a dict).

        Raises:
            ConfigError: the Keras backend is not TensorFlow, the model runs
                eagerly, XLA auto-clustering is on, the model trains under a
                ``tf.distribute`` strategy with several replicas, or
                ``host_device``/``device`` is not a device of this machine.
        """
        model = self.model
        if keras.backend.backend() != "tensorflow":
            raise ConfigError(
                f"LMSCallback rewrites TensorFlow graphs; the Keras backend is "
                f"{keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow before importing keras."
            )
        if model.run_eagerly:
            raise ConfigError(
                "LMSCallback needs a traced train function, but the model runs eagerly. "
                "Compile it with run_eagerly=False."
            )
        check_xla(model)
        replicas = model.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            raise ConfigError(
                f"LMSCallback plans one device's training step, but the model trains under "
                f"{type(model.distribute_strategy).__name__} with {replicas} replicas in one "
                "graph, which LMSCallback does not support yet. Train one replica per process "
                "instead: one GPU per rank with ddl_tf (ddlrun -np N train.py, "
                "ddl_tf.keras.DistributedOptimizer), each rank with its own LMSCallback."
            )
        effective = self.config
        if self.config.offload_optimizer is None and is_offloaded(
            getattr(model, "optimizer", None)
        ):
            effective = self.config.replace(offload_optimizer=True)  # moved by an earlier fit
        self._lms = LMS(effective)
        self._lms.pipeline  # noqa: B018 - the devices are checked now, before anything changes
        self.state_moved = None
        if self._session is not None:  # left over from an interrupted fit
            self._session.restore()
        self.traces = []
        self.fit_reports = []
        check_keras_version()
        if self.config.offload_weights:
            check_weights_on_host(model, self.config.host_device)
        if self.config.offload_optimizer or self.config.offload_weights:
            self._offload(model)  # the weights' update runs next to them
        fit = running_fit(model)
        # the batch rule; fit's batch is looked up (it may peek at the data) only when needed
        self.batch_size, self.batch_source = resolve_batch(self.config) or fit_batch_size(fit)
        self._session = FitSession(model)
        if fit is not None:
            self._session.guard_hooks(fit.callbacks)
        kept, self._kept, self._function = self._kept, None, None
        self.reused = kept is not None and kept.matches(model, self.config, self.batch_size)
        if kept is not None and self.reused:
            self.traces = kept.traces  # a retrace (another input shape) appends its plan
            self._function = kept.function

    def on_train_batch_begin(self, batch, logs=None):
        """Install the rewriting train function at the first step.

        Args:
            batch: Index of the batch within the epoch (unused).
            logs: Unused.
        """
        session = self._session
        if session is not None and not session.closed and not session.installed:
            if self._function is None:
                self._state_before_build()
            self._function = session.install(
                _RewritingTrainStep(self.model.train_step, self), self._function
            )

    def on_train_end(self, logs=None):
        """Give the model its own train function back.

        Args:
            logs: Unused.
        """
        if self._session is not None:
            self._session.restore()
            self._session = None
        if self._function is not None and self.traces:  # kept for the next fit of this model
            self._kept = _Kept.of(
                self.model, self.config, self.batch_size, self._function, self.traces
            )

    # -------------------------------------------------------------- internals
    def _offload(self, model) -> None:
        """Put the optimizer's state and update on the host (``offload_optimizer``/``_weights``)."""
        host = self.config.host_device
        if is_offloaded(model.optimizer):
            offloaded = offload_state(model, host)  # the one already there
            check_host(offloaded, host)
            return
        state = [v for v in model.optimizer.variables if len(v.shape)]
        built_on_device = any(not same_device(v.value.device, host) for v in state)
        offload_state(model, host)
        if not built_on_device:  # its slots were made next to weights kept on the host
            logger.info("LMSCallback runs the optimizer's update on %s, next to its state.", host)
            return
        logger.warning(
            "LMSCallback moved the optimizer's state to %s. It had been built on the device "
            "(an earlier fit), so it had to fit there once; to never put it there, compile with "
            "optimizer=tflms.keras.OffloadedOptimizer(your_optimizer, host_device=%r).",
            host,
            host,
        )

    def _state_before_build(self) -> None:
        """With ``offload_optimizer=None``: build a state that cannot fit the device on the host.

        Before the first step builds the optimizer, its state's bytes are
        known from a copy built on the host. When the weights, their gradients
        (all alive when Keras's update runs) and that state already exceed
        the budget (and the weights alone do not), no plan can keep the state
        on the device: the optimizer is wrapped in
        :class:`~tflms.keras.OffloadedOptimizer` and built on the host, so its
        state never exists on the device. When they fit, the first trace
        decides (:meth:`_weigh_state`): the step is planned with a copy of
        the optimizer built on the device first. A fit that then plans no
        step puts the optimizer back, unwrapped (its state stays on the host).
        """
        config, model = self.config, self.model
        if config.offload_optimizer is not None or self._lms is None:
            return
        budget = self._lms.target.budget_bytes
        if budget is None or not model.built:
            return
        state = unbuilt_state_bytes(model, config.host_device)
        if state <= 0:
            return
        host = config.host_device
        weights = variable_bytes(v for v in model.weights if not same_device(v.value.device, host))
        gradients = variable_bytes(model.trainable_variables)
        usable = int(budget * (1.0 - config.safety_margin))
        if weights >= usable:
            return  # moving the state cannot help: the plan's error says what would
        if weights + gradients + state <= usable:
            self._weigh_state(state, gradients)  # the activations decide
            return
        self._build_state_on_host(
            f"memory_budget: the weights ({format_bytes(weights)}), their gradients and the "
            f"optimizer's state ({format_bytes(state)}) exceed the "
            f"{format_bytes(usable)} a plan may use"
        )

    def _weigh_state(self, state: int, gradients: int) -> None:
        """For an optimizer's ``state`` that fits beside the weights and ``gradients``: build
        it on the host when no plan fits the step with it on the device but one may with it on
        the host (:mod:`tflms.keras.state_trial`)."""
        if self._lms is None or self.batch_size is None:
            return  # the first trace's plan says what would fit (_state_advice)
        refusal = device_state_refusal(
            self.model,
            self._lms.config,
            batch_size=self.batch_size,
            batch_source=self.batch_source,
            target=self._lms.target,
        )
        if refusal is None or refusal.best_peak_bytes is None or refusal.usable_bytes is None:
            return  # a plan fits with the state on the device (or the host budget refused)
        least = refusal.best_peak_bytes - state - gradients
        if least > refusal.usable_bytes:
            return  # moving the state cannot be enough: the plan's error says so
        self._build_state_on_host(
            f"memory_budget: with the optimizer's state ({format_bytes(state)}) on the device "
            f"no plan fits the step (the best peaks at {format_bytes(refusal.best_peak_bytes)}, "
            f"over the {format_bytes(refusal.usable_bytes)} a plan may use), though the "
            "weights, their gradients and that state fit beside each other"
        )

    def _build_state_on_host(self, why: str) -> None:
        """Wrap the unbuilt optimizer in OffloadedOptimizer, its state built on the host;
        put back if the fit trains no step; say ``why`` (:attr:`state_moved`)."""
        host = self.config.host_device
        undo = offload_unbuilt(self.model, host)
        lms = self._lms
        target = lms.target if lms is not None else None
        self._lms = LMS(self.config.replace(offload_optimizer=True), target=target)

        def put_back() -> None:
            undo()
            self._lms, self.state_moved = lms, None

        assert self._session is not None  # installed at the first step
        self._session.undo_if_untrained(put_back)
        self.state_moved = (
            f"{why}, so LMSCallback built that state on {host} and runs the update there "
            "(offload_optimizer=None lets it; False forbids it)"
        )
        logger.warning("tflms: %s.", self.state_moved)

    def _state_advice(self, error: PlanInfeasibleError) -> str | None:
        """What moving the optimizer's state would do for a budget no plan met, or None.

        Keras's ``compile`` keeps the optimizer object it was given, so a
        state built on the device stays there whatever the callback does; it
        can only be built on the host to begin with (:meth:`_state_before_build`,
        or ``offload_optimizer=True``). This says which.

        Args:
            error: What the auto-tuner raised for the first trace.

        Returns:
            A sentence for the error, or None when the state was not weighed
            (offloaded already, sharded, ``offload_optimizer=False``, or the
            host budget is what no plan met).
        """
        if self.config.offload_optimizer is False:
            return None
        if error.usable_bytes is None or error.best_peak_bytes is None:
            return None  # the host budget, not the device's, is what no plan met
        state = movable_state_bytes(self.model, self.config.host_device)
        if state <= 0:
            return None
        least = error.best_peak_bytes - state - variable_bytes(self.model.trainable_variables)
        if least > error.usable_bytes:
            return (
                f"Moving the optimizer's state ({format_bytes(state)}) to the host would not be "
                f"enough: with it and the gradients gone the step would still need "
                f"{format_bytes(least)} or more, so the weights must leave the device too "
                "(offload_weights, above)."
            )
        return (
            f"With the optimizer's state ({format_bytes(state)}) on the host a plan may fit "
            f"(the step less the state and the gradients: {format_bytes(least)}): pass "
            "LMSCallback(offload_optimizer=True), which builds the state there before the "
            "first step. (The callback builds it there by itself before the state exists, "
            "from a trace of the step with a copy of the optimizer; this state was built on "
            "the device before (an earlier fit), or the step could not be traced ahead (a "
            "subclassed model, see the log), and Keras's compile keeps it there.)"
        )

    def _add_trace(self, trace: Trace) -> None:
        self.traces.append(trace)
        if self.config.memory_budget is None and trace.view is not None:
            preset = visible_gpu_preset()
            if preset is not None:  # a real GPU with a preset: say whether the plan fits it
                self._report_fit(trace, preset)
        if self.verbose > 0:
            text = trace.plan.summary()
            if trace.tuning is not None:
                text = trace.tuning.summary() + ("" if trace.plan.empty else "\n" + text)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def _report_fit(self, trace: Trace, preset: str) -> None:
        """Log whether ``trace``'s plan fits the ``preset`` GPU (warning when it does not)."""
        from tflms.cost.gpu_memory import configured_stack

        stack = configured_stack("tf2", self.config.tensor_factor)
        report = fit_report(trace.view, trace.plan, preset, stack=stack, link=self.config.link)
        self.fit_reports.append(report)
        if report.fits:
            logger.info("%s", report.message)
        else:
            logger.warning("%s", report.message)
