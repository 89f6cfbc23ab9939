"""LMSCallback: Large Model Support for Keras 3 ``fit``.

On ``on_train_begin`` the callback wraps the model's ``train_step`` so that,
at the end of tracing, the train function's own graph (a ``FuncGraph``) is
analysed, planned, rewritten in place and validated; then it rebuilds the
train function (``make_train_function(force=True)``), which Keras 3 reads on
every step. ``evaluate``/``predict`` are untouched. On ``on_train_end`` the
model gets its own ``train_step`` back, so a later ``fit`` without the
callback trains without LMS.

XLA clusters swallow device placement, so LMS cannot work inside them: an
XLA setting Keras chose by itself (``jit_compile="auto"`` on a GPU machine) is
turned off with a warning; ``jit_compile=True`` forced by the user is refused.
"""

from __future__ import annotations

import logging
import sys

import keras
import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.lms import LMS, resolve_config
from tflms.plan.swap_plan import SwapPlan

__all__ = ["LMSCallback"]

logger = logging.getLogger(__name__)


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
        lms = LMS(self.callback.config)
        plan = lms.run(graph)
        self.callback._add_plan(plan, lms.tuning, lms.view)  # noqa: SLF001
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
            nothing fits.
        verbose: 0 is silent; 1 prints the plan summary (and the auto-tuning
            verdict) when the train function is traced.

    Attributes:
        plans: one :class:`~tflms.SwapPlan` per traced train graph, in trace
            order. TensorFlow traces more than once: a first trace that
            creates optimizer variables is discarded, and a smaller last
            batch may cause a retrace with a relaxed batch dimension.
        plan: the plan of the most recent trace - the graph in use
            (``None`` before training).
        tunings: with ``memory_budget``, the
            :class:`~tflms.tuning.autotuner.AutotuneResult` of each trace.
        view: the analysis view of the most recent traced step (see
            :meth:`simulate`).

    Example:
        >>> import keras, numpy as np, tflms
        >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
        ...                           keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> lms = tflms.LMSCallback(swapout_threshold=4, min_tensor_bytes=0, batch_size=8)
        >>> _ = model.fit(np.ones((16, 32)), np.ones((16, 1)), batch_size=8, verbose=0, callbacks=[lms])
        >>> len(lms.plan.swaps) > 0
        True
    """

    def __init__(self, config: LMSConfig | None = None, verbose: int = 0, **overrides):
        super().__init__()
        self.config = resolve_config(config, overrides)
        if not isinstance(verbose, int) or isinstance(verbose, bool) or verbose < 0:
            raise ConfigError(
                f"LMSCallback verbose must be an int >= 0. Received verbose={verbose!r}."
            )
        self.verbose = verbose
        self.plans: list[SwapPlan] = []
        self.tunings: list = []
        self.view = None
        self._original_train_step = None

    @property
    def plan(self) -> SwapPlan | None:
        return self.plans[-1] if self.plans else None

    @property
    def tuning(self):
        """The auto-tuning result of the most recent trace (``None`` without a budget)."""
        return self.tunings[-1] if self.tunings else None

    def simulate(self, **kwargs):
        """Simulate the traced train step without and with :attr:`plan`.

        Keyword arguments go to :func:`tflms.simulate` (``device``, ``link``,
        ``accounting``). Every figure of the result is simulated.

        Raises:
            ConfigError: no train function was traced yet.
        """
        if self.view is None:
            raise ConfigError("LMSCallback.simulate() needs a traced train step: call fit first.")
        from tflms.simulation.simulator import simulate

        return simulate(self.view, self.plan, **kwargs)

    def summary(self) -> str:
        """Readable report of the plan(s): tensors, bytes, per layer."""
        if not self.plans:
            return "LMSCallback: no train function traced yet (call fit first)."
        return "\n".join(p.summary() for p in self.plans)

    # ----------------------------------------------------------------- hooks
    def on_train_begin(self, logs=None):
        model = self.model
        if keras.backend.backend() != "tensorflow":
            raise ConfigError(
                f"LMSCallback rewrites TensorFlow graphs; the Keras backend is {keras.backend.backend()!r}. "
                "Set KERAS_BACKEND=tensorflow before importing keras."
            )
        if model.run_eagerly:
            raise ConfigError(
                "LMSCallback needs a traced train function, but the model runs eagerly. "
                "Compile it with run_eagerly=False."
            )
        _turn_off_xla(model)
        self.plans = []
        self.tunings = []
        self.view = None
        step = model.train_step
        if isinstance(step, _RewritingTrainStep):  # left over from an interrupted fit
            step = step.original
        self._original_train_step = step
        model.train_step = _RewritingTrainStep(step, self)
        model.make_train_function(force=True)

    def on_train_end(self, logs=None):
        self._restore()

    # -------------------------------------------------------------- internals
    def _add_plan(self, plan: SwapPlan, tuning=None, view=None) -> None:
        self.view = view
        self.plans.append(plan)
        if tuning is not None:
            self.tunings.append(tuning)
        if self.verbose > 0:
            text = plan.summary()
            if tuning is not None:
                text = tuning.summary() + ("\n" + text if plan.swaps else "")
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def _restore(self) -> None:
        model = self.model
        if model is None or self._original_train_step is None:
            return
        if "train_step" in vars(model) and isinstance(
            vars(model)["train_step"], _RewritingTrainStep
        ):
            original = self._original_train_step
            if getattr(original, "__self__", None) is model and getattr(
                original, "__func__", None
            ) is getattr(type(model), "train_step", None):
                del model.train_step  # the class's own method again
            else:
                model.train_step = original
        model.train_function = None  # the next fit builds a plain one (or re-rewrites)
        self._original_train_step = None


def _turn_off_xla(model) -> None:
    if tf.config.optimizer.get_jit():
        raise ConfigError(
            f"TensorFlow XLA auto-clustering is on (tf.config.optimizer.get_jit()="
            f"{tf.config.optimizer.get_jit()!r}); XLA clusters ignore the host placement of swap ops. "
            "Call tf.config.optimizer.set_jit(False) (and unset TF_XLA_FLAGS) before training with LMS."
        )
    if not model.jit_compile:
        return
    resolve = getattr(model, "_resolve_auto_jit_compile", None)
    chosen_by_keras = bool(resolve and resolve())
    if not chosen_by_keras:
        raise ConfigError(
            "The model was compiled with jit_compile=True, but XLA ignores the host placement of "
            "LMS swap ops. Compile with jit_compile=False to train with LMSCallback."
        )
    logger.warning(
        "LMSCallback: turning off XLA for the train function (Keras enabled it with "
        "jit_compile='auto'); XLA clusters would ignore the swap ops' host placement."
    )
    model.jit_compile = False
