"""Rehearse a multi-node job on one machine: network-namespace nodes, shaped links, real MPI.

Topology-aware allreduce only pays off when links differ: fast inside a
node, slow between nodes. This package builds such a machine: every virtual
node is a Linux network namespace with its own hostname and address, linked
to a bridge through a veth pair whose both directions are shaped with ``tc``
(htb) to a link rate, and Open MPI jobs run across the nodes without ssh.
Needs root, ``ip``, ``tc`` and ``unshare``.

* :mod:`~ddl_tf.cluster.spec`: :class:`ClusterSpec` (nodes, link, latency, names);
* :mod:`~ddl_tf.cluster.netns`: the ``ip``/``tc`` commands, process sweep, removal;
* :mod:`~ddl_tf.cluster.mpi`: Open MPI's launch agent and arguments;
* :mod:`~ddl_tf.cluster.cluster`: :class:`Cluster` (context manager), :func:`cleanup`;
* :mod:`~ddl_tf.cluster.bounds`: the bandwidth lower bound of an allreduce;
* :mod:`~ddl_tf.cluster.counters`: the bytes that crossed each node's link (interface counters);
* :mod:`~ddl_tf.cluster.traffic`: the bytes each allreduce algorithm should send per node link;
* :mod:`~ddl_tf.cluster.probe`: TCP throughput of the links, bounded in bytes and time, and
  whether halving the rate doubles a transfer's time (links, not CPUs, are the bottleneck);
* :mod:`~ddl_tf.cluster.rehearse`: the cluster behind ``ddlrun --rehearse N``;
* :mod:`~ddl_tf.cluster.cli`: ``python -m ddl_tf.cluster``.

It builds on the launch library (:mod:`ddl_tf.launch`: hosts, the mpirun
lookup); the ``ddlrun`` command (:mod:`ddl_tf.ddlrun`) builds on both.

Example:
    >>> from ddl_tf.cluster import ClusterSpec, allreduce_lower_bound
    >>> spec = ClusterSpec(nodes=2, link="1gbit", prefix="ddlcdemo")
    >>> round(allreduce_lower_bound(64 << 20, nodes=2, link_bps=spec.link_bps), 3)
    0.537
"""

from ddl_tf.cluster.bounds import allreduce_lower_bound
from ddl_tf.cluster.cluster import Cluster, create
from ddl_tf.cluster.counters import LinkCounters
from ddl_tf.cluster.errors import (
    ClusterError,
    ClusterJobTimeout,
    ClusterUnavailableError,
    NetemUnavailableError,
)
from ddl_tf.cluster.netns import unavailable_reason
from ddl_tf.cluster.registry import cleanup, list_clusters
from ddl_tf.cluster.spec import ClusterSpec, parse_duration, parse_rate
from ddl_tf.cluster.traffic import expected_link_bytes, minimum_link_bytes

__all__ = [
    "Cluster",
    "ClusterSpec",
    "create",
    "cleanup",
    "list_clusters",
    "unavailable_reason",
    "allreduce_lower_bound",
    "LinkCounters",
    "expected_link_bytes",
    "minimum_link_bytes",
    "parse_rate",
    "parse_duration",
    "ClusterError",
    "ClusterUnavailableError",
    "NetemUnavailableError",
    "ClusterJobTimeout",
]
