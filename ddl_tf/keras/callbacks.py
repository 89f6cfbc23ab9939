"""Horovod's Keras callbacks for Keras 3.

* :class:`BroadcastGlobalVariablesCallback` makes every rank start from the
  root's weights, optimizer state and random-generator state (at
  ``on_train_begin`` for a built model; after the first batch for a model that
  Keras builds in its first step, as Horovod does for every model), and has
  the model's checkpoints keep its random state
  (:func:`~ddl_tf.keras.random_state.keep_random_state`).
* :class:`MetricAverageCallback` averages the epoch's metrics over ranks, in
  place, so callbacks after it (and the History) see global values. Put it
  before callbacks that read metrics (checkpointing, early stopping).
* :class:`LearningRateScheduleCallback` and :class:`LearningRateWarmupCallback`
  set the inner optimizer's learning-rate variable per batch or epoch, with
  Goyal et al.'s momentum correction (the velocity is rescaled by
  ``new_lr / old_lr`` when the rate changes, for optimizers whose velocity
  absorbs the rate: SGD and RMSprop with momentum).

Options are validated in ``__init__``; state is reset in ``on_train_begin``
so an instance can be reused; output only with ``verbose > 0`` on rank 0.

Example:
    >>> from ddl_tf.keras.callbacks import LearningRateWarmupCallback
    >>> LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=-1)
    Traceback (most recent call last):
    ...
    ddl_tf.errors.ConfigError: LearningRateWarmupCallback needs warmup_epochs > 0. Received warmup_epochs=-1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import AVERAGE
from ddl_tf.errors import ConfigError
from ddl_tf.keras.optimizer import unwrap_optimizer
from ddl_tf.keras.random_state import keep_random_state
from ddl_tf.tensorflow.functions import allgather_object, broadcast_variables

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
]

logger = logging.getLogger(__name__)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast model and optimizer variables from ``root_rank`` when training starts.

    A model that is built before ``fit`` (an ``Input`` layer, a call on data,
    or ``model.build``) is broadcast in ``on_train_begin``, before the first
    step. Keras 3 builds a model without an ``Input`` (a ``Sequential`` of
    layers, as in Horovod's MNIST example) and its optimizer only inside the
    first step, so such a model is broadcast at the end of the first batch,
    where Horovod 0.28 broadcasts every model: that step ran on each rank's own
    initial weights with averaged gradients, and from then on all ranks hold
    the root's weights and optimizer state. An optimizer no rank has built
    when the model is broadcast holds no state yet: it is left unbuilt (its
    first step builds the same initial values on every rank), so that what
    builds it decides where its state lives - ``tflms.LMSCallback`` may
    build it on the host; when any rank built it (the root loaded a
    checkpoint), every rank builds it and receives the root's state.

    The broadcast includes the state of the model's random generators
    (``model.variables`` holds it: Dropout draws the same masks on every
    rank), and ``on_train_begin`` calls
    :func:`~ddl_tf.keras.random_state.keep_random_state`, so that the
    model's checkpoints keep that state and a run resumed with
    :func:`ddl_tf.keras.load_model` draws what the uninterrupted run would have.

    Args:
        root_rank: Rank whose variables every rank adopts.
        device: Accepted for Horovod compatibility (ignored).
        local_variables: Variables (or one variable) that stay per-rank and are
            not broadcast, e.g. those of layers kept local with
            ``PartialDistributedOptimizer``.

    Raises:
        ConfigError: ``root_rank`` is negative or ``local_variables`` holds
            something that is not a variable.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None) -> None:
        super().__init__()
        if not isinstance(root_rank, int) or root_rank < 0:
            raise ConfigError(
                f"root_rank must be a rank number >= 0. Received root_rank={root_rank!r}."
            )
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local: set = set()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        for variable in local_variables:
            self.register_local_var(variable)

    def register_local_var(self, var) -> None:
        """Exclude ``var`` from the broadcast (it stays as each rank has it).

        Args:
            var: A ``tf.Variable`` or ``keras.Variable`` of the model.

        Raises:
            ConfigError: ``var`` is not a TensorFlow or Keras variable.
        """
        if not isinstance(var, (tf.Variable, keras.Variable)):
            raise ConfigError(
                "local_variables must be variables (tf.Variable or keras.Variable). Received "
                f"{type(var).__name__}; pass e.g. layer.trainable_weights."
            )
        self._local.add(_key(var))

    def on_train_begin(self, logs=None) -> None:
        """Broadcast the root's variables now if the model is built (else after the first batch).

        Args:
            logs: The metrics dict Keras passes (may be None).
        """
        self.broadcast_done = False
        keep_random_state(self.model)  # checkpoints of the model keep its random generators
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Broadcast after the first batch if it has not happened yet (the model is built now).

        Args:
            batch: Index of the batch within the epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        if not self.broadcast_done:
            self._broadcast()

    def _broadcast(self) -> None:
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        variables = list(model.variables)
        if optimizer is not None and _built_somewhere(optimizer):
            if not optimizer.built and model.trainable_variables:  # to receive the root's state
                optimizer.build(model.trainable_variables)
            variables += list(optimizer.variables)
        broadcast_variables(
            [v for v in variables if _key(v) not in self._local], root_rank=self.root_rank
        )
        self.broadcast_done = True


def _built_somewhere(optimizer) -> bool:
    """Whether the optimizer is built on any rank (one collective when the job has several).

    An optimizer no rank has built holds no state: its first step builds the
    same initial values on every rank. It is then left unbuilt, so that what
    builds it next decides where its state lives (tflms's ``LMSCallback`` may
    build it on the host). When any rank built it (a checkpoint loaded on the
    root only), every rank builds it to receive the root's state.
    """
    if basics.size() == 1:
        return bool(optimizer.built)
    return any(allgather_object(bool(optimizer.built), name="broadcast_optimizer_built"))


def _key(variable):
    """A hashable identity for a TF or Keras variable (Keras 3 variables are not hashable by value)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


