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
from typing import TYPE_CHECKING, Any

from ddl_tf.errors import NotInitializedError

if TYPE_CHECKING:
    from ddl_tf.core.job import Job

__all__ = ["job", "get", "install", "lock", "CurrentEngine", "CURRENT"]

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
        return getattr(job().engine, name)

    def __repr__(self) -> str:
        return f"CurrentEngine({_job.engine!r})" if _job is not None else "CurrentEngine(None)"


CURRENT = CurrentEngine()
"""The one :class:`CurrentEngine`."""
