"""The ``ip``/``tc`` commands that build, shape and remove a cluster, and the process sweep.

Command lists are built by pure functions (:func:`setup_commands`,
:func:`shaping_commands`) so they can be read and tested without root; the
functions that run them only ever touch namespaces whose names match
:data:`~ddl_tf.cluster.spec.NAMESPACE_PATTERN` for the given prefix.
Every command runs with a time limit.

Example:
    >>> from ddl_tf.cluster.netns import Tools, shaping_commands
    >>> from ddl_tf.cluster.spec import ClusterSpec
    >>> spec = ClusterSpec(nodes=2, link="1gbit", prefix="ddlcdemo")
    >>> tools = Tools(ip="ip", tc="tc", unshare="unshare")
    >>> for cmd in shaping_commands(spec, tools, node=0)[:4]:
    ...     print(" ".join(cmd))
    ip -n ddlcdemo-n0 link set dev eth0 gso_max_segs 41
    ip -n ddlcdemo-sw link set dev p0 gso_max_segs 41
    ip netns exec ddlcdemo-n0 tc qdisc add dev eth0 root handle 1: htb default 1
    ip netns exec ddlcdemo-n0 tc class add dev eth0 parent 1: classid 1:1 htb rate 1000000000bit ceil 1000000000bit quantum 65536
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
    "shaping_commands",
    "rate_commands",
    "require_shaped",
    "gso_max_segs",
    "GSO_BURST_SECONDS",
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
_QUANTUM = 65536  # one htb class per device, so any quantum >= a GSO packet will do
_VETH_GSO_MAX_SEGS = 65535  # the kernel's default for a veth device

GSO_BURST_SECONDS = 0.0005
"""Longest time one GSO super-packet may occupy a shaped link (see :func:`gso_max_segs`)."""


def gso_max_segs(link_bps: int | None, mtu: int) -> int:
    """Frames per GSO super-packet on a link of ``link_bps``, so that one lasts <= 0.5 ms.

    TCP hands a veth device super-packets of up to 64 KiB (44 frames at MTU
    1500) and the htb queue holds and drops them whole; a real switch drops
    frames. At low rates one dropped super-packet loses tens of frames at
    once, which TCP often recovers from only after a retransmission timeout:
    at 62.5 Mbit/s a probe in one direction reached 76-99 % of the rate,
    varying run to run. Frames of at most :data:`GSO_BURST_SECONDS` on the
    wire brought every probe to 96-99 % at 62.5-200 Mbit/s; at 1 Gbit/s the
    cap is 41 frames, about the default, because smaller super-packets cost
    this machine's CPUs more than the link (8 frames: 78-81 % vs 89-97 %).

    Args:
        link_bps: The link rate in bit/s; None (unshaped) keeps the kernel's default.
        mtu: The link MTU in bytes.

    Example:
        >>> [gso_max_segs(bps, 1500) for bps in (62_500_000, 200_000_000, 10**9, None)]
        [2, 8, 41, 65535]
    """
    if not link_bps:
        return _VETH_GSO_MAX_SEGS
    frame_bits = 8 * (mtu + 14)
    return max(1, min(_VETH_GSO_MAX_SEGS, int(link_bps * GSO_BURST_SECONDS / frame_bits)))


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


def shaping_commands(spec: ClusterSpec, tools: Tools, node: int) -> list[list[str]]:
    """``tc`` commands shaping node ``node``'s link in both directions.

    Egress of the node's ``eth0`` limits what it sends, egress of the switch
    port ``p<node>`` what it receives. Each gets an ``htb`` class at the link
    rate (``tbf`` lost about 40 % of the rate with traffic in both directions
    on this kernel; ``htb`` kept 93 %); with a latency, a ``netem`` leaf under
    the class delays each hop by half of it.

    Args:
        spec: The cluster (its ``link`` rate and ``latency``); neither set gives ``[]``.
        tools: Paths of ``ip``/``tc``/``unshare``.
        node: Node index, 0-based.
    """
    if spec.link_bps is None and not spec.latency_seconds:
        return []
    cmds = _gso_commands(spec, tools, node)
    hop_delay_us = spec.latency_seconds / 2 * 1e6
    for tc, dev in _shaped_devices(spec, tools, node):
        cmds += [
            tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
            tc + ["class", "add", "dev", dev] + _htb_class(spec),
        ]
        if hop_delay_us:
            cmds.append(
                tc
                + ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem"]
                + ["delay", f"{hop_delay_us:.1f}us", "limit", "100000"]
            )
    return cmds


def rate_commands(spec: ClusterSpec, tools: Tools, node: int) -> list[list[str]]:
    """``tc`` commands that set node ``node``'s shaped link to ``spec.link`` in place.

    For a cluster whose classes :func:`shaping_commands` created; ``tc class
    change`` keeps the qdiscs, their queues and any netem leaf.

    Args:
        spec: The cluster with the new ``link`` rate.
        tools: Paths of ``ip``/``tc``/``unshare``.
        node: Node index, 0-based.

    Example:
        >>> from ddl_tf.cluster.netns import Tools, rate_commands
        >>> from ddl_tf.cluster.spec import ClusterSpec
        >>> spec = ClusterSpec(nodes=2, link="100mbit", prefix="ddlcdemo")
        >>> tools = Tools(ip="ip", tc="tc", unshare="unshare")
        >>> print(" ".join(rate_commands(spec, tools, node=1)[3]))
        ip netns exec ddlcdemo-sw tc class change dev p1 parent 1: classid 1:1 htb rate 100000000bit ceil 100000000bit quantum 65536
    """
    return _gso_commands(spec, tools, node) + [
        tc + ["class", "change", "dev", dev] + _htb_class(spec)
        for tc, dev in _shaped_devices(spec, tools, node)
    ]


def require_shaped(spec: ClusterSpec, link: str | None) -> str:
    """``link`` if the rate of ``spec``'s links can be changed to it, else :class:`ClusterError`.

    Args:
        spec: The running cluster's spec (built with a rate or a latency).
        link: The new rate in ``tc`` units; ``None`` is refused.
    """
    if link is None or (spec.link is None and not spec.latency_seconds):
        raise ClusterError(
            f"cannot change the link rate of cluster {spec.prefix} to {link!r}: a rate can only "
            "replace a rate (build the cluster with one, e.g. ClusterSpec(link='1gbit'), then "
            "cluster.set_link('200mbit'))."
        )
    return link


def _shaped_devices(spec: ClusterSpec, tools: Tools, node: int) -> list[tuple[list[str], str]]:
    """(``tc`` prefix in the right namespace, device) for both ends of node ``node``'s link."""
    return [
        ([tools.ip, "netns", "exec", ns, tools.tc], dev)
        for ns, dev in ((spec.node_namespaces[node], "eth0"), (spec.switch_namespace, f"p{node}"))
    ]


def _gso_commands(spec: ClusterSpec, tools: Tools, node: int) -> list[list[str]]:
    """``ip link`` commands capping the GSO super-packets of both ends of node ``node``'s link."""
    segs = str(gso_max_segs(spec.link_bps, spec.mtu))
    return [
        [tools.ip, "-n", ns, "link", "set", "dev", dev, "gso_max_segs", segs]
        for ns, dev in ((spec.node_namespaces[node], "eth0"), (spec.switch_namespace, f"p{node}"))
    ]


def _htb_class(spec: ClusterSpec) -> list[str]:
    rate = f"{spec.link_bps}bit" if spec.link_bps else "100gbit"
    return ["parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate] + [
        "quantum",
        str(_QUANTUM),
    ]


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
