"""Rank of a long MPI job for the cluster teardown tests: report, then wait (bounded).

Usage: cluster_sleeper.py MODE  (MODE ``wait``: sleep up to 120 s; ``rank-fails``:
rank 1 dies with exit code 3 one second after every rank reported).
"""

import os
import socket
import sys
import time

from mpi4py import MPI

from tests.parallel.workers.common import report


def main() -> None:
    comm = MPI.COMM_WORLD
    report(comm.rank, {"pid": os.getpid(), "host": socket.gethostname()})
    comm.Barrier()
    if sys.argv[1] == "rank-fails" and comm.rank == 1:
        time.sleep(1.0)
        os._exit(3)  # dies without MPI_Finalize, like a crashed rank
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
