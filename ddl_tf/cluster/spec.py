"""What a rehearsal cluster looks like: the frozen :class:`ClusterSpec` and its derived names.

A cluster of ``N`` nodes is ``N + 1`` network namespaces: ``<prefix>-n<k>``
per node (one interface ``eth0`` with an address from a private subnet and
its own UTS hostname ``node<k>``) and ``<prefix>-sw``, the "switch", which
holds a Linux bridge ``br0`` and the switch side ``p<k>`` of every node's
veth pair. Nothing is created in the root namespace. Each node's link is
shaped in both directions (egress of ``eth0`` and of ``p<k>``), so a node
sends and receives at most ``link`` bits per second, full duplex, like a
port of a switched Ethernet.

Example:
    >>> from ddl_tf.cluster.spec import ClusterSpec, parse_rate, parse_duration
    >>> spec = ClusterSpec(nodes=2, link="1gbit", prefix="ddlcdemo")
    >>> spec.link_bps, spec.namespaces
    (1000000000, ('ddlcdemo-sw', 'ddlcdemo-n0', 'ddlcdemo-n1'))
    >>> spec.hostnames, spec.addresses
    (('node0', 'node1'), ('10.213.0.1', '10.213.0.2'))
    >>> parse_rate("100mbit"), parse_duration("250us")
    (100000000, 0.00025)
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from ddl_tf.errors import ConfigError

__all__ = [
    "ClusterSpec",
    "parse_rate",
    "parse_duration",
    "default_prefix",
    "STATE_DIR",
    "PREFIX_PATTERN",
    "NAMESPACE_PATTERN",
]

STATE_DIR = Path("/run/ddl_tf_cluster")
"""Per-cluster state (owner pid, agent script); tmpfs, so it goes with a reboot like namespaces."""

PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{1,11}$")
NAMESPACE_PATTERN = re.compile(r"^(?P<prefix>[a-z][a-z0-9]{1,11})-(?P<role>sw|n(?P<index>\d+))$")
"""Names of every namespace a cluster creates; ``cleanup`` only ever touches these."""

_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_MAX_NODES = 64


def parse_rate(text: str | int) -> int:
    """Bits per second from ``tc``-style text (``1gbit``, ``100mbit``, ``125mbps`` = bytes/s).

    Args:
        text: A number with a unit (``bit``, ``kbit``, ``mbit``, ``gbit``, ... or the
            byte units ``bps``, ``kbps``, ...), or an int already in bit/s.

    Returns:
        The rate in bits per second, > 0.

    Raises:
        ConfigError: Not a positive rate with a known unit.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _RATE_UNITS:
            raise ConfigError(
                f"Cannot read the link rate {text!r}. Use a number and one of "
                f"{', '.join(_RATE_UNITS)} (tc's units: mbps/gbps are bytes per second), "
                "e.g. link='1gbit'."
            )
        value = int(round(float(match.group(1)) * _RATE_UNITS[unit]))
    if value <= 0:
        raise ConfigError(f"The link rate must be positive. Received link={text!r}.")
    return value


