"""Smallest MPI job: every rank allreduces its rank number and reports it.

With it, where the rank's launcher keeps its session directory (PMIx's
``PMIX_SERVER_TMPDIR``) and the rank's own ``TMPDIR``: a job's private session
base must not change the latter (tests/parallel/test_ddlrun_jobs.py); and where
its shared-memory transport keeps its backing files (Open MPI's
``OMPI_MCA_btl_sm_backing_directory``), with the ``sm_segment.*`` files there.
``hello.py N`` then exits with status N (a failed job); ``hello.py kill``: rank 1
then dies of SIGKILL, without MPI_Finalize (a killed rank).
"""

import os
import signal
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
            "sm": os.environ.get("OMPI_MCA_btl_sm_backing_directory"),
            "sm_files": _sm_files(),
        },
    )


def _sm_files() -> list[str]:
    """The shared-memory backing files in the job's directory for them (default /dev/shm)."""
    folder = os.environ.get("OMPI_MCA_btl_sm_backing_directory") or "/dev/shm"
    return sorted(name for name in os.listdir(folder) if name.startswith("sm_segment."))


if __name__ == "__main__":
    main()
    if sys.argv[1:] == ["kill"]:
        if MPI.COMM_WORLD.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    elif len(sys.argv) > 1:
        sys.exit(int(sys.argv[1]))
