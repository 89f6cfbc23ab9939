"""``DistributedLossScaleOptimizer``: mixed precision across ranks, the overflow check after the allreduce.

Keras's ``LossScaleOptimizer`` skips a step whose gradients hold an inf or a
NaN and halves the loss scale. Checked on each rank's own gradients, one
rank's overflow would make it skip the allreduce the others enter. Here the
scaled gradients are reduced first (by the optimizer's
:class:`~ddl_tf.keras.gradient_reducer.GradientReducer`, with its buckets and
compression), so an overflow on any rank makes every rank's reduced
gradients non-finite and every rank skips the same step, as Horovod did with
Keras 2. ``hvd.DistributedOptimizer(...)`` makes one under the
``mixed_float16`` policy or around a ``LossScaleOptimizer``; Keras then uses
it as the model's loss-scale optimizer instead of adding its own.

Example (one process):
    >>> import keras
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
    >>> type(opt).__name__, type(opt.inner_optimizer).__name__
    ('DistributedLossScaleOptimizer', 'SGD')
    >>> hvd.shutdown()
"""

from __future__ import annotations

from typing import Any

import keras

from ddl_tf.errors import ConfigError
from ddl_tf.keras.gradient_reducer import GradientReducer, variables_of_apply
from ddl_tf.keras.sharding import ShardedOptimizer, agree_finite, load_sharded, save_sharded

__all__ = ["DistributedLossScaleOptimizer"]


@keras.saving.register_keras_serializable(package="ddl_tf", name="DistributedLossScaleOptimizer")
class DistributedLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """A ``LossScaleOptimizer`` that reduces the scaled gradients across ranks before its check.

    Args:
        inner_optimizer: The Keras optimizer doing the updates (not a
            ``DistributedOptimizer``: the gradients are reduced here).
        initial_scale: The first loss scale.
        dynamic_growth_steps: Finite steps after which the scale doubles.
        name: Optimizer name; defaults to ``"DistributedLossScale" + inner class name``.
        reducer: The :class:`~ddl_tf.keras.gradient_reducer.GradientReducer`, or
            its :meth:`~ddl_tf.keras.gradient_reducer.GradientReducer.get_config`
            (a saved model); None: Average over the whole job.
        **kwargs: Other ``keras.optimizers.LossScaleOptimizer`` arguments.

    Raises:
        ConfigError: ``inner_optimizer`` already reduces gradients (a ``DistributedOptimizer``).
    """

    def __init__(
        self,
        inner_optimizer: Any,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int = 1000,
        name: str | None = None,
        reducer: GradientReducer | dict | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(getattr(inner_optimizer, "reducer", None), GradientReducer):
            raise ConfigError(
                "DistributedLossScaleOptimizer reduces the gradients itself; its inner optimizer "
                f"must be a plain Keras optimizer. Received {type(inner_optimizer).__name__}; "
                "create it with hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))."
            )
        reducer_name = f"Distributed{type(inner_optimizer).__name__}"
        if not isinstance(reducer, GradientReducer):
            reducer = GradientReducer(reducer_name, **(reducer or {}))
        super().__init__(
            inner_optimizer,
            initial_scale,
            dynamic_growth_steps,
            name=name or f"DistributedLossScale{type(inner_optimizer).__name__}",
            **kwargs,
        )
        self.reducer = reducer

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient on this rank (see ``PartialDistributedOptimizer``).

        Args:
            var: A trainable variable of the model.
        """
        self.reducer.register_local_var(var)

    def apply(self, grads, trainable_variables=None):
        """Reduce the scaled gradients across ranks, then unscale, check and apply them.

        Args:
            grads: One gradient per variable.
            trainable_variables: The variables (None: those it was built with).
        """
        variables = variables_of_apply(self, trainable_variables, self._trainable_variables)
        inner = self.inner_optimizer
        if isinstance(inner, ShardedOptimizer):
            reduced = inner.reduce(self.reducer, list(grads), variables)
        else:
            reduced = self.reducer.reduce(list(grads), variables)
        return super().apply(reduced, trainable_variables)

    def check_finite(self, grads):
        """Whether every reduced gradient is finite, agreed by all ranks under ``sharding="gradients"``.

        Args:
            grads: The reduced gradients (this rank's own only, under ZeRO-2).

        Returns:
            A boolean tensor, the same on every rank.
        """
        finite = super().check_finite(grads)
        inner = self.inner_optimizer
        if isinstance(inner, ShardedOptimizer) and inner.sharding == "gradients":
            return agree_finite(finite, self.reducer.process_set)
        return finite

    def save_own_variables(self, store) -> None:
        """Keras's saving hook; with sharding a collective that writes the replicated layout.

        Args:
            store: Keras's variable store.
        """
        if not isinstance(self.inner_optimizer, ShardedOptimizer):
            return super().save_own_variables(store)
        save_sharded(store, self._variables, self.inner_optimizer)

    def load_own_variables(self, store) -> None:
        """Keras's loading hook; with sharding each rank takes its own variables' state.

        Args:
            store: Keras's variable store.
        """
        if not isinstance(self.inner_optimizer, ShardedOptimizer):
            return super().load_own_variables(store)
        load_sharded(store, self._variables, self.inner_optimizer)

    def get_config(self) -> dict:
        return {**super().get_config(), "reducer": self.reducer.get_config()}
