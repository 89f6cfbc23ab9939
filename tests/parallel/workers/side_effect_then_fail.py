"""A job whose ranks run (and have an effect) before it fails as mpirun's start-up failure does.

``side_effect_then_fail.py PATH``: each rank calls ``init()`` (so it reports to
ddlrun's start-up check), appends its rank to ``PATH`` (the effect that must
happen once), prints the very line OpenPMIx's server prints when mpirun fails at
its own start-up, and exits with that failure's status, 213. ddlrun must not
launch such a job again (tests/parallel/test_ddlrun_jobs.py).
"""

import os
import sys

from ddl_tf.core.basics import init


def main(path: str) -> None:
    init()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    with open(path, "a") as effect:
        effect.write(f"{rank}\n")
    print("The PMIx server's listener thread failed to start. We cannot", file=sys.stderr)
    sys.stderr.flush()
    os._exit(213)


if __name__ == "__main__":
    main(sys.argv[1])
