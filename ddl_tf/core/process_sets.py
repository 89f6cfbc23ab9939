"""Horovod's process sets: ddl_tf has one, the global set (every rank of the job).

Collectives accept ``process_set=global_process_set`` (or None) for
compatibility; any other set is refused with a message naming the fix, and
``add_process_set`` / ``remove_process_set`` raise
:class:`~ddl_tf.errors.UnsupportedError` (a ``NotImplementedError``).

Example:
    >>> from ddl_tf.core.process_sets import global_process_set, check_process_set
    >>> check_process_set(global_process_set); global_process_set
    ProcessSet(global)
"""

from __future__ import annotations

from typing import Any

from ddl_tf.core import basics
from ddl_tf.errors import ConfigError, UnsupportedError

__all__ = [
    "ProcessSet",
    "global_process_set",
    "check_process_set",
    "add_process_set",
    "remove_process_set",
]


class ProcessSet:
    """Horovod's process set; ddl_tf only has the global one (every rank)."""

    process_set_id = 0

    def size(self) -> int:
        """Number of ranks in the set (all of them)."""
        return basics.size()

    def rank(self) -> int:
        """This process's rank in the set."""
        return basics.rank()

    def included(self) -> bool:
        """Whether this process belongs to the set (always)."""
        return True

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def check_process_set(process_set: Any) -> None:
    """Raise :class:`ConfigError` for any process set but the global one (shared by the API).

    Args:
        process_set: The ``process_set`` argument of a collective; None and
            ``global_process_set`` pass.

    Raises:
        ConfigError: any other value.
    """
    if process_set is not None and process_set is not global_process_set:
        raise ConfigError(
            f"ddl_tf supports only the global process set. Received process_set={process_set!r};"
            " drop the argument (collectives span every rank)."
        )


def add_process_set(process_set: Any) -> None:
    """Not available: ddl_tf collectives always span the whole job.

    Args:
        process_set: The process set (or ranks) Horovod would add.

    Raises:
        UnsupportedError: Always.
    """
    raise UnsupportedError(
        f"ddl_tf has no process sets besides the global one. Received {process_set!r}; run "
        "collectives over all ranks, or start a separate job for the subset (ddl_tf.init("
        "comm=[ranks]) makes a job of a subset of MPI_COMM_WORLD)."
    )


def remove_process_set(process_set: Any) -> None:
    """Not available (see :func:`add_process_set`).

    Args:
        process_set: The process set Horovod would remove.

    Raises:
        UnsupportedError: Always.
    """
    add_process_set(process_set)
