"""``hvd.elastic`` for Keras 3: the model state object and the callbacks that keep it current.

The state is synced at the start and after every membership change, committed
as training goes (the callbacks below), and restored when a rank fails; see
:mod:`ddl_tf.tensorflow.elastic` for ``run`` and docs/elastic.md for the job's
side (``ddlrun --min-np``).

Example (one process):
    >>> import keras
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    >>> cb = hvd.elastic.UpdateEpochStateCallback(state); cb.on_epoch_end(0); state.epoch
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

import keras

from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.elastic import TensorFlowKerasState, run

__all__ = [
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


class KerasState(TensorFlowKerasState):
    """State of a built Keras model, its optimizer and keyword attributes.

    Args:
        model: A built Keras model.
        optimizer: The optimizer (default: ``model.optimizer``).
        **kwargs: Attributes to track (``batch``, ``epoch``, ...).
    """

    def __init__(self, model, optimizer=None, **kwargs) -> None:
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of every epoch.

    Args:
        state: The state object.
        batches_per_commit: Batches between commits.

    Raises:
        ConfigError: ``batches_per_commit`` is not a whole number >= 1.
    """

    def __init__(self, state, batches_per_commit: int = 1) -> None:
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ConfigError(
                "batches_per_commit must be a whole number >= 1. Received "
                f"batches_per_commit={batches_per_commit!r}."
            )
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None) -> None:
        """Start counting batches towards the next commit.

        Args:
            logs: The metrics dict Keras passes (may be None).
        """
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Commit the state every ``batches_per_commit`` batches.

        Args:
            batch: Index of the batch within the epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Commit the state.

        Args:
            epoch: Index of the finished epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch of the epoch (0 after each epoch).

    Args:
        state: The state object (with a ``batch`` attribute).
    """

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Set ``state.batch`` to ``batch``.

        Args:
            batch: Index of the finished batch within the epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Reset ``state.batch`` to 0.

        Args:
            epoch: Index of the finished epoch.
            logs: The metrics dict Keras passes (may be None).
        """
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of finished epochs, counting from the state's start.

    Args:
        state: The state object (with an ``epoch`` attribute).
    """

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None) -> None:
        """Remember the state's epoch as the starting point.

        Args:
            logs: The metrics dict Keras passes (may be None).
        """
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Set ``state.epoch`` to the starting epoch plus the epochs finished.

        Args:
            epoch: Index of the finished epoch in this ``fit`` (0-based).
            logs: The metrics dict Keras passes (may be None).
        """
        self.state.epoch = self.initial_epoch + epoch + 1
