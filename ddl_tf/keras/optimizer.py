"""``DistributedOptimizer`` for Keras 3: averages gradients across ranks in ``apply``.

Keras 3 ``fit`` (and ``optimizer.apply_gradients`` in custom loops) ends in
``Optimizer.apply(grads, variables)``; Horovod hooked Keras 2's
``get_gradients``/``_aggregate_gradients``, which Keras 3 never calls, so its
optimizer silently stops averaging. This wrapper composes plainly, the way
``keras.optimizers.LossScaleOptimizer`` wraps an inner optimizer: ``apply``
allreduces the gradients and hands them to the inner optimizer, which keeps
its own variables, learning rate and update rule. Inside the Keras train
function (a graph) the gradients are reduced in buckets, in the order
backprop produces them, each bucket one ordinary graph op that starts as soon
as its gradients exist, so communication overlaps the rest of the backward
pass (:mod:`ddl_tf.tensorflow.overlap`; ``overlap=False`` or ``DDL_OVERLAP=0``: one fused
collective after the backward pass, as eagerly).

With ``backward_passes_per_step=N`` gradients are summed locally for ``N``
calls and reduced/applied on every ``N``-th (weights and the inner
optimizer's ``iterations`` change only then); the accumulated sums exist
before that reduction starts, so it is one fused collective (no overlap).

Example (one process):
    >>> import keras
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    >>> w = keras.Variable([1.0, 2.0])
    >>> opt.apply([keras.ops.convert_to_tensor([1.0, 1.0])], [w])
    >>> [round(float(x), 3) for x in w.numpy()]
    [0.9, 1.9]
    >>> hvd.shutdown()
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import keras
import tensorflow as tf
from keras import ops

from ddl_tf.core.numerics.compression import Compressor
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.errors import ConfigError
from ddl_tf.keras.gradient_reducer import GradientReducer, variable_key, variables_of_apply
from ddl_tf.keras.loss_scale import DistributedLossScaleOptimizer
from ddl_tf.keras.sharding import (
    ShardedOptimizer,
    check_sharding,
    from_wrapper_config,
    load_sharded,
    save_sharded,
)

__all__ = [
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "distributed_loss_scale_optimizer",
    "unwrap_optimizer",
]

logger = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="ddl_tf", name="DistributedOptimizer")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wrap a Keras 3 optimizer so that gradients are averaged across ranks before each update.

    Args:
        optimizer: The ``keras.optimizers.Optimizer`` (or its name) doing the updates.
        name: Optimizer name; defaults to ``"Distributed" + inner class name``.
        device_dense: Horovod's device for dense reductions; ignored (ddl_tf
            reduces on the host), with a warning once when set.
        device_sparse: As ``device_dense``, for sparse gradients.
        compression: ``Compression.none`` (default: the configured one), ``.fp16``, ``.bf16``.
        sparse_as_dense: Densify ``tf.IndexedSlices`` gradients before reducing.
        gradient_predivide_factor: With Average, scale by ``1/f`` before the sum
            and ``f/size`` after it.
        op: ``Average`` (default), ``Sum`` or ``Adasum`` (Horovod's Keras optimizer refuses
            Adasum; ddl_tf combines the gradients with it, see :mod:`ddl_tf.core.algorithms.adasum`).
        backward_passes_per_step: Accumulate this many gradient calls locally
            before one reduction and update.
        average_aggregated_gradients: Divide accumulated gradients by
            ``backward_passes_per_step``.
        num_groups: Horovod's fusion groups; ignored (ddl_tf fuses gradients into
            buckets of ``DDL_FUSION_THRESHOLD`` bytes, or ``bucket_bytes`` with
            overlap), with a warning once when set.
        groups: As ``num_groups``.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
            A rank outside the set keeps its own gradients (as in Horovod).
        scale_local_gradients: Divide the gradients of local variables
            (:meth:`register_local_var`) by the number of ranks, as Horovod does.
        overlap: Reduce in buckets that overlap the backward pass (graphs
            only); None: the job's setting (``DDL_OVERLAP``, on by default).
        bucket_bytes: Gradient bytes per bucket; None: the job's setting
            (``DDL_BUCKET_BYTES``).
        sharding: None (every rank keeps all optimizer state), ``"optimizer"``
            (ZeRO-1: each rank keeps and updates the state of its share of the
            variables, then the updated weights are allgathered) or
            ``"gradients"`` (ZeRO-2: the gradients are also reduce-scattered, so
            each rank receives its share only). See :mod:`ddl_tf.keras.sharding`.
    """

    def __new__(cls, optimizer=None, *args, **kwargs):
        """A :class:`~ddl_tf.keras.loss_scale.DistributedLossScaleOptimizer` where Keras would scale the loss.

        The one place where calling ``DistributedOptimizer(...)`` makes
        something else (Horovod's ``DistributedOptimizer`` is a factory
        function; here it stays a class so that ``isinstance`` and Keras
        deserialization work). Under the ``mixed_float16`` policy Keras wraps
        any optimizer that is not a ``LossScaleOptimizer`` in one, which would
        check each rank's own gradients for overflow and reach the allreduce
        only on the finite branch: the ranks would split. So with that policy,
        or when ``optimizer`` is a ``LossScaleOptimizer``, the result is a
        loss-scale optimizer that reduces before the check, made by
        :func:`distributed_loss_scale_optimizer` from the same arguments.
        """
        if cls is DistributedOptimizer and _needs_loss_scaling(optimizer):
            return distributed_loss_scale_optimizer(optimizer, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer | str,
        name: str | None = None,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Compressor | str | None = None,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        op: ReduceOp | str = ReduceOp.AVERAGE,
        backward_passes_per_step: int = 1,
        average_aggregated_gradients: bool = False,
        num_groups: int = 0,
        groups: Any = None,
        process_set: ProcessSet | None = None,
        scale_local_gradients: bool = True,
        overlap: bool | None = None,
        bucket_bytes: int | None = None,
        sharding: str | None = None,
    ) -> None:
        _warn_ignored(device_dense=device_dense, device_sparse=device_sparse)
        _warn_ignored(num_groups=num_groups, groups=groups)
        inner = _inner_optimizer(optimizer)
        name = name or f"Distributed{type(inner).__name__}"
        reducer = GradientReducer(
            name,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            op=op,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
            overlap=overlap,
            bucket_bytes=bucket_bytes,
        )
        _check_accumulation(reducer.op, backward_passes_per_step, average_aggregated_gradients)
        inner = _sharded(inner, sharding, reducer)
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self.reducer = reducer
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self._accumulators: list = []
        self._accumulator_of: dict = {}
        self._passes: keras.Variable | None = None  # built when backward_passes_per_step > 1

    # the reducer's options, read-only here (Keras saves them with the optimizer)
    op = property(lambda self: self.reducer.op, doc="The reduction (a ``ReduceOp``).")
    compression = property(lambda self: self.reducer.compression, doc="As passed.")
    sparse_as_dense = property(lambda self: self.reducer.sparse_as_dense, doc="As passed.")
    gradient_predivide_factor = property(
        lambda self: self.reducer.gradient_predivide_factor, doc="As passed."
    )
    process_set = property(lambda self: self.reducer.process_set, doc="As passed.")
    scale_local_gradients = property(
        lambda self: self.reducer.scale_local_gradients, doc="As passed."
    )
    overlap = property(lambda self: self.reducer.overlap, doc="As passed.")
    bucket_bytes = property(lambda self: self.reducer.bucket_bytes, doc="As passed.")

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient on this rank: it is not reduced across ranks.

        Args:
            var: A trainable variable of the model (Keras or TensorFlow).
        """
        self.reducer.register_local_var(var)

    # ------------------------------------------------------------------ state

    def build(self, var_list) -> None:
        """Build the inner optimizer (and local accumulators when ``backward_passes_per_step > 1``).

        Args:
            var_list: The trainable variables the optimizer will update.
        """
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super().build(var_list)
        if self.backward_passes_per_step > 1:
            self._accumulators = [
                self.add_variable_from_reference(v, name="ddl_accumulator") for v in var_list
            ]
            self._accumulator_of = {
                variable_key(v): slot for v, slot in zip(var_list, self._accumulators, strict=True)
            }
            self._passes = self.add_variable((), initializer="zeros", dtype="int", name="passes")

    @property
    def variables(self) -> list:
        return self._variables[:] + self.inner_optimizer.variables

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        """Set the inner optimizer's learning rate.

        Args:
            value: A float, a schedule or a variable, as Keras accepts.
        """
        self.inner_optimizer.learning_rate = value

    def scale_loss(self, loss):
        """The loss as the inner optimizer scales it (e.g. ``LossScaleOptimizer``).

        Args:
            loss: The loss tensor.

        Returns:
            The scaled loss.
        """
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list) -> None:
        """Let the inner optimizer finalize the variables (e.g. EMA weights).

        Args:
            var_list: The model's trainable variables.
        """
        self.inner_optimizer.finalize_variable_values(var_list)

    # ------------------------------------------------------------------ updates

    def apply_gradients(self, grads_and_vars):
        """Average the gradients across ranks and apply them (see :meth:`apply`).

        Args:
            grads_and_vars: ``(gradient, variable)`` pairs.

        Returns:
            The inner optimizer's ``iterations`` variable.
        """
        grads, variables = zip(*grads_and_vars, strict=True)
        self.apply(list(grads), list(variables))
        return self.iterations

    def apply(self, grads, trainable_variables=None) -> None:
        """Average ``grads`` across ranks, then let the inner optimizer apply them.

        Args:
            grads: One gradient per variable (tensors, ``tf.IndexedSlices`` or None).
            trainable_variables: The variables, in the same order; ``None`` uses the
                ones the optimizer was built with.

        Raises:
            ConfigError: No variables are given and the optimizer was not built.
        """
        grads = list(grads)
        variables = variables_of_apply(self, trainable_variables, self._trainable_variables)
        if self.backward_passes_per_step == 1:
            if _mixed_float16():
                raise ConfigError(
                    "DistributedOptimizer was created before the mixed_float16 policy was set, "
                    "so Keras wrapped it in a LossScaleOptimizer that checks each rank's "
                    "gradients alone (ranks would skip different steps). Create the "
                    "DistributedOptimizer after keras.mixed_precision.set_global_policy("
                    "'mixed_float16'), or pass a LossScaleOptimizer: "
                    "hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))."
                )
            self._reduce_and_apply(grads, variables, self.overlap)
        else:
            self._accumulate(grads, variables)

    def _reduce_and_apply(self, grads: list, variables: list, overlap: bool | None) -> None:
        inner = self.inner_optimizer
        if isinstance(inner, ShardedOptimizer):
            inner.apply(inner.reduce(self.reducer, grads, variables, overlap), variables)
        else:
            inner.apply(self.reduce(grads, variables, overlap), variables)

    def reduce(self, grads: list, variables: list, overlap: bool | None = None) -> list:
        """The gradients averaged (or summed) across ranks, local variables' kept on this rank.

        See :meth:`ddl_tf.keras.gradient_reducer.GradientReducer.reduce`.

        Args:
            grads: One gradient per variable (tensors, ``tf.IndexedSlices`` or None).
            variables: The variables, in the same order.
            overlap: Reduce in buckets as backprop produces them (None: the
                optimizer's setting, then ``DDLConfig.overlap``).

        Returns:
            The reduced gradients, in the same order.
        """
        return self.reducer.reduce(grads, variables, overlap)

    def _accumulate(self, grads: list, variables: list) -> None:
        pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
        slots = [self._accumulator_of[variable_key(v)] for _, v in pairs]
        for (g, _), slot in zip(pairs, slots, strict=True):
            slot.assign_add(tf.convert_to_tensor(g))
        assert self._passes is not None  # build() made it: backward_passes_per_step > 1
        self._passes.assign_add(1)
        steps = self.backward_passes_per_step

        def update():
            scale = 1.0 / steps if self.average_aggregated_gradients else 1.0
            summed = [ops.convert_to_tensor(slot) * scale for slot in slots]
            self._reduce_and_apply(summed, [v for _, v in pairs], overlap=False)
            for slot in slots:
                slot.assign(ops.zeros_like(slot))

        ops.cond(ops.equal(self._passes % steps, 0), update, lambda: None)

    # ------------------------------------------------------------------ config

    @property
    def sharding(self) -> str | None:
        """None, ``"optimizer"`` or ``"gradients"``, as passed."""
        inner = self.inner_optimizer
        return inner.sharding if isinstance(inner, ShardedOptimizer) else None

    def save_own_variables(self, store) -> None:
        """Keras's saving hook; with sharding a collective that writes the replicated layout.

        Args:
            store: Keras's variable store.
        """
        inner = self.inner_optimizer
        if not isinstance(inner, ShardedOptimizer):
            return super().save_own_variables(store)
        save_sharded(store, self._variables, inner)

    def load_own_variables(self, store) -> None:
        """Keras's loading hook; with sharding each rank takes its own variables' state.

        Args:
            store: Keras's variable store.
        """
        inner = self.inner_optimizer
        if not isinstance(inner, ShardedOptimizer):
            return super().load_own_variables(store)
        load_sharded(store, self._variables, inner)

    def get_config(self) -> dict:
        inner = self.inner_optimizer
        if isinstance(inner, ShardedOptimizer):
            optimizer = inner.get_config()["optimizer"]
        else:
            optimizer = keras.saving.serialize_keras_object(inner)
        return {
            "name": self.name,
            "optimizer": optimizer,
            **self.reducer.get_config(),
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "sharding": self.sharding,
        }

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> DistributedOptimizer:
        """Rebuild from :meth:`get_config` (used when a saved model is loaded).

        Args:
            config: The dictionary :meth:`get_config` returned.
            custom_objects: Passed on to deserialize the inner optimizer.

        Returns:
            A new :class:`DistributedOptimizer`.
        """
        return from_wrapper_config(cls, config, custom_objects)


def distributed_loss_scale_optimizer(
    optimizer: Any, *args: Any, **kwargs: Any
) -> DistributedLossScaleOptimizer:
    """The loss-scale optimizer ``DistributedOptimizer(optimizer, *args, **kwargs)`` makes.

    Args:
        optimizer: A Keras optimizer, or a ``LossScaleOptimizer`` (whose inner
            optimizer and scale settings are kept).
        *args: ``DistributedOptimizer``'s further arguments, in its order.
        **kwargs: ``DistributedOptimizer``'s keyword arguments.

    Returns:
        A :class:`~ddl_tf.keras.loss_scale.DistributedLossScaleOptimizer`.

    Raises:
        ConfigError: ``backward_passes_per_step > 1`` (the loss scale would change
            between the accumulated passes), or an option ``DistributedOptimizer`` refuses.
    """
    options = inspect.signature(DistributedOptimizer.__init__).bind(
        None, optimizer, *args, **kwargs
    )
    options.apply_defaults()
    given = dict(options.arguments)
    for unused in ("self", "optimizer"):
        given.pop(unused)
    _warn_ignored(device_dense=given.pop("device_dense"), device_sparse=given.pop("device_sparse"))
    _warn_ignored(num_groups=given.pop("num_groups"), groups=given.pop("groups"))
    passes = given.pop("backward_passes_per_step")
    average_aggregated = given.pop("average_aggregated_gradients")
    name = given.pop("name")
    sharding = given.pop("sharding")
    if passes != 1:
        raise ConfigError(
            "Mixed precision with backward_passes_per_step > 1 is not supported: the "
            "loss scale would change between the accumulated passes. Use "
            "backward_passes_per_step=1 (a larger batch per step), or float32."
        )
    scale = {}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        scale = {
            "initial_scale": optimizer.initial_scale,
            "dynamic_growth_steps": optimizer.dynamic_growth_steps,
        }
        optimizer = optimizer.inner_optimizer
    inner = _inner_optimizer(optimizer)
    reducer = GradientReducer(f"Distributed{type(inner).__name__}", **given)
    _check_accumulation(reducer.op, passes, average_aggregated)
    inner = _sharded(inner, sharding, reducer)
    return DistributedLossScaleOptimizer(inner, name=name, reducer=reducer, **scale)


def PartialDistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer, name: str | None = None, local_layers=None, **kwargs
) -> DistributedOptimizer:
    """A :class:`DistributedOptimizer` that keeps the gradients of ``local_layers`` local.

    The trainable variables of ``local_layers`` (a Keras layer or a list of
    them) are updated with this rank's own gradient, divided by the number of
    ranks when ``scale_local_gradients`` (the default); all others are averaged
    across ranks. Pair it with ``BroadcastGlobalVariablesCallback(0,
    local_variables=...)`` so that the local weights are not overwritten.

    Args:
        optimizer: The Keras 3 optimizer doing the updates.
        name: Optimizer name.
        local_layers: Layers whose gradients are not reduced.
        **kwargs: As :class:`DistributedOptimizer`.

    Raises:
        ConfigError: An entry of ``local_layers`` is not a Keras layer.
    """
    layers = [] if local_layers is None else local_layers
    if not isinstance(layers, (list, tuple)):
        layers = [layers]
    bad = [layer for layer in layers if not isinstance(layer, keras.layers.Layer)]
    if bad:
        raise ConfigError(
            "local_layers must be Keras layers. Received "
            f"{[type(b).__name__ for b in bad]}; pass model.layers[i] objects."
        )
    wrapped = DistributedOptimizer(optimizer, name=name, **kwargs)
    for layer in layers:
        for variable in layer.trainable_weights:
            wrapped.register_local_var(variable)
    return wrapped


def _inner_optimizer(optimizer: Any) -> Any:
    """The Keras optimizer to wrap (from its name too).

    Raises:
        ConfigError: Not a Keras 3 optimizer.
    """
    inner = keras.optimizers.get(optimizer) if isinstance(optimizer, str) else optimizer
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise ConfigError(
            "DistributedOptimizer wraps Keras 3 optimizers. Received "
            f"optimizer={optimizer!r} ({type(optimizer).__name__}); pass e.g. "
            "keras.optimizers.SGD(0.01), or use ddl_tf.DistributedGradientTape in "
            "custom TensorFlow loops."
        )
    return inner


def _sharded(inner: Any, sharding: Any, reducer: GradientReducer) -> Any:
    """``inner``, wrapped in a :class:`ShardedOptimizer` when ``sharding`` asks for it.

    Raises:
        ConfigError: A bad ``sharding``, or sharding with Adasum.
    """
    if check_sharding(sharding) is None:
        return inner
    if reducer.op is ReduceOp.ADASUM:
        raise ConfigError(
            "DistributedOptimizer(sharding=...) does not support op=Adasum: Adasum combines "
            "whole gradients by their directions, so it cannot reduce-scatter them, and a "
            "sharded update would need Adasum's result on every rank anyway. Use "
            "op=Average with sharding, or sharding=None with Adasum."
        )
    return ShardedOptimizer(inner, sharding, reducer.process_set)


def _check_accumulation(op: ReduceOp, passes: Any, average_aggregated: bool) -> None:
    """Refuse Horovod's accumulation options where they make no sense (Horovod's rules).

    Raises:
        ConfigError: ``passes`` is not a whole number >= 1, or Adasum with
            ``average_aggregated``.
    """
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ConfigError(
            "backward_passes_per_step must be a whole number >= 1. Received "
            f"backward_passes_per_step={passes!r}."
        )
    if op is ReduceOp.ADASUM and average_aggregated:
        raise ConfigError(  # Horovod's rule (a ValueError there too)
            "Adasum does not support average_aggregated_gradients=True (Adasum combines "
            "whole gradients by their directions). Received op=Adasum, "
            "average_aggregated_gradients=True; leave it False."
        )


def _mixed_float16() -> bool:
    return keras.config.dtype_policy().name == "mixed_float16"


def _needs_loss_scaling(optimizer) -> bool:
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or _mixed_float16()


_IGNORED_WARNED: set[str] = set()


def _warn_ignored(**options: Any) -> None:
    """Warn once per process for each Horovod option that is set but has no meaning here."""
    set_options = [name for name, value in options.items() if value not in ("", 0, None)]
    fresh = [name for name in set_options if name not in _IGNORED_WARNED]
    if not fresh:
        return
    _IGNORED_WARNED.update(fresh)
    why = (
        "ddl_tf reduces on the host through MPI, so there is no device to choose"
        if "device_dense" in options
        else "ddl_tf fuses gradients into buckets by size (DDL_FUSION_THRESHOLD, or "
        "bucket_bytes= with overlap); Horovod's groups have no equivalent"
    )
    logger.warning(
        "DistributedOptimizer ignores %s (Horovod options): %s. Remove them to silence this.",
        ", ".join(f"{name}={options[name]!r}" for name in fresh),
        why,
    )


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer that owns the update rule (inside DistributedOptimizer/LossScaleOptimizer).

    Args:
        optimizer: Any Keras optimizer, possibly wrapped.

    Returns:
        The innermost optimizer (under sharding: built on this rank's variables).
    """
    while True:
        if isinstance(optimizer, ShardedOptimizer):
            optimizer = optimizer.shard_optimizer()
        elif hasattr(optimizer, "inner_optimizer"):
            optimizer = optimizer.inner_optimizer
        else:
            return optimizer
