"""TCP throughput between two nodes of a running cluster (python sockets, bounded).

:func:`link_throughput` streams a fixed number of bytes from node ``a`` to
node ``b`` (and, with ``both_directions``, from ``b`` to ``a`` at the same
time, as an allreduce does) and reports the payload rate each receiver saw.
Every loop is bounded in bytes and in time: sockets time out, the client
retries its connection a limited number of times, and the processes are
killed after ``timeout`` seconds.

Whether a measurement is limited by the links or by the CPUs shows when the
rate changes: :func:`halving_ratios` compares the time of the same transfer
at each rate and at half of it (about 2 when the link is the bottleneck),
and :func:`link_bound_rate` picks the fastest rate that still behaves so.

Example (needs root)::

    with Cluster(ClusterSpec(nodes=2, link="1gbit")) as cluster:
        link_throughput(cluster, 0, 1)   # {'0->1': 0.93, '1->0': 0.93} (Gbit/s)

Example (pure):
    >>> from ddl_tf.cluster.probe import halving_ratios, link_bound_rate
    >>> times = {10**9: 0.30, 5 * 10**8: 0.40, 25 * 10**7: 0.78, 125 * 10**6: 1.55}
    >>> [(r["rate_bps"], round(r["ratio"], 2)) for r in halving_ratios(times)]
    [(1000000000, 1.33), (500000000, 1.95), (250000000, 1.99)]
    >>> link_bound_rate(times)
    500000000
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping

from ddl_tf.cluster.errors import ClusterError

__all__ = ["link_throughput", "halving_ratios", "link_bound_rate", "LINK_BOUND_RATIO", "PORT"]

PORT = 47613

LINK_BOUND_RATIO = 1.85
"""Halving the rate must multiply the time by at least this to call the rate link-bound."""

_SERVER = """
import json, socket, sys, time
addr, port, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(1); s.settimeout(limit)
c, _ = s.accept(); c.settimeout(limit)
got, start = 0, None
while got < n:
    b = c.recv(1 << 20)
    if not b:
        break
    start = start or time.perf_counter()
    got += len(b)
print(json.dumps({"bytes": got, "seconds": time.perf_counter() - (start or time.perf_counter())}))
"""

_CLIENT = """
import socket, sys, time
addr, port, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for attempt in range(100):
    try:
        c = socket.create_connection((addr, port), timeout=limit); break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("could not connect to %s:%d" % (addr, port))
buf, sent = b"\\0" * (1 << 20), 0
while sent < n:
    c.sendall(buf[: min(len(buf), n - sent)]); sent += min(len(buf), n - sent)
c.close()
"""


def link_throughput(
    cluster,
    a: int = 0,
    b: int = 1,
    *,
    nbytes: int = 64 << 20,
    both_directions: bool = True,
    timeout: float = 60.0,
) -> dict[str, float]:
    """Payload Gbit/s from node ``a`` to ``b`` (and ``b`` to ``a``), measured by the receivers.

    Args:
        cluster: A started :class:`~ddl_tf.cluster.Cluster` with at least ``max(a, b) + 1`` nodes.
        a: Sending node.
        b: Receiving node.
        nbytes: Bytes each transfer sends (default 64 MiB).
        both_directions: Also send ``b`` to ``a`` at the same time.
        timeout: Seconds for the whole probe.

    Returns:
        ``{"a->b": Gbit/s, ...}``: TCP payload rate per direction, as the receiver timed it.

    Raises:
        ClusterError: A transfer failed or outlived ``timeout``.
    """
    spec = cluster.spec
    pairs = [(a, b)] + ([(b, a)] if both_directions else [])
    servers, clients = [], []
    limit = str(timeout)

    def start(node: int, program: str, k: int, dst: int) -> subprocess.Popen:
        args = [spec.addresses[dst], str(PORT + k), str(nbytes), limit]
        command = [sys.executable, "-c", program, *args]
        return cluster.popen(node, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    try:
        for k, (_src, dst) in enumerate(pairs):
            servers.append(start(dst, _SERVER, k, dst))
        time.sleep(0.2)
        for k, (src, dst) in enumerate(pairs):
            clients.append(start(src, _CLIENT, k, dst))
        deadline = time.monotonic() + timeout
        results = {}
        for (src, dst), server, client in zip(pairs, servers, clients, strict=True):
            out, err = server.communicate(timeout=max(1.0, deadline - time.monotonic()))
            client.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if server.returncode != 0 or client.returncode != 0:
                raise ClusterError(f"link probe {src}->{dst} failed: {err.strip()[-500:]}")
            data = json.loads(out)
            if data["bytes"] < nbytes or data["seconds"] <= 0:
                raise ClusterError(
                    f"link probe {src}->{dst} received {data['bytes']} of {nbytes} bytes."
                )
            results[f"{src}->{dst}"] = data["bytes"] * 8 / data["seconds"] / 1e9
        return results
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"link probe between nodes {a} and {b} took over {timeout:.0f} s."
        ) from None
    finally:
        for proc in servers + clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)


def halving_ratios(times: Mapping[int, float]) -> list[dict]:
    """For each rate whose half was also measured: ``time at half the rate / time at the rate``.

    Args:
        times: Seconds of the same transfer per link rate (bits per second).

    Returns:
        One row per such rate, fastest first: ``rate_bps``, ``seconds``,
        ``half_seconds``, ``ratio`` and ``link_bound`` (ratio >= :data:`LINK_BOUND_RATIO`).

    Raises:
        ClusterError: A time is not positive.
    """
    bad = {rate: t for rate, t in times.items() if not t > 0}
    if bad:
        raise ClusterError(f"transfer times must be positive seconds. Received {bad}.")
    rows = []
    for rate in sorted(times, reverse=True):
        half = next((r for r in times if abs(r * 2 - rate) <= rate * 1e-6), None)
        if half is None:
            continue
        ratio = times[half] / times[rate]
        rows.append(
            {
                "rate_bps": rate,
                "seconds": times[rate],
                "half_seconds": times[half],
                "ratio": ratio,
                "link_bound": ratio >= LINK_BOUND_RATIO,
            }
        )
    return rows


def link_bound_rate(times: Mapping[int, float]) -> int | None:
    """The fastest rate from which on, down to the slowest pair measured, halving doubles the time.

    None when even the slowest pair is not link-bound (slow the links further).

    Args:
        times: Seconds of the same job per link rate (bits per second), see :func:`halving_ratios`.

    Returns:
        That rate in bit/s, or None.
    """
    best = None
    for row in reversed(halving_ratios(times)):  # slowest first
        if not row["link_bound"]:
            break
        best = row["rate_bps"]
    return best
