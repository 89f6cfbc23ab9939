"""``ddlrun --rehearse N``: run a ddlrun job on ``N`` virtual nodes of this machine.

ddlrun builds its mpirun command as for a real cluster with hosts
``node0..node<N-1>`` (``-np`` ranks, the same number per node), adds the
cluster's Open MPI options (:func:`ddl_tf.cluster.mpi.mca_arguments`), then
creates the cluster, runs mpirun inside node 0 and tears the cluster down
however the job ends.

Example:
    >>> from ddl_tf.cluster.rehearse import rehearsal_hosts
    >>> [str(h) for h in rehearsal_hosts(2, 4)]
    ['node0:2', 'node1:2']
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from ddl_tf.cluster import counters
from ddl_tf.cluster.cluster import Cluster
from ddl_tf.cluster.netns import kill_processes, unavailable_reason
from ddl_tf.cluster.spec import ClusterSpec
from ddl_tf.errors import LaunchError
from ddl_tf.launch.hosts import Host

__all__ = ["rehearsal_hosts", "rehearsal_spec", "require_cluster", "run_rehearsal", "EXAMPLE"]

logger = logging.getLogger(__name__)

EXAMPLE = "ddlrun --rehearse 2 -np 4 --link 1gbit --algo hierarchical train.py"

READER_GRACE_S = 5.0
"""Seconds to wait for the last of mpirun's output once it has ended."""


def rehearsal_hosts(nodes: int, np_: int) -> list[Host]:
    """Hosts ``node0..`` with ``np_ / nodes`` slots each.

    Args:
        nodes: Number of virtual nodes (``--rehearse N``).
        np_: Total ranks (``-np``).

    Returns:
        One :class:`~ddl_tf.launch.hosts.Host` per node, in node order.

    Raises:
        LaunchError: ``np_`` is not a positive multiple of ``nodes``.
    """
    if nodes < 1 or np_ < 1 or np_ % nodes:
        raise LaunchError(
            f"ddlrun: --rehearse {nodes} needs -np to be a positive multiple of {nodes} (the "
            f"same number of ranks on every virtual node). Received -np {np_}; e.g. {EXAMPLE}"
        )
    return [Host(f"node{k}", np_ // nodes) for k in range(nodes)]


def rehearsal_spec(nodes: int, link: str | None, latency: str | None) -> ClusterSpec:
    """The cluster for ``--rehearse``; ``link`` ``none`` or ``unlimited`` leaves links unshaped.

    Args:
        nodes: Number of virtual nodes.
        link: Per-node link rate in ``tc`` units (e.g. ``"1gbit"``); None, ``"none"``
            or ``"unlimited"`` for unshaped links.
        latency: Added one-way node-to-node delay (e.g. ``"100us"``); None for none.

    Returns:
        The :class:`~ddl_tf.cluster.spec.ClusterSpec` (random prefix).
    """
    if link is not None and link.lower() in ("none", "unlimited"):
        link = None
    return ClusterSpec(nodes=nodes, link=link, latency=latency)


def require_cluster() -> None:
    """Raise :class:`LaunchError` if this machine cannot host a rehearsal cluster, saying why."""
    reason = unavailable_reason()
    if reason is not None:
        raise LaunchError(f"ddlrun: --rehearse: {reason}. Run as root, e.g. sudo {EXAMPLE}")


def run_rehearsal(
    spec: ClusterSpec,
    command: list[str],
    child_env: dict[str, str],
    report: Callable[[str], None] | None = None,
    watch: Callable[[IO[bytes], IO[str]], None] | None = None,
    again: Callable[[int], tuple[list[str], dict[str, str]] | None] | None = None,
    stop: threading.Event | None = None,
    grace: float = 1.0,
) -> int:
    """Create the cluster, run ``command`` (mpirun) inside node 0, tear down; mpirun's return code.

    Ctrl-C, SIGTERM and SIGHUP stop the job and remove the cluster. When the
    job has ended, what crossed each node's link during it (from the
    interface counters, :func:`ddl_tf.cluster.counters.describe_traffic`)
    goes to ``report``, one line per node (default: this module's logger, at
    info level).

    Args:
        spec: The cluster to build.
        command: The full mpirun argument list, run inside node 0.
        child_env: mpirun's environment (every rank inherits it).
        report: Called with each traffic line; None logs them at info level.
        watch: ``watch(stream, sink)`` reads mpirun's standard output and error (a
            thread each) instead of them going straight to this process's, and
            passes them on to ``sink`` (``sys.stdout``, ``sys.stderr``).
        again: Called with mpirun's exit code when it ends: the next command and
            environment to run inside node 0 of the same cluster (an elastic job
            relaunched on the nodes that survived a node crash), or None to stop.
        stop: If given and set while a launch runs (``watch`` read that it cannot go
            on: an elastic job's spawned ranks never connected), that launch gets
            ``grace`` seconds to end by itself; then every process in the cluster's
            nodes is killed (mpirun, its daemons, ranks that hang), and ``again`` decides.
        grace: Seconds a launch stopped through ``stop`` gets.

    Returns:
        The last mpirun's exit code (negative if a signal ended it).
    """
    with Cluster(spec) as cluster:
        before = counters.snapshot(cluster)
        pipe = subprocess.PIPE if watch is not None else None
        while True:
            proc = cluster.popen(0, command, env=child_env, text=False, stdout=pipe, stderr=pipe)
            readers = []
            if watch is not None:
                for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                    thread = threading.Thread(target=watch, args=(stream, sink), daemon=True)
                    readers.append(thread)
                    thread.start()
            code = _wait(proc, stop, grace)  # an exception or signal: Cluster.close() stops it
            if stop is not None and stop.is_set() and cluster.tools is not None:
                kill_processes(cluster.tools, list(spec.node_namespaces), grace=0.0)
            for reader in readers:
                reader.join(timeout=READER_GRACE_S)
            relaunch = again(code) if again is not None else None
            if relaunch is None:
                break
            command, child_env = relaunch
        for line in counters.describe_traffic(before, counters.snapshot(cluster)):
            if report is None:
                logger.info("link traffic of the job: %s", line)
            else:
                report(line)
        return code


def _wait(proc: subprocess.Popen, stop: threading.Event | None, grace: float) -> int:
    """``proc``'s return code; ``grace`` seconds after ``stop`` is set, SIGKILL it first."""
    stopped_at = None
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if stop is None or not stop.is_set():
                continue
            stopped_at = stopped_at or time.monotonic()
            if time.monotonic() - stopped_at > grace:
                proc.kill()
                return proc.wait()
