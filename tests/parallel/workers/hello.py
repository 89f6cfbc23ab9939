"""Smallest MPI job: every rank allreduces its rank number and reports it.

With it, where the rank's launcher keeps its session directory (PMIx's
``PMIX_SERVER_TMPDIR``) and the rank's own ``TMPDIR``: a job's private session
base must not change the latter (tests/parallel/test_ddlrun_jobs.py).
``hello.py N`` then exits with status N (a failed job).
"""

import os
import sys

import numpy as np
from mpi4py import MPI

from tests.parallel.workers.common import report


def main() -> None:
    comm = MPI.COMM_WORLD
    total = np.zeros(1)
    comm.Allreduce(np.array([float(comm.rank)]), total)
    report(
        comm.rank,
        {
            "size": comm.size,
            "sum": float(total[0]),
            "host": MPI.Get_processor_name(),
            "session": os.environ.get("PMIX_SERVER_TMPDIR"),
            "TMPDIR": os.environ.get("TMPDIR"),
        },
    )


if __name__ == "__main__":
    main()
    if len(sys.argv) > 1:
        sys.exit(int(sys.argv[1]))
