"""Owns a rehearsal cluster for the teardown tests: python cluster_owner.py MODE STATE.json

Creates a 2-node cluster, starts a long MPI job (cluster_sleeper.py) on it,
waits until every rank reported, writes ``{"prefix", "pids"}`` to STATE
(pids: mpirun's process and every rank), then, by MODE:

* ``raise``: raises an exception inside the ``with`` block;
* ``rank-fails``: waits for the job, in which rank 1 exits with code 3;
* ``wait``: waits for the job (up to 150 s) until a signal or SIGKILL arrives.
"""

import json
import os
import sys
import time
from pathlib import Path

from ddl_tf.cluster import Cluster, ClusterSpec
from ddl_tf.cluster.mpi import job_environment

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent


def main() -> int:
    mode, state = sys.argv[1], Path(sys.argv[2])
    outdir = state.parent / "ranks"
    outdir.mkdir(exist_ok=True)
    environ = job_environment(
        {**os.environ, "DDL_TEST_OUTDIR": str(outdir), "PYTHONPATH": str(REPO)}
    )
    with Cluster(ClusterSpec(nodes=2, link="1gbit")) as cluster:
        command = cluster.mpirun_command([sys.executable, str(HERE / "cluster_sleeper.py"), mode])
        job = cluster.popen(0, command, env=environ)
        deadline = time.monotonic() + 60
        while len(list(outdir.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
            if job.poll() is not None:
                raise RuntimeError(f"the job ended early with exit code {job.returncode}")
            time.sleep(0.1)
        pids = [job.pid] + [json.loads(p.read_text())["pid"] for p in outdir.glob("rank*.json")]
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"prefix": cluster.spec.prefix, "pids": pids}))
        tmp.replace(state)
        if mode == "raise":
            raise RuntimeError("failure in the middle of a job")
        code = job.wait(timeout=150)
        print(json.dumps({"job_exit_code": code}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
