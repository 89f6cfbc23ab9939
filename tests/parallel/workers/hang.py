"""A job that never finishes: rank 0 waits in a barrier that rank 1 never joins.

Used to prove the harness kills hung jobs instead of blocking the suite.
"""

import sys
import time

from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        comm.Barrier()
    else:
        time.sleep(3600)
    sys.exit(0)


if __name__ == "__main__":
    main()
