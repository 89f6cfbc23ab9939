"""The process's current :class:`~ddl_tf.core.job.Job`: the one place that holds it.

``init()`` installs a job here, ``shutdown()`` removes it, and an elastic
membership change puts a new one in its place. Everything that needs "the
job" (the rank queries of :mod:`~ddl_tf.core.basics`, the process sets of
:mod:`~ddl_tf.core.process_sets`, the framework layers) asks this module, so
none of them needs another's state.

Example (one process):
    >>> from ddl_tf.core import basics, current
    >>> current.get() is None
    True
    >>> _ = basics.init()
    >>> current.job().size, current.CURRENT.rank
    (1, 0)
    >>> basics.shutdown()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddl_tf.errors import NotInitializedError

if TYPE_CHECKING:
    from ddl_tf.core.job import Job

__all__ = [
    "job",
    "get",
    "install",
    "lock",
    "CurrentEngine",
    "CURRENT",
    "set_tracing_probe",
    "note_job_read",
    "take_job_reads",
]

lock = threading.Lock()
"""Held while a job is installed or removed (``init``, ``shutdown``, membership changes)."""

_job: Job | None = None


def get() -> Job | None:
    """The current job, or None before ``init()`` and after ``shutdown()``."""
    return _job


def job() -> Job:
    """The current job.

    Raises:
        NotInitializedError: ``init()`` has not been called.
    """
    if _job is None:
        raise NotInitializedError(
            "ddl_tf is not initialized. Call ddl_tf.init() (import ddl_tf as hvd; hvd.init()) "
            "on every rank before using collectives or rank queries."
        )
    return _job


def install(new: Job | None) -> Job | None:
    """Make ``new`` the current job (None: no job); return the one it replaces.

    The replaced job's process sets are unregistered (their ids become None),
    since they named ranks of a membership that no longer exists.
    """
    global _job
    old, _job = _job, new
    if old is not None and old is not new:
        old.forget_process_sets()
    return old


# ------------------------------------------------------------------ traces and the job
# A traced step (tf.function) that reached the job only through CURRENT's collectives, which
# read the job when they run, stays right when an elastic job's membership changes; one that
# read the job's rank or size (or took a real engine) while it was traced holds that
# membership's values. These record whether any trace did, so that an elastic state traces
# the step again only then (ddl_tf.tensorflow.elastic.TensorFlowKerasState.reset).


def _never() -> bool:
    return False


_tracing: Callable[[], bool] = _never
# engine attributes that every membership of a job has alike (the job's settings)
_SAME_IN_EVERY_MEMBERSHIP = frozenset({"elastic", "config", "policy", "timeline"})
_job_read_in_trace = False


def set_tracing_probe(probe: Callable[[], bool]) -> None:
    """Say how to tell that code runs while a graph is traced (the framework layer sets it)."""
    global _tracing
    _tracing = probe


def note_job_read() -> None:
    """Record that a value of the current job was read, if a graph is being traced now."""
    global _job_read_in_trace
    if not _job_read_in_trace and _tracing():
        _job_read_in_trace = True


def take_job_reads() -> bool:
    """Whether a trace read the job since the last call (and forget it: the caller retraces)."""
    global _job_read_in_trace
    read, _job_read_in_trace = _job_read_in_trace, False
    return read


class CurrentEngine:
    """Stands for the current job's engine *as it is when used* (elastic jobs).

    A collective traced into a ``tf.function`` keeps the engine it was given;
    an elastic job replaces its engine at every membership change. Given this
    instead, the traced op reaches whichever engine is current when it runs,
    as Horovod's ops (which read the job's state at run time) do.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # introspection (doctest, copy, pickle) is not the engine's
            raise AttributeError(name)
        value = getattr(job().engine, name)
        if name not in _SAME_IN_EVERY_MEMBERSHIP and not callable(value):
            note_job_read()  # rank, size, topology: this membership's values
        return value

    def __repr__(self) -> str:
        return f"CurrentEngine({_job.engine!r})" if _job is not None else "CurrentEngine(None)"


CURRENT = CurrentEngine()
"""The one :class:`CurrentEngine`."""