def parse_duration(text: str | float) -> float:
    """Seconds from ``tc``-style text (``100us``, ``1ms``, ``0.5s``); a number is seconds.

    Args:
        text: A number with a unit (``s``, ``ms``, ``us``, ``ns``), or a number of seconds.

    Returns:
        The duration in seconds, >= 0.

    Raises:
        ConfigError: Not a non-negative duration with a known unit.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _TIME_UNITS:
            raise ConfigError(
                f"Cannot read the latency {text!r}. Use a number and one of "
                f"{', '.join(_TIME_UNITS)}, e.g. latency='100us'."
            )
        value = float(match.group(1)) * _TIME_UNITS[unit]
    if value < 0:
        raise ConfigError(f"The latency must be >= 0. Received latency={text!r}.")
    return value


def default_prefix() -> str:
    """A fresh prefix, ``ddlc`` and 6 random hex digits (namespace names stay short)."""
    return "ddlc" + secrets.token_hex(3)


@dataclass(frozen=True)
class ClusterSpec:
    """A rehearsal cluster: how many nodes, how they are linked, what the names are.

    Attributes:
        nodes: Number of virtual nodes (1 to 64).
        link: Rate of every node's link, each direction (``tc`` units, e.g.
            ``"1gbit"``), or ``None`` for unshaped veth links (several Gbit/s).
        latency: Added one-way node-to-node delay (e.g. ``"100us"``), split
            evenly over the two hops (node to switch, switch to node). Needs the
            kernel's ``netem`` qdisc; ``None`` (the default) adds no delay.
        prefix: Name prefix of every namespace (``<prefix>-sw``,
            ``<prefix>-n<k>``); lowercase letters and digits, 2 to 12 long.
        subnet: Private IPv4 subnet for the node addresses (only ever
            configured inside the cluster's namespaces).
        mtu: MTU of the node links (1500 as on common Ethernet; 9000 for jumbo frames).
    """

    nodes: int = 2
    link: str | None = "1gbit"
    latency: str | None = None
    prefix: str = field(default_factory=default_prefix)
    subnet: str = "10.213.0.0/24"
    mtu: int = 1500

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= _MAX_NODES:
            raise ConfigError(
                f"A rehearsal cluster has 1 to {_MAX_NODES} nodes. Received nodes={self.nodes!r}."
            )
        if not PREFIX_PATTERN.match(self.prefix):
            raise ConfigError(
                f"Cluster prefix {self.prefix!r} must be 2-12 lowercase letters/digits starting "
                "with a letter (namespace names are '<prefix>-n0', ...), e.g. prefix='ddlc1'."
            )
        if self.link is not None:
            parse_rate(self.link)
        if self.latency is not None:
            parse_duration(self.latency)
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as err:
            raise ConfigError(
                f"Cluster subnet {self.subnet!r} is not an IPv4 network ({err}); "
                "e.g. subnet='10.213.0.0/24'."
            ) from None
        if not net.is_private:
            raise ConfigError(
                f"Cluster subnet {self.subnet!r} is not a private range; use one inside "
                "10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, e.g. subnet='10.213.0.0/24'."
            )
        if net.num_addresses - 2 < self.nodes:
            raise ConfigError(
                f"Cluster subnet {self.subnet!r} has room for {max(net.num_addresses - 2, 0)} "
                f"nodes; received nodes={self.nodes}. Use a larger subnet."
            )
        if not 576 <= self.mtu <= 65535:
            raise ConfigError(f"The MTU must be 576 to 65535. Received mtu={self.mtu!r}.")

    # ------------------------------------------------------------------ derived names

    @property
    def link_bps(self) -> int | None:
        """Link rate in bits per second, or None when unshaped."""
        return None if self.link is None else parse_rate(self.link)

    @property
    def latency_seconds(self) -> float:
        """Added one-way node-to-node delay in seconds (0 when none)."""
        return 0.0 if self.latency is None else parse_duration(self.latency)

    @property
    def switch_namespace(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def node_namespaces(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}-n{k}" for k in range(self.nodes))

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the cluster, switch first."""
        return (self.switch_namespace, *self.node_namespaces)

    @property
    def hostnames(self) -> tuple[str, ...]:
        return tuple(f"node{k}" for k in range(self.nodes))

    @property
    def addresses(self) -> tuple[str, ...]:
        hosts = ipaddress.IPv4Network(self.subnet).hosts()
        return tuple(str(next(hosts)) for _ in range(self.nodes))

    @property
    def prefixlen(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen

    @property
    def state_dir(self) -> Path:
        """Folder with the agent script; removed at teardown."""
        return STATE_DIR / self.prefix

    @property
    def state_file(self) -> Path:
        """JSON record of the owner process (``cleanup --stale`` reads it)."""
        return STATE_DIR / f"{self.prefix}.json"

    @property
    def agent_path(self) -> Path:
        """Open MPI's remote-launch agent for this cluster."""
        return self.state_dir / "agent.sh"

    def etc_dir(self, node: int) -> Path:
        """``/etc/netns/<namespace>``: ``ip netns exec`` bind-mounts its ``hosts`` over /etc/hosts.

        Args:
            node: Node index, 0-based.

        Returns:
            The folder's path (``Cluster.start`` creates it).
        """
        return Path("/etc/netns") / self.node_namespaces[node]

    def describe(self) -> str:
        """One line per node plus the link, for logs and ``ddlrun --rehearse``."""
        link = f"{self.link} each direction" if self.link else "unshaped veth"
        delay = f", +{self.latency} node-to-node latency" if self.latency else ""
        lines = [
            f"cluster {self.prefix}: {self.nodes} node(s), links {link}{delay}, mtu {self.mtu}"
        ]
        for host, addr, ns in zip(
            self.hostnames, self.addresses, self.node_namespaces, strict=True
        ):
            lines.append(f"  {host} {addr} (namespace {ns})")
        return "\n".join(lines)
