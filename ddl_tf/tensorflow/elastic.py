"""``hvd.elastic``: state objects that survive membership changes, and ``run``.

Horovod's elastic mode lets hosts leave and join a running job
(``ddlrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh``,
see :mod:`ddl_tf.membership.reform` for how the job re-forms). The
training function keeps its progress in a *state* object:

* ``sync()`` broadcasts the tracked variables and attributes from rank 0
  (every rank, newcomers included, starts from the same state);
* ``commit()`` saves the current values in host memory and checks for host
  changes (``HostsUpdatedInterrupt`` on every rank when there are some);
* ``restore()`` puts the last committed values back;
* :func:`run` calls the function; when a rank fails
  (:class:`~ddl_tf.errors.HorovodInternalError`) it restores the last commit,
  re-forms the job without the failed host and calls it again; when hosts
  change it re-forms the job at the commit and goes on. Reset callbacks run
  after every change.

In a job launched without elastic options the membership is fixed: ``run``
syncs and calls the function once, and a failure ends the job as before.

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

from ddl_tf import env
from ddl_tf.core import basics
from ddl_tf.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = [
    "State",
    "ObjectState",
    "TensorFlowState",
    "TensorFlowKerasState",
    "run",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]

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
        """Functions to call after each membership change (e.g. to rescale the learning rate).

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

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when hosts changed (collective).

        Only in elastic jobs with a discovery script; a fixed-size job has no updates.
        """
        if env.elastic_job():
            from ddl_tf.membership.reform import membership

            membership().check_host_updates()

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
        optimizer = self.optimizer
        if optimizer is not None and not getattr(optimizer, "built", True):
            # a rank that joins has not trained yet: its optimizer must hold the same
            # slots as those of the ranks it receives them from
            optimizer.build(self.model.trainable_variables)
        optimizer_vars = list(optimizer.variables) if optimizer is not None else []
        return list(self.model.variables) + optimizer_vars

    def reset(self) -> None:
        """Make Keras trace the model's step functions again, for the new membership."""
        for attr in ("train_function", "test_function", "predict_function"):
            if hasattr(self.model, attr):
                setattr(self.model, attr, None)

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
    """Decorate an elastic training function ``func(state, *args, **kwargs)``.

    The wrapper syncs the state and calls ``func``. In an elastic job, when a
    rank fails it restores the last commit, re-forms the job without the
    failed host, runs the reset callbacks and calls ``func`` again (after a
    new sync); when hosts change (at a commit) it re-forms the job for them
    and calls ``func`` again from the committed state. In a fixed-size job it
    calls ``func`` once.

    Args:
        func: The training function; its first argument is the state.

    Returns:
        The wrapped function.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not env.elastic_job():
            state.sync()
            return func(state, *args, **kwargs)
        from ddl_tf.membership.reform import membership

        members = membership()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                members.update_hosts()
            except Exception as err:
                if not _lost_a_rank(err):
                    raise
                logger.warning("rank %d: %s; restoring the last commit", basics.rank(), err)
                state.restore()
                skip_sync = False
                members.recover()
            state.on_reset()

    return wrapper


def _lost_a_rank(err: BaseException) -> bool:
    """Whether ``err`` (or what TensorFlow made of it inside a graph) is a lost rank."""
    if isinstance(err, HorovodInternalError):
        return True
    return basics.is_initialized() and basics.job().engine.state.lost
