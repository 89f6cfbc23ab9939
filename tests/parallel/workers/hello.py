"""Smallest MPI job: every rank allreduces its rank number and reports it."""

import numpy as np
from mpi4py import MPI

from tests.parallel.workers.common import report


def main() -> None:
    comm = MPI.COMM_WORLD
    total = np.zeros(1)
    comm.Allreduce(np.array([float(comm.rank)]), total)
    report(comm.rank, {"size": comm.size, "sum": float(total[0]), "host": MPI.Get_processor_name()})


if __name__ == "__main__":
    main()
