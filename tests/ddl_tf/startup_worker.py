"""A job whose rank 1 never calls ``init()`` (tests/ddl_tf/test_startup.py runs it).

``python startup_worker.py MODE TOKEN`` under ddlrun or mpirun, rank 1:

* ``sleep``: sleeps 300 s instead of calling ``init()`` (a rank stuck before it);
* ``exit``: exits with status 0 at once (a rank that never gets there);
* ``mpi``: starts MPI itself (``import mpi4py.MPI``, as some programs do), then sleeps.

``host-sleep TOKEN FIRST AGAIN`` (an elastic job): the ranks on host ``FIRST`` (the
job's name for it, ``HOROVOD_HOSTNAME``) sleep 300 s instead of calling ``init()`` at the
first launch, those on host ``AGAIN`` when ddlrun relaunched the job
(``DDL_ELASTIC_RESUMED``); the others call it (``-``: no host).

Every other rank calls ``init()``, writes what happened (the error, its
message, the seconds ``init()`` took) to ``DDL_TEST_OUTDIR/rank<N>.json``
and lets the error end it. ``TOKEN`` only marks the processes, so that the
test can look for survivors.
"""

from __future__ import annotations

import os
import sys
import time


def main(mode: str, hosts: list[str]) -> None:
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if mode == "host-sleep":
        relaunched = bool(os.environ.get("DDL_ELASTIC_RESUMED"))
        if os.environ.get("HOROVOD_HOSTNAME") == hosts[1 if relaunched else 0]:
            time.sleep(300)
            return
    elif rank == 1:
        if mode == "mpi":
            from mpi4py import MPI  # noqa: F401 - starts MPI, as the other ranks' init() will
        if mode in ("sleep", "mpi"):
            time.sleep(300)
        return
    if mode == "mpi":
        from mpi4py import MPI  # noqa: F401, F811 - MPI runs before init() on every rank

    from ddl_tf.core.basics import init  # hvd.init
    from tests.parallel.workers.common import report

    start = time.monotonic()
    try:
        init()
    except Exception as err:
        report(
            rank,
            {
                "raised": type(err).__name__,
                "message": str(err),
                "seconds": time.monotonic() - start,
            },
        )
        raise
    report(
        rank,
        {
            "raised": None,
            "seconds": time.monotonic() - start,
            "host": os.environ.get("HOROVOD_HOSTNAME"),
            "resumed": os.environ.get("DDL_ELASTIC_RESUMED"),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:])
