"""``tflms.function``: a ``tf.function`` whose traced graphs swap to host memory.

For custom training loops. Each time TensorFlow traces the function, the
graph being traced is planned, rewritten in place and validated at the end of
the Python body, before TensorFlow turns it into a function.

An :class:`LMSFunction` *is* a ``tf.function`` (a subclass of TensorFlow's
``Function``), so everything a ``tf.function`` offers works unchanged:
``get_concrete_function``, ``experimental_get_tracing_count``,
``input_signature``, ``function_spec``, methods of classes (bound per
instance, as TensorFlow binds them), tracking by ``tf.Module`` and export by
``tf.saved_model.save``. It adds :attr:`LMSFunction.plans` and
:meth:`LMSFunction.plan_for`, bound or not.

Example:
    >>> import tensorflow as tf, tflms
    >>> w = tf.Variable(tf.ones([256, 256]))
    >>> @tflms.function(config=tflms.LMSConfig(swapout_threshold=4, min_tensor_bytes=0))
    ... def step(x):
    ...     with tf.GradientTape() as tape:
    ...         h = x
    ...         for _ in range(4):
    ...             h = tf.nn.relu(h @ w)
    ...         loss = tf.reduce_sum(h)
    ...     w.assign_sub(0.001 * tape.gradient(loss, w))
    ...     return loss
    >>> _ = step(tf.ones([8, 256]))
    >>> plan = step.plan_for(tf.ones([8, 256]))
    >>> len(plan.swaps) > 0, step.experimental_get_tracing_count()
    (True, 1)
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.util import tf_decorator

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.frontends.lms import resolve_config
from tflms.pipeline import Pipeline
from tflms.plan.swap_plan import SwapPlan

__all__ = ["function", "LMSFunction"]

_STATE_ATTR = "_tflms_state"


class _LMSState:
    """What an LMS function and all its bound copies share: the pipeline and the plans."""

    def __init__(self, config: LMSConfig):
        self.config = config
        self.target = config.target()  # resolved once, for every trace
        self._pipeline: Pipeline | None = None  # made, and the devices checked, at the first trace
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def wrap(self, fn):
        """``fn`` followed by the rewrite of the graph it is being traced into.

        The wrapper itself is not converted by AutoGraph (so tflms' own errors
        reach the caller as they are, not as ``StagingError``); ``fn`` is, as
        ``tf.function`` would convert it (it follows the ``autograph`` option).
        """

        @functools.wraps(fn)
        @tf.autograph.experimental.do_not_convert
        def traced(*args, **kwargs):
            body = tf.__internal__.autograph.tf_convert(
                fn, ctx=tf.__internal__.autograph.control_status_ctx()
            )
            outputs = body(*args, **kwargs)
            graph = tf.compat.v1.get_default_graph()
            if self._pipeline is None:
                self._pipeline = Pipeline(self.config, self.target)
            # only the plan is kept (with the graph): views and tunings go with the trace
            self.plans[graph] = self._pipeline.run(graph, outputs=outputs).plan
            return outputs

        setattr(traced, _STATE_ATTR, self)
        return traced


def _state_of(python_function) -> _LMSState | None:
    """The shared state when TensorFlow re-creates an LMS function for a bound method."""
    seen = set()
    fn = python_function
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        state = getattr(fn, _STATE_ATTR, None)
        if isinstance(state, _LMSState):
            return state
        fn = getattr(fn, "__func__", None) or getattr(fn, "__wrapped__", None)
    return None


class LMSFunction(polymorphic_function.Function):
    """A ``tf.function`` that rewrites every graph it traces (see :func:`function`).

    Args:
        python_function: the Python function to trace.
        name: the function's name.
        config: LMS options (``LMSConfig()`` by default).
        **function_kwargs: ``tf.function`` options (``input_signature``,
            ``reduce_retracing``, ``autograph``, ...).

    Raises:
        ConfigError: ``jit_compile=True`` (XLA ignores the swap ops' placement)
            or XLA auto-clustering is on.
    """

    def __init__(self, python_function, name, config: LMSConfig | None = None, **function_kwargs):
        if function_kwargs.get("jit_compile"):
            raise ConfigError(
                "tflms.function does not accept jit_compile=True: XLA clusters ignore the host "
                "placement of swap ops. Drop jit_compile or pass jit_compile=False."
            )
        if tf.config.optimizer.get_jit():
            raise ConfigError(
                "TensorFlow XLA auto-clustering is on; call tf.config.optimizer.set_jit(False) "
                "before using tflms.function."
            )
        state = _state_of(python_function)
        if state is None:  # a new LMS function (not TensorFlow binding one to an instance)
            state = _LMSState(resolve_config(config, {}))
            if state.config.offload_optimizer:
                raise ConfigError(
                    "tflms.function cannot move an optimizer (it only sees the traced graph), "
                    "so LMSConfig(offload_optimizer=True) means nothing here. Create the "
                    "optimizer as tflms.keras.OffloadedOptimizer(keras.optimizers.AdamW(...)) "
                    "in your loop instead; the plan then sees its state on the host."
                )
            python_function = state.wrap(python_function)
        self._lms_state = state
        super().__init__(python_function, name, **function_kwargs)

    @property
    def config(self) -> LMSConfig:
        """The LMS options."""
        return self._lms_state.config

    @property
    def plans(self) -> list[SwapPlan]:
        """Plans of the graphs traced so far that are still alive (one per concrete function)."""
        return list(self._lms_state.plans.values())

    def plan_for(self, *args, **kwargs) -> SwapPlan:
        """The plan of the concrete function for these arguments (traces if needed).

        Args:
            *args: arguments as for a call (tensors or ``tf.TensorSpec``).
            **kwargs: keyword arguments as for a call.

        Returns:
            The :class:`~tflms.SwapPlan` applied to that concrete function's graph.
        """
        graph = self.get_concrete_function(*args, **kwargs).graph
        return self._lms_state.plans[graph]


def function(fn=None, *, config: LMSConfig | None = None, **tf_function_kwargs):
    """Decorator like ``tf.function`` that applies Large Model Support.

    Args:
        fn: the Python function (omit to use ``@tflms.function(config=...)``).
        config: LMS options; defaults to ``LMSConfig()``.
        **tf_function_kwargs: passed to ``tf.function`` (``input_signature``,
            ``reduce_retracing``, ...). ``jit_compile=True`` is refused.

    Returns:
        An :class:`LMSFunction` (a ``tf.function``); ``.plans`` and
        ``.plan_for(*args)`` expose the plans of its concrete functions.

    Raises:
        ConfigError: ``config`` is not an ``LMSConfig``, or ``jit_compile=True``.
    """
    if config is not None and not isinstance(config, LMSConfig):
        raise ConfigError(f"config must be an LMSConfig, got {type(config).__name__}.")
    unknown = sorted(set(tf_function_kwargs) - _TF_FUNCTION_OPTIONS)
    if unknown:
        raise ConfigError(
            f"tflms.function got unknown option(s) {unknown}; it takes config= and the options "
            f"of tf.function: {', '.join(sorted(_TF_FUNCTION_OPTIONS))}."
        )

    def decorate(inner):
        name = getattr(inner, "__name__", "function")
        lms_function = LMSFunction(inner, name, config=config, **tf_function_kwargs)
        return tf_decorator.make_decorator(
            inner, decorator_name="tflms.function", decorator_func=lms_function
        )

    return decorate if fn is None else decorate(fn)


_TF_FUNCTION_OPTIONS = frozenset(
    {
        "input_signature",
        "autograph",
        "jit_compile",
        "reduce_retracing",
        "experimental_implements",
        "experimental_autograph_options",
        "experimental_attributes",
    }
)
