"""``hvd.elastic`` for Keras 3: the model state object and the callbacks that keep it current.

The state is synced at the start and after every membership change, committed
as training goes (the callbacks below), and restored when a rank fails; see
:mod:`ddl_tf.tensorflow.elastic` for ``run`` and docs/elastic.md for the job's
side (``ddlrun --min-np``). With a sharded optimizer
(``DistributedOptimizer(opt, sharding=...)``) :class:`KerasState` commits the
whole optimizer state and re-forms the ranks' shares from it after every
membership change (docs/sharding.md, "In elastic jobs").

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

from typing import Any

import keras
import numpy as np

from ddl_tf.core import basics
from ddl_tf.errors import ConfigError
from ddl_tf.keras.sharding import ShardedOptimizer
from ddl_tf.membership.mirror import MirrorError
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

    With a sharded optimizer (``DistributedOptimizer(opt, sharding=...)``,
    :mod:`ddl_tf.keras.sharding`) each rank holds the optimizer state of its
    own variables only, so the commit, the restore and the sync work on the
    whole state instead of each rank's variables:

    - ``commit()`` gathers every rank's share (one ``allgather_object`` of the
      optimizer state over the job) and keeps the whole optimizer state in
      this rank's host memory, next to the model's weights, as a replicated
      optimizer's commit holds it;
    - ``restore()`` puts the weights and this rank's share back (local: the
      job may be broken then);
    - after the job re-formed (ranks lost, left or joined), the reset plans
      the owners again for the new ranks and builds each rank's share anew
      from the last commit, that of a rank that died included;
    - ``sync()`` sends rank 0's whole optimizer state with the weights when
      the job just re-formed (a rank that joined has none of its share), and
      otherwise gathers the shares as they are.

    Training then goes on as a sharded job of the new size started from
    that commit would, bit for bit (tests/ddl_tf/test_sharding_elastic.py).
    Keeping the whole state on every rank costs host memory (the optimizer
    state of the whole model per rank: two float32 copies of the weights
    with Adam) and a gather per commit; in exchange any number of ranks may
    fail at once, a whole host's included, and the commit mirrored in host
    memory for a relaunch after a node crash is whole too. docs/sharding.md
    weighs this against keeping a neighbour's share only.

    Args:
        model: A built Keras model.
        optimizer: The optimizer (default: ``model.optimizer``).
        **kwargs: Attributes to track (``batch``, ``epoch``, ...).

    Raises:
        ValueError: The model is not built yet.
        ConfigError: A sharded optimizer over a process set in an elastic job.
    """

    def __init__(self, model, optimizer=None, **kwargs) -> None:
        # (an uncompiled model has no optimizer: the base class refuses it with the fix)
        self._sharded = sharded_of(
            optimizer if optimizer is not None else getattr(model, "optimizer", None)
        )
        # the whole optimizer state of the last commit, by path (sharded optimizers only);
        # until the first commit or sync, this rank's share only (whole: False)
        self._committed: dict[str, np.ndarray] = {}
        self._whole = False
        # the inner optimizer's iterations when the shards were last re-formed from the
        # commit (restore, reset, mirror): the sync then sends rank 0's copy of the commit
        self._reformed_at: int | None = None
        if self._sharded is not None:
            self._sharded.elastic_tracked = True
        super().__init__(model, optimizer=optimizer, **kwargs)

    def _variables(self) -> list:
        """The model's variables and the optimizer's that every rank holds (all of them unsharded)."""
        everything = super()._variables()  # builds the optimizer when it is not yet
        if self._sharded is None:
            return everything
        shares = {id(v) for v in self._sharded.variables}
        return [v for v in everything if id(v) not in shares]

    def _save_model(self) -> None:
        super()._save_model()
        if self._sharded is not None and not self._committed:
            self._committed = self._sharded.own_state()  # no collective: the state's creation

    def save(self) -> None:
        if self._sharded is None:
            return super().save()
        # the collective first: a rank lost during it leaves this rank's commit as it was
        whole = self._sharded.gather_shards(name="elastic.commit.optimizer_shards")
        super().save()
        self._committed, self._whole, self._reformed_at = whole, True, None

    def restore(self) -> None:
        super().restore()
        if self._sharded is None:
            return
        # before a re-form the shards still fit the job that failed: put this rank's back
        # (local); once the job re-formed, the reset re-forms them from the commit
        if self._sharded.fits_current_ranks():
            self._sharded.assign_state(self._committed)
        self._reformed_at = self._iterations()

    def reset(self) -> None:
        """Trace the step again; with a sharded optimizer, re-form the shards from the last commit.

        Raises:
            ConfigError: A sharded optimizer's state was never committed whole
                (no ``commit()`` or ``sync()`` since the state was made).
        """
        super().reset()
        if self._sharded is None:
            return
        self._sharded.reshard(self._whole_commit())
        self._reformed_at = self._iterations()

    def sync(self) -> None:
        if self._sharded is not None:
            self._sync_shards()
        super().sync()

    def mirror_payload(self) -> Any:
        payload = super().mirror_payload()
        if self._sharded is not None:
            payload["optimizer_shards"] = dict(self._committed) if self._whole else None
        return payload

    def load_mirror(self, payload: Any) -> None:
        if self._sharded is not None:
            whole = payload.get("optimizer_shards")
            layout = self._sharded.replicated_layout()
            if whole is None or any(path not in whole for path in layout):
                raise MirrorError(
                    "the commit kept in host memory does not hold this sharded optimizer's "
                    "whole state (it was written by another program, or by one without "
                    "sharding): the relaunched program must build the same model and "
                    "DistributedOptimizer(sharding=...) as the crashed one"
                )
            self._committed, self._whole = dict(whole), True
            if not self._sharded.fits_current_ranks():  # a relaunch of another size
                self._sharded.reshard(self._committed, check=False)
        super().load_mirror(payload)

    def committed_optimizer_state(self) -> dict[str, np.ndarray] | None:
        """The last commit's whole optimizer state by variable path (sharded optimizers only).

        Returns:
            ``{path less the optimizers' scopes: value}`` as
            :meth:`~ddl_tf.keras.sharding.ShardedOptimizer.gather_shards` gives
            it; None without a sharded optimizer, or before the first
            ``commit()``/``sync()``.
        """
        if self._sharded is None or not self._whole:
            return None
        return dict(self._committed)

    def _whole_commit(self) -> dict[str, np.ndarray]:
        if not self._whole:
            raise ConfigError(
                "the elastic job re-formed before the sharded optimizer's state was committed: "
                "KerasState holds only this rank's share, and the others' are gone. Let "
                "hvd.elastic.run sync the state first (it does before calling the training "
                "function), or call state.commit() on every rank before training."
            )
        return self._committed

    def _iterations(self) -> int:
        assert self._sharded is not None
        return int(self._sharded.iterations.numpy())

    def _sync_shards(self) -> None:
        """Make the whole optimizer state rank 0's, and every rank's share fit the job (collective).

        Rank 0 sends its whole state when the shards were just re-formed from
        the commit and have not trained since (a rank that joined holds none
        of its share yet): its commit, with its own share's current values
        (a reset callback may have set the learning rate). Otherwise every
        rank's share is live training state, and they are gathered.

        Raises:
            ConfigError: No re-formed state to send, but some rank's shards were
                planned for other ranks (the job re-formed without a reset).
        """
        assert self._sharded is not None
        sharded = self._sharded
        offer = None
        if basics.rank() == 0 and self._reformed_at is not None and self._whole:
            if self._iterations() == self._reformed_at:
                offer = sharded.current_over(self._committed)
        fits = sharded.fits_current_ranks()
        answers = basics.engine().allgather_object(
            (fits, offer if basics.rank() == 0 else None), name="elastic.sync.optimizer_shards"
        )
        offer = answers[0][1]
        if offer is None:
            unfit = [r for r, (ok, _) in enumerate(answers) if not ok]
            if unfit:
                raise ConfigError(
                    f"rank(s) {unfit} hold optimizer shards planned for other ranks, but rank 0 "
                    "has no re-formed commit to send: the elastic job re-formed without "
                    "KerasState's reset. Let hvd.elastic.run handle membership changes (it "
                    "calls state.on_reset() after each)."
                )
            whole = sharded.gather_shards(name="elastic.sync.gather_shards")
        else:
            whole = offer
            if not fits:  # the variables were compared at the build and the reset
                sharded.reshard(whole, check=False)
        sharded.assign_state(whole)
        self._committed, self._whole, self._reformed_at = whole, True, None


def sharded_of(optimizer: Any) -> ShardedOptimizer | None:
    """The :class:`~ddl_tf.keras.sharding.ShardedOptimizer` inside ``optimizer``'s wrappers, or None.

    Args:
        optimizer: A Keras optimizer, possibly wrapped (``DistributedOptimizer``,
            ``DistributedLossScaleOptimizer``), or None.

    Returns:
        The sharded optimizer, or None when ``optimizer`` does not shard.
    """
    while optimizer is not None:
        if isinstance(optimizer, ShardedOptimizer):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


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
