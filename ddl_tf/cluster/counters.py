"""Bytes that crossed each node's link, from the kernel's interface counters.

Every virtual node has one interface, ``eth0``, its link to the switch, so
the kernel's counters of that interface (``/sys/class/net/eth0/statistics``
inside the node's namespace) count exactly what the node sent over its link
and what it received. The counters count whole frames: Ethernet, IPv4 and
TCP headers included. :attr:`LinkCounters.tx_payload` estimates the TCP
payload by taking one header of :data:`HEADER_BYTES` off every counted
packet; with segmentation offload a packet is one kernel buffer holding many
segments behind one header, so the estimate holds either way, up to TCP
options beyond timestamps (SACK blocks) and the rare non-TCP frame (ARP).

Three ways to read them:

* :func:`read_local` from a process inside a node (an MPI rank of a
  rehearsal job reads its own node's link);
* :func:`read_node` from outside, through ``ip -n <namespace> -s -j link``
  (no process is started inside the node);
* :func:`snapshot` for every node of a running cluster.

Example:
    >>> from ddl_tf.cluster.counters import LinkCounters
    >>> before = LinkCounters(tx_bytes=1000, rx_bytes=500, tx_packets=2, rx_packets=3)
    >>> after = LinkCounters(tx_bytes=1000 + 66 * 10 + 14480, rx_bytes=500 + 66 * 6,
    ...                      tx_packets=12, rx_packets=9)
    >>> delta = after - before
    >>> delta.tx_bytes, delta.tx_payload, delta.rx_payload
    (15140, 14480, 0)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ddl_tf.cluster import netns
from ddl_tf.cluster.errors import ClusterError

__all__ = [
    "HEADER_BYTES",
    "INTERFACE",
    "LinkCounters",
    "read_local",
    "parse_ip_link",
    "read_node",
    "snapshot",
    "describe_traffic",
]

INTERFACE = "eth0"
"""The node side of every node's link (see :mod:`ddl_tf.cluster.spec`)."""

HEADER_BYTES = 14 + 20 + 32
"""Bytes of one frame that are not TCP payload: Ethernet, IPv4, TCP with the timestamp option."""

_SYSFS = Path("/sys/class/net")


@dataclass(frozen=True)
class LinkCounters:
    """Counters of one interface (a reading, or the difference of two).

    Attributes:
        tx_bytes: Bytes of the frames sent (headers included).
        rx_bytes: Bytes of the frames received.
        tx_packets: Packets sent (kernel buffers; one may carry many TCP segments).
        rx_packets: Packets received.
    """

    tx_bytes: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    rx_packets: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ClusterError(
                    f"LinkCounters.{f.name} must be an integer. Received {f.name}={value!r}."
                )

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def __add__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    @property
    def tx_payload(self) -> int:
        """Estimated TCP payload sent: bytes less one header per packet (never below 0)."""
        return max(0, self.tx_bytes - HEADER_BYTES * self.tx_packets)

    @property
    def rx_payload(self) -> int:
        """Estimated TCP payload received."""
        return max(0, self.rx_bytes - HEADER_BYTES * self.rx_packets)

    def to_json(self) -> dict[str, int]:
        """The four counters and the two payload estimates, for reports."""
        return {**asdict(self), "tx_payload": self.tx_payload, "rx_payload": self.rx_payload}


def read_local(interface: str = INTERFACE, *, sysfs: Path = _SYSFS) -> LinkCounters:
    """The counters of ``interface`` as this process's network namespace sees it.

    Inside ``ip netns exec`` (every process of a rehearsal node) ``/sys`` shows
    the node's own interfaces.

    Args:
        interface: Interface name; the node's link is ``eth0``.
        sysfs: Where the ``/sys/class/net`` tree is (tests point it at a copy).

    Returns:
        Its byte and packet counters since the interface came up.

    Raises:
        ClusterError: The interface does not exist here (not inside a node?).
    """
    stats = Path(sysfs) / interface / "statistics"
    try:
        values = {f.name: int((stats / f.name).read_text()) for f in fields(LinkCounters)}
    except (OSError, ValueError) as err:
        raise ClusterError(
            f"cannot read the counters of interface {interface!r} ({stats}: {err}). Read them "
            "from a process inside a rehearsal node (an MPI rank of a cluster job), or from "
            "outside with ddl_tf.cluster.counters.read_node(tools, namespace)."
        ) from None
    return LinkCounters(**values)


