"""The :class:`Cluster` context manager: build the namespaces, run commands and MPI jobs, tear down.

Teardown (kill every process still inside the cluster's namespaces, delete
the namespaces, whose veth pairs and bridge go with them, remove the
``/etc/netns`` folders and the agent script) runs on normal exit, on any
exception, and on SIGINT/SIGTERM/SIGHUP while the ``with`` block runs (the
signal becomes an exception in the main thread, so ``__exit__`` runs). A
process killed with SIGKILL cannot clean up after itself; its cluster is
left for :func:`cleanup` (``python -m ddl_tf.cluster cleanup --stale``),
which finds it through the state file naming the dead owner.

Example (needs root; see ``python -m ddl_tf.cluster --help``)::

    from ddl_tf.cluster import Cluster, ClusterSpec
    with Cluster(ClusterSpec(nodes=2, link="1gbit")) as cluster:
        print(cluster.exec(1, ["hostname"]).stdout)          # node1
        cluster.mpirun(["python", "train.py"], ranks_per_node=2, timeout=600)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from ddl_tf.cluster import counters, netns, shaping
from ddl_tf.cluster import mpi as cluster_mpi
from ddl_tf.cluster.counters import LinkCounters
from ddl_tf.cluster.errors import ClusterError, ClusterJobTimeout
from ddl_tf.cluster.spec import ClusterSpec

__all__ = ["Cluster", "create"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ENTER_NODE = 'hostname "$0" && exec "$@"'


class Cluster:
    """A running rehearsal cluster (see the module docstring).

    Args:
        spec: What to build; :class:`~ddl_tf.cluster.spec.ClusterSpec`.

    Raises (on :meth:`start` / ``__enter__``):
        ClusterUnavailableError: Not root, or ``ip``/``tc``/``unshare`` missing.
        NetemUnavailableError: ``spec.latency`` set on a kernel without netem.
        ClusterError: A command failed (everything built so far is removed).
    """

    def __init__(self, spec: ClusterSpec | None = None) -> None:
        self.spec = spec or ClusterSpec()
        self.tools: netns.Tools | None = None
        self._children: list[subprocess.Popen] = []
        self._started = False
        self._closed = False
        self._previous_handlers: dict[int, object] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Cluster:
        """Create namespaces, links, shaping, host files and the launch agent."""
        if self._started:
            return self
        self.tools = netns.find_tools()
        spec = self.spec
        if netns.list_namespaces(self.tools, spec.prefix):
            raise ClusterError(
                f"cluster prefix {spec.prefix!r} is in use ({', '.join(spec.namespaces)} exist). "
                f"Pick another prefix, or remove a crashed run's cluster with "
                f"`python -m ddl_tf.cluster cleanup --prefix {spec.prefix}`."
            )
        self._started = True
        started = time.monotonic()
        try:
            self._write_state()
            for cmd in netns.setup_commands(spec, self.tools):
                netns.run(cmd)
            netns.require_netem(spec, self.tools)
            for node in range(spec.nodes):
                for cmd in shaping.shaping_commands(spec, self.tools, node):
                    netns.run(cmd)
                etc = spec.etc_dir(node)
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(netns.hosts_file(spec))
            spec.agent_path.write_text(cluster_mpi.agent_script(spec, self.tools))
            spec.agent_path.chmod(0o700)
        except BaseException:
            self.close()
            raise
        logger.info(
            "created %s in %.2f s", spec.describe().splitlines()[0], time.monotonic() - started
        )
        return self

    def _write_state(self) -> None:
        self.spec.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = {
            "prefix": self.spec.prefix,
            "owner_pid": os.getpid(),
            "created": time.time(),
            "namespaces": list(self.spec.namespaces),
            "nodes": self.spec.nodes,
            "link": self.spec.link,
        }
        tmp = self.spec.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.spec.state_file)

    def close(self) -> None:
        """Tear everything down (idempotent; signals are held off until it is done)."""
        if self._closed or not self._started:
            return
        self._closed = True
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            for proc in self._children:
                _stop_group(proc)
            tools = self.tools or netns.find_tools()
            removed = netns.remove_prefix(tools, self.spec.prefix, list(self.spec.namespaces))
            logger.info("removed cluster %s (%d namespaces)", self.spec.prefix, len(removed))
        finally:
            if in_main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    def __enter__(self) -> Cluster:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, _raise_on_signal)
        try:
            return self.start()
        except BaseException:
            self._restore_handlers()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        finally:
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous_handlers.clear()

    # ------------------------------------------------------------------ running things

    def node_command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside node ``node`` (its network and UTS namespaces).

        Args:
            node: Node index, 0 to ``spec.nodes - 1``.
            argv: The command and its arguments.

        Returns:
            The full argument list (``ip netns exec ... unshare --uts ...``).

        Raises:
            ClusterError: The cluster is not running or the node does not exist.
        """
        self._check_running()
        assert self.tools is not None
        spec = self.spec
        if not 0 <= node < spec.nodes:
            raise ClusterError(
                f"node {node} does not exist; this cluster has nodes 0..{spec.nodes - 1}."
            )
        return [
            self.tools.ip,
            "netns",
            "exec",
            spec.node_namespaces[node],
            self.tools.unshare,
            "--uts",
            "sh",
            "-c",
            _ENTER_NODE,
            spec.hostnames[node],
            *argv,
        ]

    def exec(
        self,
        node: int,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on node ``node`` and wait (output captured as text).

        Args:
            node: Node index.
            argv: The command and its arguments.
            timeout: Seconds before the command is killed.
            env: Its environment (default: this process's).
            check: Raise if it exits non-zero.

        Returns:
            The completed process, with ``stdout`` and ``stderr`` as text.

        Raises:
            ClusterJobTimeout: It ran longer than ``timeout`` (it is killed).
            ClusterError: ``check`` and it exited non-zero.
        """
        proc = self.popen(node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise ClusterJobTimeout(
                f"`{' '.join(argv)}` on node {node} ran longer than {timeout:.0f} s and was killed."
            ) from None
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"`{' '.join(argv)}` on node {node} failed with exit code {proc.returncode}: "
                f"{err.strip()[-2000:]}"
            )
        return result

    def popen(self, node: int, argv: Sequence[str], *, env=None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on node ``node`` in its own process group; teardown stops it.

        Args:
            node: Node index.
            argv: The command and its arguments.
            env: Its environment (default: this process's).
            **kwargs: More ``subprocess.Popen`` arguments (``text=True`` by default).

        Returns:
            The started process.
        """
        kwargs.setdefault("text", True)
        proc = subprocess.Popen(
            self.node_command(node, argv),
            env=dict(env) if env is not None else None,
            start_new_session=True,
            **kwargs,
        )
        self._children.append(proc)
        return proc

    def mpirun_command(
        self,
        program: Sequence[str],
        *,
        ranks_per_node: int = 1,
        mpirun: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> list[str]:
        """The mpirun argument list (run on node 0) for ``program`` on every node.

        Args:
            program: The command every rank runs.
            ranks_per_node: Ranks per node.
            mpirun: The mpirun executable (default: the one found on this machine).
            extra_args: More mpirun arguments (before the program).

        Returns:
            The argument list.
        """
        return cluster_mpi.mpirun_command(
            self.spec, program, ranks_per_node=ranks_per_node, mpirun=mpirun, extra_args=extra_args
        )

    def mpirun(
        self,
        program: Sequence[str],
        *,
        ranks_per_node: int = 1,
        timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        capture: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``program`` as an MPI job on every node (``ranks_per_node`` ranks each).

        mpirun runs inside node 0; Open MPI starts its daemons on the other
        nodes through the cluster's agent, uses shared memory between ranks
        of a node and TCP, restricted to the cluster subnet, between nodes.

        Args:
            program: The command every rank runs.
            ranks_per_node: Ranks per node.
            timeout: Seconds before the whole job is killed (ClusterJobTimeout).
            env: Environment of mpirun and, through it, of every rank
                (default: this process's, plus Open MPI's root permission when root).
            extra_args: More mpirun arguments (before the program).
            capture: Capture stdout/stderr as text (else they pass through).

        Returns:
            The completed process (any exit code; check ``returncode``).
        """
        cmd = self.mpirun_command(program, ranks_per_node=ranks_per_node, extra_args=extra_args)
        pipe = subprocess.PIPE if capture else None
        proc = self.popen(0, cmd, env=cluster_mpi.job_environment(env), stdout=pipe, stderr=pipe)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            netns.kill_processes(self.tools, list(self.spec.node_namespaces))  # type: ignore[arg-type]
            raise ClusterJobTimeout(
                f"MPI job `{' '.join(program)}` ran longer than {timeout:.0f} s and was killed "
                "(with every process in the cluster's nodes)."
            ) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def link_counters(self, node: int) -> LinkCounters:
        """What node ``node`` sent and received on its link so far (see :mod:`~ddl_tf.cluster.counters`).

        Args:
            node: Node index.

        Returns:
            The node's interface counters.
        """
        self.node_command(node, [])  # checks that it runs and that the node exists
        return counters.read_node(self.tools, self.spec.node_namespaces[node])

    def set_link(self, link: str) -> None:
        """Change every node's link rate (``tc`` units, e.g. ``"200mbit"``) in place.

        The htb classes change while jobs run and connections stay open;
        :attr:`spec` becomes one with the new ``link``.

        Args:
            link: The new rate per direction, in ``tc`` units.

        Raises:
            ConfigError: ``link`` is not a rate.
            ClusterError: The cluster was built unshaped, or ``tc`` failed.
        """
        self._check_running()
        assert self.tools is not None
        new = dataclasses.replace(self.spec, link=shaping.require_shaped(self.spec, link))
        for node in range(new.nodes):
            for cmd in shaping.rate_commands(new, self.tools, node):
                netns.run(cmd)
        self.spec = new
        logger.info("cluster %s: links now %s each direction", new.prefix, link)

    def _check_running(self) -> None:
        if not self._started or self._closed:
            raise ClusterError(
                "the cluster is not running; use it inside `with Cluster(spec) as cluster:`."
            )


def _raise_on_signal(signum, frame):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _stop_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group of ``proc`` (mpirun then stops its ranks), SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def create(
    nodes: int = 2, link: str | None = "1gbit", latency: str | None = None, **kwargs
) -> Cluster:
    """A :class:`Cluster` for ``ClusterSpec(nodes, link, latency, **kwargs)``; use it in ``with``.

    Args:
        nodes: Number of virtual nodes.
        link: Rate per direction of each node's link (``tc`` units), or None for unshaped.
        latency: One-way delay added with netem (e.g. ``"1ms"``), or None.
        **kwargs: More :class:`~ddl_tf.cluster.spec.ClusterSpec` fields.

    Returns:
        The cluster, not yet started.
    """
    return Cluster(ClusterSpec(nodes=nodes, link=link, latency=latency, **kwargs))
