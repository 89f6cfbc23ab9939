"""Rank of a 2 nodes x 2 ranks cluster job: what ddl_tf sees, and which traffic uses the link.

Each rank reads its node's ``eth0`` byte counters (it runs inside the node's
network namespace) around two phases: an allreduce among the ranks of one
node (shared memory: the link should stay quiet) and a hierarchical
allreduce across nodes (the link must carry it).
"""

import socket
from pathlib import Path

import numpy as np
from mpi4py import MPI

import ddl_tf as hvd
from ddl_tf.core import basics
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from tests.parallel.workers.common import report

NBYTES = 4 << 20
STATS = Path("/sys/class/net/eth0/statistics")


def sent() -> int:
    return int((STATS / "tx_bytes").read_text())


def main() -> None:
    engine = hvd.init()
    comm = MPI.COMM_WORLD
    node = engine.comms.node
    data = np.ones(NBYTES // 4, np.float32)
    comm.Barrier()
    before = sent()
    for _ in range(3):
        node.Allreduce(MPI.IN_PLACE, data)
    node.Barrier()
    after_local = sent()
    comm.Barrier()
    start_cross = sent()
    data[:] = hvd.rank() + 1
    engine.algorithms["hierarchical"].allreduce(data, ReduceOp.SUM)
    comm.Barrier()
    after_cross = sent()
    topo = basics.topology()
    report(
        hvd.rank(),
        {
            "host": socket.gethostname(),
            "processor": MPI.Get_processor_name(),
            "local_size": hvd.local_size(),
            "cross_size": hvd.cross_size(),
            "nodes": topo.num_nodes,
            "source": topo.source,
            "local_phase_tx": after_local - before,
            "cross_phase_tx": after_cross - start_cross,
            "sum_ok": bool(np.all(data == sum(range(1, hvd.size() + 1)))),
        },
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
