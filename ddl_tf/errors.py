"""Exceptions raised by ddl_tf.

Every error ddl_tf raises on purpose is a :class:`DDLError`. Collective
failures are raised on every rank that takes part, so a job fails instead of
hanging.

Example:
    >>> from ddl_tf.errors import CollectiveMismatchError, DDLError
    >>> issubclass(CollectiveMismatchError, DDLError)
    True
"""

__all__ = [
    "DDLError",
    "ConfigError",
    "NotInitializedError",
    "TopologyError",
    "CollectiveMismatchError",
    "StallError",
    "LaunchError",
]


class DDLError(Exception):
    """Base class of every error raised by ddl_tf."""


class ConfigError(DDLError, ValueError):
    """An option or environment variable has an invalid value."""


class NotInitializedError(DDLError, RuntimeError):
    """A collective or query was called before ``ddl_tf.init()``."""


class TopologyError(DDLError):
    """The process layout (hosts, local ranks, topology file) is inconsistent."""


class CollectiveMismatchError(DDLError):
    """Ranks issued different collectives (name, shape, dtype, op or order)."""


class StallError(DDLError):
    """Some ranks did not reach a collective within the configured shutdown time."""


class LaunchError(DDLError):
    """``ddlrun`` refused to start a job (bad hosts, slots, missing Python, ...)."""
