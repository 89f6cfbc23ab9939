"""Rank of a short 2-rank job that ends one of several ways (``argv[1]``), for the clean-end test.

Each rank runs one allreduce, then, by mode:

* ``plain``: returns (``shutdown()`` runs at exit);
* ``explicit``: calls ``shutdown()`` itself;
* ``failed1``/``failed0``/``failed_both``: that rank's engine is marked failed first, as a
  collective that broke on that rank alone leaves it (its later collectives are refused);
* ``early``: rank 1 shuts down and leaves at once, rank 0 works one more second.

Before returning, each rank reports the wall-clock time its ``main`` ended; the test
compares the job's end with the last of them.
"""

import sys
import time

import numpy as np

from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from tests.parallel.workers.common import report


def main() -> None:
    mode = sys.argv[1]
    engine = basics.init()
    rank = engine.rank
    total = engine.allreduce([np.full(3, float(rank))], ReduceSpec.of("sum"))[0]
    if mode == "failed_both" or mode == f"failed{rank}":
        engine.state.mark_failed(RuntimeError(f"a collective broke on rank {rank} alone"))
    if mode == "explicit" or (mode == "early" and rank == 1):
        basics.shutdown()
    if mode == "early" and rank == 0:
        time.sleep(1.0)
    report(rank, {"sum": total.tolist(), "ended": time.time()})


if __name__ == "__main__":
    main()