class MetricAverageCallback(keras.callbacks.Callback):
    """Average every numeric epoch log over ranks, in place (sorted by name on every rank).

    Args:
        device: Accepted for Horovod compatibility (ignored).
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Replace each numeric entry of ``logs`` by its average over the ranks.

        Args:
            epoch: Index of the finished epoch.
            logs: The metrics dict Keras passes (may be None). Changed in place; non-numeric entries are left alone.
        """
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.number)))
        values = [np.array(float(logs[k]), np.float64) for k in keys]
        averaged = basics.engine().allreduce(values, AVERAGE, name="metric_average")
        for key, value in zip(keys, averaged, strict=True):
            logs[key] = float(value)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between two epochs.

    Args:
        initial_lr: Base learning rate (usually already scaled by ``size()``).
        multiplier: A constant ``m`` (rate ``m ** (epoch - start_epoch)``) or a
            function of the (fractional) epoch.
        start_epoch: First epoch the schedule applies to.
        end_epoch: Epoch at which it stops applying (None: never).
        staircase: Change once per epoch (True) or every batch with a
            fractional epoch (False).
        momentum_correction: Rescale the momentum velocity when the rate changes.
        steps_per_epoch: Batches per epoch (default: from Keras' params).
        verbose: Log changes on rank 0 when > 0.
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if initial_lr is None or not float(initial_lr) > 0:
            raise ConfigError(
                f"{type(self).__name__} needs initial_lr > 0. Received initial_lr={initial_lr!r}."
            )
        if end_epoch is not None and end_epoch <= start_epoch:
            raise ConfigError(
                f"{type(self).__name__} needs end_epoch > start_epoch. Received "
                f"start_epoch={start_epoch}, end_epoch={end_epoch}."
            )
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be >= 1. Received {steps_per_epoch!r}.")
        self.initial_lr = float(initial_lr)
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._steps = steps_per_epoch
        self.current_epoch = 0

    def on_train_begin(self, logs=None) -> None:
        """Reset the epoch counter and find the steps per epoch.

        Args:
            logs: The metrics dict Keras passes (may be None).

        Raises:
            ConfigError: a smooth (non-staircase) schedule and the steps per
                epoch are known neither from the callback nor from ``fit``.
        """
        self.current_epoch = 0
        self._steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not self.staircase and not self._steps:
            raise ConfigError(
                f"{type(self).__name__} could not find the number of steps per epoch. Pass "
                "steps_per_epoch=... to the callback (or steps_per_epoch to fit())."
            )

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        """Remember the epoch that starts.

        Args:
            epoch: Index of the epoch (0-based).
            logs: The metrics dict Keras passes (may be None).
        """
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Set the learning rate for this batch, inside ``[start_epoch, end_epoch)``.

        Args:
            batch: Index of the batch within the epoch; staircase schedules change
                the rate at batch 0 only.
            logs: The metrics dict Keras passes (may be None).
        """
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set_lr(self.initial_lr * self.multiplier(epoch))
        else:
            assert self._steps is not None  # on_train_begin refuses a smooth schedule without it
            self._set_lr(self.initial_lr * self.multiplier(epoch + batch / self._steps))

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Record the current learning rate as ``logs["learning_rate"]``.

        Args:
            epoch: Index of the finished epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model.optimizer)

    def _set_lr(self, new_lr: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        if new_lr == old_lr:
            return
        try:
            optimizer.learning_rate = new_lr
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{type(self).__name__} cannot set the learning rate of an optimizer built "
                f"with a LearningRateSchedule ({err}). Use a float learning rate with this "
                "callback, or the schedule alone."
            ) from None
        if self.momentum_correction and old_lr > 0:
            _correct_momentum(optimizer, new_lr / old_lr)
        if self.verbose > 0 and basics.rank() == 0:  # printed, as Horovod's callbacks do
            print(  # noqa: T201 - verbose output, as Keras' own callbacks print
                f"Epoch {self.current_epoch}: learning rate {old_lr:.6g} -> {new_lr:.6g}",
                flush=True,
            )


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size()`` to ``initial_lr`` (Goyal et al.).

    The rate grows linearly per batch over ``warmup_epochs``:
    ``lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)``,
    reaching ``initial_lr`` at the end of the warmup.

    Args:
        initial_lr: The target (already size-scaled) learning rate.
        warmup_epochs: Epochs of warmup.
        momentum_correction: Rescale momentum velocity on each change.
        steps_per_epoch: Batches per epoch (default: from Keras' params).
        verbose: Log the end of the warmup on rank 0 when > 0.
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        if not warmup_epochs > 0:
            raise ConfigError(
                f"LearningRateWarmupCallback needs warmup_epochs > 0. Received "
                f"warmup_epochs={warmup_epochs!r}."
            )
        self.warmup_epochs = warmup_epochs

        def multiplier(epoch: float) -> float:
            assert self._steps is not None  # known once training begins (smooth schedule)
            epoch += 1.0 / self._steps  # end each epoch on a round value, as Horovod does
            n = basics.size()
            return (epoch * (n - 1) / warmup_epochs + 1) / n

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=int(np.ceil(warmup_epochs)),
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
            verbose=verbose,
        )

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Record the learning rate; log the end of the warmup (``verbose > 0``, rank 0).

        Args:
            epoch: Index of the finished epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        super().on_epoch_end(epoch, logs)
        assert self.end_epoch is not None  # set from warmup_epochs
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(  # noqa: T201 - verbose output, as Keras' own callbacks print
                f"Epoch {epoch + 1}: finished learning-rate warmup at "
                f"{_get_lr(self.model.optimizer):.6g}",
                flush=True,
            )


def _get_lr(optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _correct_momentum(optimizer, ratio: float) -> None:
    inner = unwrap_optimizer(optimizer)
    if not getattr(inner, "momentum", 0):
        return
    velocities = getattr(inner, "momentums", None) or getattr(inner, "_momentums", None) or []
    for velocity in velocities:
        velocity.assign(velocity * ratio)
