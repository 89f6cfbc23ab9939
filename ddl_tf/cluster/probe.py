"""TCP throughput between two nodes of a running cluster (python sockets, bounded).

:func:`link_throughput` streams a fixed number of bytes from node ``a`` to
node ``b`` (and, with ``both_directions``, from ``b`` to ``a`` at the same
time, as an allreduce does) and reports the payload rate each receiver saw.
Every loop is bounded in bytes and in time: sockets time out, the client
retries its connection a limited number of times, and the processes are
killed after ``timeout`` seconds.

Example (needs root)::

    with Cluster(ClusterSpec(nodes=2, link="1gbit")) as cluster:
        link_throughput(cluster, 0, 1)   # {'0->1': 0.93, '1->0': 0.93} (Gbit/s)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ddl_tf.cluster.errors import ClusterError

__all__ = ["link_throughput", "PORT"]

PORT = 47613

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
