"""``hvd.elastic`` state objects for fixed-size jobs: ``commit`` / ``restore`` / ``sync`` and ``run``.

Horovod's elastic mode lets hosts join and leave a running job
(``horovodrun --min-np``); the training function keeps its progress in a
*state* object that is committed every few batches, restored after a
failure and re-synchronized when membership changes. **ddl_tf jobs have a
fixed membership** (MPI fixes it at launch), so elastic membership is out of
scope; what this module gives is the state API, so that Horovod elastic
scripts run unchanged as fixed-size jobs:

* ``sync()`` broadcasts the tracked variables and the saved attributes from
  rank 0 (every rank starts from the same state);
* ``commit()`` saves the current values in host memory (and would check for
  host changes; there never are any);
* ``restore()`` puts the last committed values back;
* :func:`run` syncs the state and calls the function once: with a fixed
  membership there is nothing to retry.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> v = tf.Variable([1.0, 2.0])
    >>> state = hvd.elastic.TensorFlowState([v], epoch=3)
    >>> state.sync(); _ = v.assign([5.0, 5.0]); state.epoch = 4; state.restore()
    >>> v.numpy().tolist(), state.epoch
    ([1.0, 2.0], 3)
    >>> hvd.shutdown()
"""

from __future__ import annotations

import abc
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = ["State", "ObjectState", "TensorFlowState", "TensorFlowKerasState", "run"]

logger = logging.getLogger(__name__)


class State(abc.ABC):
    """Base of the state objects: reset callbacks and the commit protocol.

    Args:
        bcast_object: Broadcasts a picklable object from rank 0.
        get_rank: Returns this process's rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], None]]) -> None:
        """Functions to call after a membership change (never, in a fixed-size job).

        Args:
            callbacks: Functions taking no arguments; appended to those already
                registered.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Reset the state and run the reset callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in host memory (the restore point), then check for host changes."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Horovod raises ``HostsUpdatedInterrupt`` here; a fixed-size job has no updates."""

    @abc.abstractmethod
    def save(self) -> None:
        """Save the state in host memory."""

    @abc.abstractmethod
    def restore(self) -> None:
        """Undo every change since the last commit."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make every rank's state equal to rank 0's."""

    def reset(self) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Hook for subclasses, called by :meth:`on_reset`."""


class ObjectState(State):
    """State of plain Python attributes, given as keyword arguments.

    Args:
        bcast_object: Broadcasts a picklable object from rank 0.
        get_rank: Returns this process's rank.
        **kwargs: Attributes to track (``state.epoch``, ``state.batch``, ...).
    """

    def __init__(self, bcast_object=broadcast_object, get_rank=basics.rank, **kwargs: Any) -> None:
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class TensorFlowState(ObjectState):
    """State of a list of TensorFlow variables plus keyword attributes.

    Args:
        variables: Variables to track (default: ``tf.compat.v1.global_variables()``).
        session: For ``tf.compat.v1`` graphs, the session holding the variables
            (default: the default session).
        **kwargs: Attributes to track.
    """

    def __init__(self, variables: Sequence | None = None, session=None, **kwargs: Any) -> None:
        self.variables = list(variables or tf.compat.v1.global_variables())
        self.session = session or (
            None if tf.executing_eagerly() else tf.compat.v1.get_default_session()
        )
        self._bcast_op = None
        if not tf.executing_eagerly():
            with bridge.outside_chain():  # run alone by sync(), never with the training step
                self._bcast_op = broadcast_variables(self.variables, 0)
        self._values: list = []
        self._save_variables()
        super().__init__(**kwargs)

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values, strict=True):
            if self.session is not None:
                variable.load(value, self.session)
            else:
                variable.assign(value)
        super().restore()

    def sync(self) -> None:
        if self.session is not None:
            if self._bcast_op is not None:
                self.session.run(self._bcast_op)
        else:
            broadcast_variables(self.variables, root_rank=0)
        self._save_variables()
        super().sync()

    def _save_variables(self) -> None:
        if self.session is not None:
            self._values = self.session.run(self.variables)
        else:
            self._values = [variable.numpy() for variable in self.variables]


class TensorFlowKerasState(ObjectState):
    """State of a built Keras model, its optimizer and keyword attributes.

    Args:
        model: A built Keras model.
        optimizer: The optimizer (default: ``model.optimizer``).
        backend: Accepted for Horovod compatibility (ignored).
        **kwargs: Attributes to track.

    Raises:
        ValueError: The model is not built yet.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any) -> None:
        if not model.built:
            raise ValueError(
                "TensorFlowKerasState needs a built model. Received an unbuilt "
                f"{type(model).__name__}; call model.build(input_shape) or run it on a batch first."
            )
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self._saved: list = []
        self._save_model()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        optimizer_vars = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + optimizer_vars

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved, strict=False):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved = [tf.convert_to_tensor(v).numpy() for v in self._variables()]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate an elastic training function: sync the state, then call it (once).

    In Horovod the wrapper also catches membership changes and failures,
    restores the state and calls the function again; a fixed-size ddl_tf job
    has no membership changes, and a failure ends the job.

    Args:
        func: ``func(state, *args, **kwargs)``.

    Returns:
        The wrapped function.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper
