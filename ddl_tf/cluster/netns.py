"""The ``ip`` commands that build and remove a cluster's namespaces, and the process sweep.

Command lists are built by pure functions (:func:`setup_commands`; link
shaping in :mod:`ddl_tf.cluster.shaping`) so they can be read and tested
without root; the functions that run them only ever touch namespaces whose
names match :data:`~ddl_tf.cluster.spec.NAMESPACE_PATTERN` for the given
prefix. Every command runs with a time limit.

Example:
    >>> from ddl_tf.cluster.netns import Tools, setup_commands
    >>> from ddl_tf.cluster.spec import ClusterSpec
    >>> spec = ClusterSpec(nodes=2, prefix="ddlcdemo")
    >>> tools = Tools(ip="ip", tc="tc", unshare="unshare")
    >>> for cmd in setup_commands(spec, tools)[:4]:
    ...     print(" ".join(cmd))
    ip netns add ddlcdemo-sw
    ip netns add ddlcdemo-n0
    ip netns add ddlcdemo-n1
    ip -n ddlcdemo-sw link set lo up
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ddl_tf.cluster.errors import ClusterError, ClusterUnavailableError, NetemUnavailableError
from ddl_tf.cluster.spec import NAMESPACE_PATTERN, STATE_DIR, ClusterSpec

__all__ = [
    "Tools",
    "find_tools",
    "unavailable_reason",
    "setup_commands",
    "hosts_file",
    "run",
    "netem_available",
    "list_namespaces",
    "namespace_pids",
    "kill_processes",
    "remove_prefix",
]

logger = logging.getLogger(__name__)

COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the programs a cluster needs."""

    ip: str
    tc: str
    unshare: str


def unavailable_reason() -> str | None:
    """Why this machine cannot host a cluster (not root, tools missing), or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a rehearsal cluster needs root (network namespaces, veth links, tc shaping)"
    missing = [name for name in ("ip", "tc", "unshare") if _which(name) is None]
    if missing:
        return (
            f"a rehearsal cluster needs {', '.join(missing)} (iproute2 and util-linux); "
            "install them, e.g. apt-get install iproute2 util-linux"
        )
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces (/proc/self/ns/net is missing)"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )


def find_tools() -> Tools:
    """The tools, or :class:`ClusterUnavailableError` saying what is missing."""
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterUnavailableError(reason + ".")
    return Tools(ip=_which("ip"), tc=_which("tc"), unshare=_which("unshare"))  # type: ignore[arg-type]


def run(argv: list[str], *, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
    """Run one command; return its stdout.

    Args:
        argv: The command and its arguments (no shell).
        timeout: Seconds before it counts as failed.
        check: Raise on a non-zero exit (else return its stdout anyway).

    Raises:
        ClusterError: It failed (with the command and its stderr) or timed out.
    """
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s.") from None
    except OSError as err:
        raise ClusterError(f"`{' '.join(argv)}` could not start: {err}.") from None
    if check and out.returncode != 0:
        raise ClusterError(
            f"`{' '.join(argv)}` failed with exit code {out.returncode}: {out.stderr.strip()}"
        )
    return out.stdout


# --------------------------------------------------------------------------- building


def setup_commands(spec: ClusterSpec, tools: Tools) -> list[list[str]]:
    """Namespaces, bridge, veth pairs and addresses (no shaping), in order.

    Each veth pair is created inside the switch namespace with its peer put
    straight into the node's namespace, so no interface ever exists in the
    root namespace.

    Args:
        spec: The cluster to build (namespaces, addresses, MTU).
        tools: Paths of ``ip``/``tc``/``unshare``.
    """
    ip, sw = tools.ip, spec.switch_namespace
    mtu = str(spec.mtu)
    cmds = [[ip, "netns", "add", ns] for ns in spec.namespaces]
    cmds += [
        [ip, "-n", sw, "link", "set", "lo", "up"],
        [ip, "-n", sw, "link", "add", "br0", "mtu", mtu, "type", "bridge"],
        [ip, "-n", sw, "link", "set", "br0", "up"],
    ]
    for k, (ns, addr) in enumerate(zip(spec.node_namespaces, spec.addresses, strict=True)):
        port = f"p{k}"
        cmds += [
            [ip, "-n", sw, "link", "add", port, "mtu", mtu, "type", "veth"]
            + ["peer", "name", "eth0", "mtu", mtu, "netns", ns],
            [ip, "-n", sw, "link", "set", port, "master", "br0"],
            [ip, "-n", sw, "link", "set", port, "up"],
            [ip, "-n", ns, "link", "set", "lo", "up"],
            [ip, "-n", ns, "addr", "add", f"{addr}/{spec.prefixlen}", "dev", "eth0"],
            [ip, "-n", ns, "link", "set", "eth0", "up"],
        ]
    return cmds


def hosts_file(spec: ClusterSpec) -> str:
    """The ``/etc/hosts`` every node sees (``ip netns exec`` bind-mounts it).

    Args:
        spec: The cluster (one ``address hostname`` line per node, plus localhost).
    """
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{a} {h}" for a, h in zip(spec.addresses, spec.hostnames, strict=True)]
    return "\n".join(lines) + "\n"


def netem_available(tools: Tools, namespace: str) -> bool:
    """Whether the kernel has ``netem``: add and remove one on ``lo`` of ``namespace``.

    Args:
        tools: Paths of ``ip``/``tc``.
        namespace: An existing namespace to probe in (its ``lo`` is used).
    """
    tc = [tools.ip, "netns", "exec", namespace, tools.tc]
    try:
        run(tc + ["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
    except ClusterError as err:
        logger.debug("netem probe failed: %s", err)
        return False
    run(tc + ["qdisc", "del", "dev", "lo", "root"], check=False)
    return True


def require_netem(spec: ClusterSpec, tools: Tools) -> None:
    """Raise :class:`NetemUnavailableError` if ``spec`` asks for a latency netem cannot add.

    Args:
        spec: The cluster being built (only ``latency`` matters).
        tools: Paths of ``ip``/``tc``.
    """
    if spec.latency_seconds and not netem_available(tools, spec.switch_namespace):
        raise NetemUnavailableError(
            f"latency={spec.latency!r} needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), "
            "and this kernel has none (`tc qdisc add ... netem` fails: unknown qdisc kind). "
            "Nothing else can add a delay, so the cluster was not built (its namespaces are "
            "removed again). Create it "
            "without latency (latency=None / no --latency): links are then shaped in rate only "
            "and keep the veth's own round trip of a few tens of microseconds."
        )


# --------------------------------------------------------------------------- removing


def list_namespaces(tools: Tools, prefix: str | None = None) -> list[str]:
    """Names of cluster namespaces (all, or those of ``prefix``), from ``ip netns list``.

    Args:
        tools: Paths of ``ip``.
        prefix: Only this cluster's namespaces; None lists every cluster's.
    """
    names = []
    for line in run([tools.ip, "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        match = NAMESPACE_PATTERN.match(name)
        if match and (prefix is None or match.group("prefix") == prefix):
            names.append(name)
    return names


def namespace_pids(tools: Tools, namespace: str) -> list[int]:
    """Processes whose network namespace is ``namespace``."""
    out = run([tools.ip, "netns", "pids", namespace], check=False)
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def kill_processes(tools: Tools, namespaces: list[str], grace: float = 3.0) -> list[int]:
    """SIGTERM every process in ``namespaces``, SIGKILL what is left after ``grace`` s.

    Args:
        tools: Paths of ``ip``.
        namespaces: Namespace names whose processes to stop.
        grace: Seconds of SIGTERM before SIGKILL.

    Returns:
        The pids that were signalled. Bounded: at most ``grace + 5`` seconds.
    """
    signalled: set[int] = set()
    deadline = time.monotonic() + grace + 5.0
    sig = signal.SIGTERM
    term_until = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = [p for ns in namespaces for p in namespace_pids(tools, ns)]
        if not pids:
            break
        if time.monotonic() >= term_until:
            sig = signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
                signalled.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1 if sig == signal.SIGTERM else 0.2)
    return sorted(signalled)


def remove_prefix(tools: Tools, prefix: str, namespaces: list[str] | None = None) -> list[str]:
    """Kill the processes in, and delete, every namespace of cluster ``prefix``.

    Also removes its ``/etc/netns`` folders and state files. Veth pairs and the
    bridge disappear with their namespaces. Idempotent.

    Args:
        tools: Paths of ``ip`` etc.
        prefix: The cluster's prefix.
        namespaces: Names expected to exist (added to what ``ip netns list``
            shows, e.g. for a half-built cluster).

    Returns:
        The namespaces that were deleted.

    Raises:
        ClusterError: Something could not be removed (the message lists it).
    """
    found = set(list_namespaces(tools, prefix)) | {
        n for n in namespaces or () if NAMESPACE_PATTERN.match(n)
    }
    existing = [n for n in sorted(found) if Path("/run/netns", n).exists()]
    if existing:
        kill_processes(tools, existing)
    problems = []
    for name in existing:
        try:
            run([tools.ip, "netns", "delete", name])
        except ClusterError as err:
            problems.append(str(err))
    for path in Path("/etc/netns").glob(f"{prefix}-*"):
        if NAMESPACE_PATTERN.match(path.name):
            shutil.rmtree(path, ignore_errors=True)
    try:
        if Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()  # created by us; leave it only if others use it
    except OSError:
        pass
    shutil.rmtree(STATE_DIR / prefix, ignore_errors=True)
    (STATE_DIR / f"{prefix}.json").unlink(missing_ok=True)
    try:
        STATE_DIR.rmdir()  # only when no other cluster is running
    except OSError:
        pass
    left = list_namespaces(tools, prefix)
    if left or problems:
        raise ClusterError(
            f"cluster {prefix}: could not remove {', '.join(left) or 'everything'}"
            + (f" ({'; '.join(problems)})" if problems else "")
            + f". Retry with `python -m ddl_tf.cluster cleanup --prefix {prefix}`."
        )
    return existing
