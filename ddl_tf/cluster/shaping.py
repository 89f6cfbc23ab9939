"""Shaping a cluster's links with ``tc``: htb at the link rate, capped GSO, rate changes.

Each node's link is shaped at both ends (egress of the node's ``eth0`` and of
its switch port) by an ``htb`` class at the link rate, with a ``netem`` leaf
for an added latency, and its GSO super-packets are capped so that the htb
queue drops frames, not tens of frames at once (:func:`gso_max_segs`). The
command lists come from pure functions, as in :mod:`ddl_tf.cluster.netns`.

Example:
    >>> from ddl_tf.cluster.netns import Tools
    >>> from ddl_tf.cluster.shaping import shaping_commands
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

from ddl_tf.cluster.errors import ClusterError
from ddl_tf.cluster.netns import Tools
from ddl_tf.cluster.spec import ClusterSpec

__all__ = [
    "shaping_commands",
    "rate_commands",
    "require_shaped",
    "gso_max_segs",
    "GSO_BURST_SECONDS",
]

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
    this machine's CPUs more than the link (8 frames: 70-81 % vs 88-97 %).

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

    Example (imports as in the module's example; the switch port's two commands):
        >>> spec = ClusterSpec(nodes=2, link="100mbit", prefix="ddlcdemo")
        >>> for cmd in rate_commands(spec, Tools("ip", "tc", "unshare"), node=1)[1::2]:
        ...     print(" ".join(cmd))
        ip -n ddlcdemo-sw link set dev p1 gso_max_segs 4
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


def _link_ends(spec: ClusterSpec, node: int) -> tuple[tuple[str, str], tuple[str, str]]:
    """(namespace, device) of both ends of node ``node``'s link: its ``eth0``, its switch port."""
    return (spec.node_namespaces[node], "eth0"), (spec.switch_namespace, f"p{node}")


def _shaped_devices(spec: ClusterSpec, tools: Tools, node: int) -> list[tuple[list[str], str]]:
    """(``tc`` prefix in the right namespace, device) for both ends of node ``node``'s link."""
    return [([tools.ip, "netns", "exec", ns, tools.tc], dev) for ns, dev in _link_ends(spec, node)]


def _gso_commands(spec: ClusterSpec, tools: Tools, node: int) -> list[list[str]]:
    """``ip link`` commands capping the GSO super-packets of both ends of node ``node``'s link."""
    segs = str(gso_max_segs(spec.link_bps, spec.mtu))
    return [
        [tools.ip, "-n", ns, "link", "set", "dev", dev, "gso_max_segs", segs]
        for ns, dev in _link_ends(spec, node)
    ]


def _htb_class(spec: ClusterSpec) -> list[str]:
    rate = f"{spec.link_bps}bit" if spec.link_bps else "100gbit"
    return ["parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate] + [
        "quantum",
        str(_QUANTUM),
    ]
