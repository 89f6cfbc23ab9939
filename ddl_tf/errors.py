"""Exceptions raised by ddl_tf.

Every error ddl_tf raises on purpose is a :class:`DDLError`. Collective
failures are raised on every rank that takes part, so a job fails instead of
hanging: ranks exchange what they are about to do (and any argument error one
of them found) before data moves, and all raise the same error.

Where Horovod raises a Python built-in, the ddl_tf class subclasses it too
(:class:`UnsupportedError` is a ``NotImplementedError``,
:class:`CollectiveArgumentError` a ``ValueError``), so ``except`` clauses
written for Horovod keep working. The TensorFlow-typed variants
(``tf.errors.FailedPreconditionError``, ``tf.errors.InvalidArgumentError``,
the latter for collective argument errors and for a process set that excludes
the calling rank) live in :mod:`ddl_tf.tensorflow.tf_errors`, which the TensorFlow layer raises.

Example:
    >>> from ddl_tf.errors import CollectiveMismatchError, DDLError
    >>> issubclass(CollectiveMismatchError, DDLError)
    True
"""

__all__ = [
    "DDLError",
    "ConfigError",
    "NotInProcessSetError",
    "NotInitializedError",
    "TopologyError",
    "CollectiveMismatchError",
    "CollectiveArgumentError",
    "UnsupportedError",
    "ExecutionModeError",
    "StallError",
    "LaunchError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "RestoreError",
    "StartupError",
]


class DDLError(Exception):
    """Base class of every error raised by ddl_tf."""


class ConfigError(DDLError, ValueError):
    """An option or environment variable has an invalid value."""


class NotInProcessSetError(ConfigError):
    """A collective on a process set that does not include the calling rank (the TensorFlow
    layer raises it as a ``tf.errors.InvalidArgumentError`` too, as Horovod does)."""


class NotInitializedError(DDLError, RuntimeError):
    """A collective or query was called before ``ddl_tf.init()``."""


class TopologyError(DDLError):
    """The process layout (hosts, local ranks, topology file) is inconsistent."""


class CollectiveMismatchError(DDLError):
    """Ranks issued different collectives (name, shape, dtype, op or order)."""


class CollectiveArgumentError(DDLError, ValueError):
    """A collective's arguments are invalid on some rank (e.g. alltoall splits that do not
    add up, a scalar where a dimension is needed); every rank of the collective raises it."""


class UnsupportedError(DDLError, NotImplementedError):
    """A valid Horovod call that ddl_tf does not implement (Adasum, ``tf.IndexedSlices``
    with Min/Max/Product or scale factors, ...)."""


class ExecutionModeError(DDLError, RuntimeError):
    """A graph-mode-only API was called eagerly (or the reverse)."""


class StallError(DDLError):
    """Some ranks did not reach a collective within the configured shutdown time."""


class RestoreError(DDLError, ValueError):
    """A checkpoint cannot be restored whole (its optimizer, with its state, or its random
    generators); the message names the route that restores it."""


class StartupError(DDLError, RuntimeError):
    """Ranks of the job did not call ``init()`` within the start-up timeout
    (``DDL_START_TIMEOUT``); the message names them."""


class LaunchError(DDLError):
    """``ddlrun`` refused to start a job (bad hosts, slots, missing Python, ...)."""


class HorovodInternalError(DDLError, RuntimeError):
    """A collective met a rank that failed (Horovod's name, caught by ``hvd.elastic.run``).

    Raised on every surviving rank of an elastic job (``ddlrun --min-np``)
    instead of a hang: ``elastic.run`` restores the last commit, re-forms the
    job without the failed rank's host and calls the training function again.
    """


class HostsUpdatedInterrupt(DDLError, RuntimeError):
    """Hosts were added to or removed from an elastic job (raised at ``state.commit()``).

    Attributes:
        skip_sync: True when no rank joins (only hosts left), so the state
            need not be broadcast again.
    """

    def __init__(self, skip_sync: bool = False, message: str = "") -> None:
        super().__init__(message or "the elastic job's hosts changed")
        self.skip_sync = skip_sync