def parse_ip_link(text: str, interface: str = INTERFACE) -> LinkCounters:
    """The counters of ``interface`` in the output of ``ip -s -j link show``.

    Args:
        text: The JSON text ``ip -s -j link show`` printed.
        interface: Interface whose counters to take.

    Returns:
        Its counters (from ``stats64`` when present, else ``stats``).

    Raises:
        ClusterError: Not JSON of that shape, or no such interface in it.
    """
    try:
        links = json.loads(text)
        link = next(item for item in links if item.get("ifname") == interface)
        stats = link.get("stats64") or link["stats"]
        return LinkCounters(
            tx_bytes=int(stats["tx"]["bytes"]),
            rx_bytes=int(stats["rx"]["bytes"]),
            tx_packets=int(stats["tx"]["packets"]),
            rx_packets=int(stats["rx"]["packets"]),
        )
    except StopIteration:
        raise ClusterError(
            f"interface {interface!r} is not in the `ip -s -j link` output "
            f"({text.strip()[:200]!r}); name one of the interfaces it lists."
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ClusterError(
            f"cannot read `ip -s -j link` output ({type(err).__name__}: {err}): "
            f"{text.strip()[:200]!r}. It needs iproute2 with JSON output (ip -j)."
        ) from None


def read_node(tools, namespace: str, interface: str = INTERFACE) -> LinkCounters:
    """The counters of ``interface`` in network namespace ``namespace``, read from outside.

    Args:
        tools: :class:`~ddl_tf.cluster.netns.Tools` (the ``ip`` to run).
        namespace: A node namespace, e.g. ``cluster.spec.node_namespaces[0]``.
        interface: The interface (default: the node's link).

    Raises:
        ClusterError: ``ip`` failed or printed something unreadable.
    """
    out = netns.run([tools.ip, "-n", namespace, "-s", "-j", "link", "show", "dev", interface])
    return parse_ip_link(out, interface)


def snapshot(cluster) -> dict[str, LinkCounters]:
    """The link counters of every node of a running :class:`~ddl_tf.cluster.Cluster`, by hostname.

    Args:
        cluster: A started :class:`~ddl_tf.cluster.Cluster`.

    Returns:
        ``{hostname: counters}``, for :func:`describe_traffic`.
    """
    return {host: cluster.link_counters(k) for k, host in enumerate(cluster.spec.hostnames)}


def describe_traffic(
    before: Mapping[str, LinkCounters], after: Mapping[str, LinkCounters]
) -> list[str]:
    """One line per node: what crossed its link between two snapshots (MiB, payload estimate).

    Args:
        before: A :func:`snapshot` taken first.
        after: A :func:`snapshot` taken later, with every host of ``before``.

    Returns:
        One human-readable line per host of ``before``.

    Example:
        >>> from ddl_tf.cluster.counters import LinkCounters, describe_traffic
        >>> a = {"node0": LinkCounters()}
        >>> b = {"node0": LinkCounters(tx_bytes=(1 << 20) + 66, tx_packets=1)}
        >>> describe_traffic(a, b)
        ['node0: sent 1.0 MiB, received 0.0 MiB of TCP payload over its link (1 + 0 packets)']
    """
    lines = []
    for host in before:
        delta = after[host] - before[host]
        lines.append(
            f"{host}: sent {delta.tx_payload / 2**20:.1f} MiB, received "
            f"{delta.rx_payload / 2**20:.1f} MiB of TCP payload over its link "
            f"({delta.tx_packets} + {delta.rx_packets} packets)"
        )
    return lines
