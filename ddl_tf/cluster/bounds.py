"""The bandwidth lower bound of an allreduce across nodes joined by one shaped link each.

Each of ``N`` nodes owns one link of ``B`` bits per second in each
direction, and communication inside a node is free. After an allreduce of
``W`` bytes every node holds every element's sum over all nodes; the
classical argument (Patarasuk and Yuan 2009) shows each node must send, and
receive, at least ``2 (N - 1) / N * W`` bytes over its link: its share of
the reduce-scatter plus its share of the allgather, however the algorithm is
organised. Hence::

    T >= 2 (N - 1) / N * W * 8 / B

``W`` is the bytes on the wire (half the float32 size with fp16 compression).
With TCP over Ethernet at MTU 1500, at most 1448 of every 1514 bytes the
shaper counts are payload, so even a perfect algorithm measures at least
1514 / 1448 = 1.046 times this bound.

Example:
    >>> from ddl_tf.cluster.bounds import allreduce_lower_bound, framing_overhead
    >>> allreduce_lower_bound(1 << 20, nodes=4, link_bps=10**9)  # 1.5 * 8 Mibit / 1 Gbit/s
    0.012582912
    >>> round(framing_overhead(1500), 4)
    1.0456
"""

from __future__ import annotations

__all__ = ["allreduce_lower_bound", "framing_overhead"]


def allreduce_lower_bound(nbytes: int, *, nodes: int, link_bps: float) -> float:
    """Seconds an allreduce of ``nbytes`` wire bytes needs at least (see the module docstring).

    Args:
        nbytes: Bytes on the wire per rank's buffer (include framing, see
            :func:`framing_overhead`).
        nodes: Number of nodes; 1 or fewer gives 0.
        link_bps: Each node's link rate in bits per second, each direction.

    Returns:
        The bound in seconds.
    """
    if nodes <= 1:
        return 0.0
    return 2 * (nodes - 1) / nodes * nbytes * 8 / link_bps


def framing_overhead(mtu: int = 1500) -> float:
    """Shaped bytes per TCP payload byte at ``mtu`` (Ethernet 14 B, IPv4 20 B, TCP 32 B with timestamps).

    Args:
        mtu: The link MTU in bytes.

    Returns:
        A factor > 1 to multiply payload bytes by.
    """
    return (mtu + 14) / (mtu - 20 - 32)
