"""The elastic state protocol and ``run``, for any framework: commit, restore, sync, retry.

A *state* object holds what a training function must not lose when the job's
membership changes: :meth:`State.commit` saves it in host memory and checks
for host changes, :meth:`State.restore` puts the last commit back,
:meth:`State.sync` makes every rank's equal to rank 0's. :func:`run` calls the
training function and, in an elastic job, retries it after a lost rank
(restore, re-form, reset callbacks, sync) or a host change (re-form at the
commit). :class:`ObjectState` tracks plain Python attributes; the TensorFlow
layer adds variables and Keras models (:mod:`ddl_tf.tensorflow.elastic`).

Example (one process):
    >>> from ddl_tf.core import basics
    >>> from ddl_tf.membership.state import ObjectState
    >>> _ = basics.init()
    >>> state = ObjectState(epoch=0, batch=0)
    >>> state.epoch = 3; state.commit(); state.epoch = 4; state.restore(); state.epoch
    3
    >>> basics.shutdown()
"""

from __future__ import annotations

import abc
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ddl_tf import env
from ddl_tf.core import basics, current
from ddl_tf.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl_tf.membership import mirror
from ddl_tf.membership.reform import membership

__all__ = ["State", "ObjectState", "run", "lost_a_rank"]

logger = logging.getLogger(__name__)


def _broadcast_object(obj: Any) -> Any:
    return basics.engine().broadcast_object(obj, 0, name="elastic.state")


def _rank() -> int:
    return basics.rank()


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
        self.commit_count = 0  # commits so far (a relaunch resumes from the highest)

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
        """Save the state in host memory (the restore point), then check for host changes.

        In a job launched by ``ddlrun``, the commit is also mirrored to a file
        in the host's memory, from which a relaunch after a node crash resumes
        (:mod:`ddl_tf.membership.mirror`).
        """
        self.save()
        # getattr: a subclass of Horovod's State may not call State.__init__
        self.commit_count = getattr(self, "commit_count", 0) + 1
        if env.elastic_job():
            mirror.write(self)
        self.check_host_updates()

    def mirror_payload(self) -> Any:
        """The last commit as a picklable value (for the host-memory mirror), or None.

        None (this base class) means the state cannot be mirrored: a node crash
        loses it. The library's states return their committed values.
        """
        return None

    def load_mirror(self, payload: Any) -> None:
        """Make ``payload`` (from :meth:`mirror_payload`) the last commit, and restore it.

        Raises:
            MirrorError: This state gives a commit (:meth:`mirror_payload`) but does
                not say how to put one back.
        """
        raise mirror.MirrorError(
            f"{type(self).__name__}.mirror_payload() gave a commit, but {type(self).__name__} "
            "has no load_mirror(): override load_mirror(payload) to restore what "
            "mirror_payload() returns, or return None from mirror_payload() (the state is then "
            "not kept across a node crash)."
        )

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when hosts changed (collective).

        Only in elastic jobs with a discovery script; a fixed-size job has no updates.
        """
        if env.elastic_job():
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

    def __init__(self, bcast_object=_broadcast_object, get_rank=_rank, **kwargs: Any) -> None:
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def mirror_payload(self) -> Any:
        return {"attributes": dict(self._saved_state)}

    def load_mirror(self, payload: Any) -> None:
        self._saved_state = dict(payload["attributes"])
        self.restore()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


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
        members = membership()
        # ranks ddlrun relaunched after a node crash start from the survivors' last commit
        skip_sync = mirror.resume(state)
        while True:
            try:
                if not skip_sync:
                    state.sync()
                    mirror.share_count(state)
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                members.update_hosts()
            except Exception as err:
                if not lost_a_rank(err):
                    raise
                logger.warning("rank %d: %s; restoring the last commit", basics.rank(), err)
                state.restore()
                skip_sync = False
                members.recover()
            state.on_reset()

    return wrapper


def lost_a_rank(err: BaseException) -> bool:
    """Whether ``err`` (or what a framework made of it, e.g. inside a graph) is a lost rank."""
    if isinstance(err, HorovodInternalError):
        return True
    job = current.get()
    return job is not None and job.engine.state.lost
