"""ddlrun under a real launcher: a scheduler stopping the job, horovodrun's hostfile form.

SIGTERM/SIGINT/SIGHUP to ddlrun are forwarded and the whole job ends.

Slurm, PBS, Kubernetes and ``kill`` send SIGTERM; a terminal sends SIGINT; a closed
session SIGHUP. Each test starts a real ``ddlrun -np 2`` job, waits until both ranks
report, signals ddlrun alone (not its process group, as a scheduler signalling the job
script would), and checks the exit status (128 + signal), the time it took and that no
rank is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

REPO = Path(__file__).resolve().parents[2]
WORKERS = REPO / "tests" / "parallel" / "workers"
DDLRUN = Path(sys.executable).parent / "ddlrun"

pytestmark = pytest.mark.parallel


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def _stop(tmp_path: Path, worker: str, signum: int, *args: str, start_timeout: float = 120):
    mpirun_executable()  # skips without an MPI
    env = mpi_env({"DDL_TEST_OUTDIR": str(tmp_path)})
    job = subprocess.Popen(
        [str(DDLRUN), "-np", "2", str(WORKERS / worker), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + start_timeout
        reports = [tmp_path / f"rank{r}.json" for r in range(2)]
        while not all(p.exists() for p in reports):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the ranks never reported"
            time.sleep(0.2)
        pids = [json.loads(p.read_text())["pid"] for p in reports]
        start = time.monotonic()
        job.send_signal(signum)
        _, err = job.communicate(timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS)
        took = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, took, pids, err


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)], ids=["SIGINT", "SIGHUP"]
)
def test_a_signal_to_ddlrun_ends_every_rank_with_its_status(tmp_path, signum, status):
    code, took, pids, err = _stop(tmp_path, "cluster_sleeper.py", signum, "wait")
    assert code == status, err
    assert took < HANG_SECONDS, f"the job took {took:.1f} s to end"
    assert not [pid for pid in pids if _alive(pid)], "a rank outlived ddlrun"
    assert f"{signal.Signals(signum).name} received; stopping the job" in err


@pytest.mark.slow
def test_sigterm_mid_training_ends_the_job_with_143(tmp_path):
    code, took, pids, err = _stop(tmp_path, "train_until_stopped.py", signal.SIGTERM)
    assert code == 143, err[-3000:]
    assert took < HANG_SECONDS, f"the job took {took:.1f} s to end"
    assert not [pid for pid in pids if _alive(pid)], "a rank outlived ddlrun"


def test_a_hostfile_with_host_colon_slots_runs(tmp_path):
    mpirun_executable()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:2\n")
    job = subprocess.run(
        [str(DDLRUN), "--mpi", "-np", "2", "--hostfile", str(hostfile), str(WORKERS / "hello.py")],
        cwd=REPO,
        env=mpi_env({"DDL_TEST_OUTDIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert json.loads((tmp_path / "rank1.json").read_text())["sum"] == 1.0
