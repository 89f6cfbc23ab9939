"""``tflms.function``: a ``tf.function`` whose traced graphs swap to host memory.

For custom training loops. Each time TensorFlow traces the function, the
graph being traced is planned, rewritten in place and validated at the end of
the Python body, before TensorFlow turns it into a function.

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
    >>> len(plan.swaps) > 0
    True
"""

from __future__ import annotations

import functools
import weakref

import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.lms import LMS, resolve_config
from tflms.plan.swap_plan import SwapPlan

__all__ = ["function", "LMSFunction"]


class LMSFunction:
    """A ``tf.function`` that rewrites every graph it traces (see :func:`function`)."""

    def __init__(self, fn, config: LMSConfig | None, tf_function_kwargs: dict):
        if tf_function_kwargs.get("jit_compile"):
            raise ConfigError(
                "tflms.function does not accept jit_compile=True: XLA clusters ignore the host "
                "placement of swap ops. Drop jit_compile or pass jit_compile=False."
            )
        if tf.config.optimizer.get_jit():
            raise ConfigError(
                "TensorFlow XLA auto-clustering is on; call tf.config.optimizer.set_jit(False) "
                "before using tflms.function."
            )
        self.config = resolve_config(config, {})
        self._fn = fn
        self._plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            outputs = fn(*args, **kwargs)
            graph = tf.compat.v1.get_default_graph()
            self._plans[graph] = LMS(self.config).run(graph)
            return outputs

        self._tf_function = tf.function(traced, **tf_function_kwargs)
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self._tf_function(*args, **kwargs)

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return self._tf_function.__get__(instance, owner)

    def get_concrete_function(self, *args, **kwargs):
        """Trace (if needed) and return the concrete function, as ``tf.function`` does."""
        return self._tf_function.get_concrete_function(*args, **kwargs)

    @property
    def python_function(self):
        return self._fn

    @property
    def plans(self) -> list[SwapPlan]:
        """Plans of the graphs traced so far (one per concrete function)."""
        return list(self._plans.values())

    def plan_for(self, *args, **kwargs) -> SwapPlan:
        """The plan of the concrete function for these arguments (traces if needed)."""
        graph = self.get_concrete_function(*args, **kwargs).graph
        return self._plans[graph]


def function(fn=None, *, config: LMSConfig | None = None, **tf_function_kwargs):
    """Decorator like ``tf.function`` that applies Large Model Support.

    Args:
        fn: the Python function (omit to use ``@tflms.function(config=...)``).
        config: LMS options; defaults to ``LMSConfig()``.
        **tf_function_kwargs: passed to ``tf.function`` (``input_signature``,
            ``reduce_retracing``, ...). ``jit_compile=True`` is refused.

    Returns:
        An :class:`LMSFunction`; ``.plans`` and ``.plan_for(*args)`` expose the
        plans of its concrete functions.
    """
    if fn is None:
        return lambda f: LMSFunction(f, config, tf_function_kwargs)
    return LMSFunction(fn, config, tf_function_kwargs)
