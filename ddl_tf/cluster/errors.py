"""Errors of the rehearsal cluster; all are :class:`ddl_tf.errors.DDLError`.

Example:
    >>> from ddl_tf.cluster.errors import ClusterError, ClusterUnavailableError
    >>> from ddl_tf.errors import DDLError
    >>> issubclass(ClusterUnavailableError, ClusterError) and issubclass(ClusterError, DDLError)
    True
"""

from ddl_tf.errors import DDLError

__all__ = ["ClusterError", "ClusterUnavailableError", "NetemUnavailableError", "ClusterJobTimeout"]


class ClusterError(DDLError):
    """Creating, using or tearing down a rehearsal cluster failed."""


class ClusterUnavailableError(ClusterError):
    """This machine cannot host a rehearsal cluster (not root, or ``ip``/``tc`` missing)."""


class NetemUnavailableError(ClusterError):
    """An added latency was requested but the kernel has no ``netem`` qdisc."""


class ClusterJobTimeout(ClusterError):
    """A command in the cluster outlived its time limit and was killed."""
