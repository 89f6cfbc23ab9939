"""Optimizer state on the host: ``OffloadedOptimizer`` keeps a Keras optimizer's slots there and updates there.

With AdamW in float32 a parameter costs 16 resident bytes on the GPU:
weight, gradient and two slots. Half of it is optimizer state that only the
update reads. :class:`OffloadedOptimizer` wraps any Keras 3 optimizer, as
ZeRO-Offload does for PyTorch:

- its variables (slots, ``iterations``, ...) are created on ``host_device``;
- its update runs there. Each gradient is copied to the host as backprop
  produces it, since the update of a variable depends on that gradient
  alone (TensorFlow's executor starts a copy as soon as its input exists, so
  the copies overlap the rest of the backward pass). The updated weight is
  written back into the device variable before the next step reads it.

The device keeps the weights, the gradients and the activations. The
simulator (:mod:`tflms.simulation`) counts a variable where it lives, so
the plan and the summary see the state gone from the device.

On a GPU the update runs CPU kernels, whose float rounding may differ from
the GPU kernels' in the last bits; on this project's CPU test stand-in (two
logical CPU devices) both runs use the same kernels and train bit for bit
alike (``tests/tflms/test_offload.py``).

Example:
    >>> import keras
    >>> from tflms.keras import OffloadedOptimizer
    >>> opt = OffloadedOptimizer(keras.optimizers.Adam(0.1))
    >>> w = keras.Variable([1.0, 2.0])
    >>> opt.apply([keras.ops.convert_to_tensor([1.0, 1.0])], [w])
    >>> [round(float(x), 3) for x in w.numpy()], opt.variables[2].value.device[-5:]
    ([0.9, 1.9], 'CPU:0')
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tflms.errors import ConfigError
from tflms.utils.devices import check_device_string, same_device

__all__ = [
    "OffloadedOptimizer",
    "offload_state",
    "movable_state_bytes",
    "offload_unbuilt",
    "unbuilt_state_bytes",
    "variable_bytes",
    "is_offloaded",
    "weights_on_host",
    "check_weights_on_host",
]

logger = logging.getLogger(__name__)

DEFAULT_HOST = "/device:CPU:0"


@keras.saving.register_keras_serializable(package="tflms", name="OffloadedOptimizer")
class OffloadedOptimizer(keras.optimizers.Optimizer):
    """Keep ``optimizer``'s variables on ``host_device`` and run its update there.

    Args:
        optimizer: The Keras optimizer doing the updates (not yet built: its
            variables are made on the host when this one is built).
        host_device: Where the optimizer's variables live and its update runs.
        name: Optimizer name; defaults to ``"Offloaded" + inner class name``.

    Raises:
        ConfigError: ``optimizer`` is not a Keras 3 optimizer, is already built
            (its variables exist on another device: use :func:`offload_state`),
            or ``host_device`` is not a device string.
    """

    per_variable_update = True
    """Its update of a variable needs that variable's gradient alone (what
    ``ddl_tf``'s sharding asks of an optimizer it shards)."""

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        host_device: str = DEFAULT_HOST,
        name: str | None = None,
    ) -> None:
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ConfigError(
                "OffloadedOptimizer wraps a Keras 3 optimizer. Received "
                f"{type(optimizer).__name__}; pass e.g. keras.optimizers.AdamW(3e-4)."
            )
        if optimizer.built:
            raise ConfigError(
                f"OffloadedOptimizer got a built {type(optimizer).__name__}: its variables "
                "already exist on the device it was built on. Wrap the optimizer before "
                "compile/fit builds it, or move a built one with tflms.keras.offload_state(model)."
            )
        check_device_string("host_device", host_device, owner="OffloadedOptimizer.")
        super().__init__(learning_rate=0.0, name=name or f"Offloaded{type(optimizer).__name__}")
        self.inner_optimizer = optimizer
        self.host_device = host_device

    def build(self, var_list) -> None:
        """Build the inner optimizer on ``host_device``.

        Args:
            var_list: The trainable variables the optimizer will update.
        """
        if not self.inner_optimizer.built:
            host = self.host_device

            def on_host(next_creator, **kwargs):
                # Keras makes each slot next to its weight (colocate_with): not here
                kwargs.pop("colocate_with", None)
                with tf.device(host):
                    return next_creator(**kwargs)

            with tf.variable_creator_scope(on_host):
                with keras.name_scope(self.inner_optimizer.name, caller=self.inner_optimizer):
                    self.inner_optimizer.build(var_list)
            self.inner_optimizer.built = True
        super().build(var_list)

    @property
    def variables(self) -> list:
        return self.inner_optimizer.variables

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
        """The loss as the inner optimizer scales it.

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

    def apply(self, grads, trainable_variables=None) -> None:
        """Run the inner optimizer's update on the host (each weight is written back where it lives).

        Args:
            grads: One gradient per variable.
            trainable_variables: The variables, in the same order; None: those
                it was built with.
        """
        _build_once(self, trainable_variables)
        with tf.device(self.host_device):
            self.inner_optimizer.apply(grads, trainable_variables)

    def save_own_variables(self, store) -> None:
        """Nothing: Keras saves the inner optimizer's variables at its own path.

        Args:
            store: Keras's variable store.
        """

    def load_own_variables(self, store) -> None:
        """Nothing: Keras loads the inner optimizer's variables at its own path.

        Args:
            store: Keras's variable store.
        """

    def get_config(self) -> dict:
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "host_device": self.host_device,
        }

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> OffloadedOptimizer:
        """Rebuild from :meth:`get_config` (a saved model is loaded).

        Args:
            config: The dictionary :meth:`get_config` returned.
            custom_objects: Passed on to deserialize the inner optimizer.

        Returns:
            A new :class:`OffloadedOptimizer`.
        """
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


def _build_once(optimizer: Any, variables: Any) -> None:
    """Build ``optimizer`` on ``variables`` at its first ``apply``, as Keras's own ``apply`` does.

    Raises:
        ConfigError: It was never built and no variables are given.
    """
    if optimizer.built:
        return
    if variables is None:
        raise ConfigError(
            "OffloadedOptimizer.apply() got gradients without variables before it was "
            "built. Pass the variables or call optimizer.build(variables) first."
        )
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(list(variables))
    optimizer.built = True


def _inner(optimizer: Any) -> Any:
    """The optimizer ``optimizer`` wraps (a loss-scale, distributed or sharded wrapper), or None."""
    if hasattr(optimizer, "shard_optimizer"):  # ddl_tf's sharding keeps it out of Keras's walk
        return optimizer.shard_optimizer()
    return getattr(optimizer, "inner_optimizer", None)


def is_offloaded(optimizer: Any) -> bool:
    """Whether ``optimizer``, or one it wraps (loss scale, ddl_tf), keeps its state on the host."""
    return _find_offloaded(optimizer) is not None


def _find_offloaded(optimizer: Any) -> OffloadedOptimizer | None:
    while optimizer is not None and not isinstance(optimizer, OffloadedOptimizer):
        optimizer = _inner(optimizer)
    return optimizer


def offload_state(model: keras.Model, host_device: str = DEFAULT_HOST) -> OffloadedOptimizer:
    """Move a compiled model's optimizer state to ``host_device`` (the update runs there from now on).

    The innermost optimizer (the one with the state) is replaced by an
    :class:`OffloadedOptimizer` around a fresh copy of it (same class and
    settings), built on the host and given the old one's values. Wrappers
    stay where they are, on the device: under ``mixed_float16`` the
    loss-scale optimizer, and ddl_tf's ``DistributedOptimizer``, which then
    reduces the gradients before the host update. When Keras already built
    the state on the device (``fit`` builds it before any callback runs), it
    had to fit there once: wrap the optimizer in :class:`OffloadedOptimizer`
    before ``compile`` so that it never does.

    Args:
        model: A compiled Keras model.
        host_device: Where the optimizer state goes.

    Returns:
        The new :class:`OffloadedOptimizer` (already in the model).

    Raises:
        ConfigError: The model has no optimizer, or its state is sharded
            across ranks (``DistributedOptimizer(sharding=...)``: wrap the
            optimizer in :class:`OffloadedOptimizer` before sharding it).
    """
    if getattr(model, "optimizer", None) is None:
        raise ConfigError(
            "offload_state needs a compiled model; compile it with an optimizer first."
        )
    found = _find_offloaded(model.optimizer)
    if found is not None:
        return found
    holder, optimizer = _innermost(model)
    if optimizer is None:  # neither missing nor offloaded: sharded
        raise ConfigError(
            "the optimizer's state is sharded across ranks (DistributedOptimizer(sharding="
            "...)), so it cannot be moved whole. Wrap the optimizer before sharding it: "
            "hvd.DistributedOptimizer(tflms.keras.OffloadedOptimizer(opt), sharding=...)."
        )
    with tf.device(host_device):  # its step counter and learning rate too
        fresh = type(optimizer).from_config(optimizer.get_config())
    offloaded = OffloadedOptimizer(fresh, host_device=host_device)
    if optimizer.built:
        offloaded.build(model.trainable_variables)  # what fit built the old one with
        for target, source in zip(offloaded.variables, optimizer.variables, strict=True):
            target.assign(source)
    _put(model, holder, offloaded)
    return offloaded


def movable_state_bytes(model: keras.Model, host_device: str = DEFAULT_HOST) -> int:
    """Bytes of the model's optimizer state that :func:`offload_state` would move to ``host_device``.

    Args:
        model: A compiled Keras model.
        host_device: Where the state would go.

    Returns:
        The bytes of the innermost optimizer's variables kept elsewhere; 0
        when there is nothing to move or it cannot move whole: no optimizer,
        one not built yet, one offloaded already, or a state sharded across
        ranks (``DistributedOptimizer(sharding=...)``).
    """
    _, inner = _innermost(model)
    if inner is None or not inner.built:
        return 0
    return variable_bytes(
        v for v in inner.variables if not same_device(v.value.device, host_device)
    )


def offload_unbuilt(model: keras.Model, host_device: str = DEFAULT_HOST) -> Callable[[], None]:
    """Wrap the model's optimizer, not yet built, in :class:`OffloadedOptimizer` and build it there.

    Unlike :func:`offload_state` the optimizer object itself is kept (as the
    wrapper's inner optimizer): its state is made on ``host_device`` and never
    on the device.

    Args:
        model: A built, compiled model whose optimizer is not built.
        host_device: Where the state goes.

    Returns:
        The undo: the optimizer back in the model, unwrapped (its state stays
        on the host; call it only before the model trains).
    """
    holder, inner = _innermost(model)
    offloaded = OffloadedOptimizer(inner, host_device=host_device)
    offloaded.build(model.trainable_variables)
    _put(model, holder, offloaded)
    return lambda: _put(model, holder, inner)


def unbuilt_state_bytes(model: keras.Model, host_device: str = DEFAULT_HOST) -> int:
    """Bytes the model's optimizer, not yet built, will hold: a copy is built on the host and dropped.

    Args:
        model: A built, compiled model.
        host_device: Where the copy is built.

    Returns:
        The bytes of that copy's variables; 0 without an optimizer whose
        state can move whole (see :func:`movable_state_bytes`), or once it is built.
    """
    _, inner = _innermost(model)
    if inner is None or inner.built or not model.trainable_variables:
        return 0
    with tf.device(host_device):
        copy = OffloadedOptimizer(type(inner).from_config(inner.get_config()), host_device)
        copy.build(model.trainable_variables)
    return variable_bytes(copy.variables)


def variable_bytes(variables) -> int:
    """The bytes of ``variables`` (Keras variables), from their shapes and dtypes."""
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def _put(model: keras.Model, holder: Any, optimizer: Any) -> None:
    """Make ``optimizer`` the one ``holder`` (the model or a wrapper) holds."""
    if holder is model:
        model.optimizer = optimizer
    else:
        holder.inner_optimizer = optimizer


def _innermost(model: keras.Model) -> tuple[Any, Any]:
    """``(holder, optimizer)``: the optimizer with the state, and what holds it (model or wrapper).

    The optimizer is None when the model has none, or when its state is
    offloaded already or sharded across ranks (it cannot move whole).
    """
    holder, optimizer = model, getattr(model, "optimizer", None)
    while optimizer is not None:
        if isinstance(optimizer, OffloadedOptimizer) or hasattr(optimizer, "shard_optimizer"):
            return holder, None
        if not hasattr(optimizer, "inner_optimizer"):
            break
        holder, optimizer = optimizer, optimizer.inner_optimizer
    return holder, optimizer


def check_host(offloaded: OffloadedOptimizer, host_device: str) -> None:
    """Refuse an optimizer offloaded to another device than the config's host.

    Raises:
        ConfigError: The devices differ.
    """
    if not same_device(offloaded.host_device, host_device):
        raise ConfigError(
            f"the optimizer's state lives on {offloaded.host_device}, but LMSConfig.host_device "
            f"is {host_device}; give both the same host device."
        )


@contextlib.contextmanager
def weights_on_host(host_device: str = DEFAULT_HOST) -> Iterator[None]:
    """Create the weights of the models built inside on ``host_device``.

    With ``LMSConfig(offload_weights=True)`` tflms streams them to the device
    ahead of each use (:mod:`tflms.plan.streams`). Build the model inside,
    with its weights: a model that creates them lazily (a subclassed model, a
    ``Sequential`` without an ``Input``) must be built here too, with
    ``model.build(input_shape)`` or a call on one batch. Keras makes each
    optimizer slot next to its weight, so an optimizer built later keeps its
    state on the host as well.

    Args:
        host_device: Where the weights live.

    Yields:
        Nothing; a ``tf.device`` scope is open inside.

    Example:
        >>> import keras
        >>> with weights_on_host("/device:CPU:0"):
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.weights[0].value.device[-5:]
        'CPU:0'
    """
    check_device_string("host_device", host_device, owner="weights_on_host.")
    with tf.device(host_device):
        yield


def check_weights_on_host(model: keras.Model, host_device: str) -> None:
    """Refuse ``offload_weights`` for a model whose weights are not all on ``host_device``.

    Args:
        model: The model to be trained.
        host_device: Where its weights must live.

    Raises:
        ConfigError: The model has no weights yet, or some live elsewhere
            (naming the first and the way to build them on the host).
    """
    weights = model.weights
    if not weights:
        raise ConfigError(
            "offload_weights=True needs the model's weights built on the host, but the model "
            "has none yet (it builds them lazily). Build it inside "
            f"tflms.keras.weights_on_host({host_device!r}): model.build(input_shape) or a call "
            "on one batch."
        )
    elsewhere = [w for w in weights if not same_device(w.value.device, host_device)]
    if elsewhere:
        raise ConfigError(
            f"offload_weights=True streams weights kept on {host_device}, but {len(elsewhere)} "
            f"of the model's {len(weights)} weights live elsewhere ({elsewhere[0].path} on "
            f"{elsewhere[0].value.device}). A variable cannot move once made: build the model "
            f"inside `with tflms.keras.weights_on_host({host_device!r}):` and load its weights "
            "there (model.load_weights) when it was trained before."
        )
