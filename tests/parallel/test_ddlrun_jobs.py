"""ddlrun under a real launcher: a scheduler stopping the job, horovodrun's hostfile form,
mpirun failing at its own start-up.

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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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


# ----------------------------------------------------------- mpirun failing at its start-up


def _stale_session_directories(tmp_path: Path) -> str:
    """A TMPDIR where every pid's Open MPI session directory holds a killed mpirun's leftover.

    mpirun keeps its session in ``$TMPDIR/ompi.<pid>``, with PMIx's rendezvous
    file ``pmix.<host>.tool``; a killed mpirun leaves them behind, and a new
    mpirun that gets the same pid fails at start-up ("The PMIx server's
    listener thread failed to start", status 213), before any rank runs: the
    CI flake. Here every pid's directory is a link to one directory with that
    file, so the next mpirun fails whatever its pid; it removes the file as it
    ends, so the launch after it starts, as in the wild (another pid).
    """
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if pid_max > 65536:
        pytest.skip(f"pid_max {pid_max}: too many pids to cover with stale session directories")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else tmp_path))
    stale = base / "stale"
    stale.mkdir()
    host = socket.gethostname()
    for name in {host, host.split(".")[0]}:
        (stale / f"pmix.{name}.tool").write_text("tcp4://127.0.0.1:1\n")  # the killed mpirun's
    for pid in range(2, pid_max):
        os.symlink("stale", base / f"ompi.{pid}")
    return str(base)


def _ddlrun(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    mpirun_executable()  # skips without an MPI
    start = time.monotonic()
    job = subprocess.run(
        [str(DDLRUN), "-np", "2", *args],
        cwd=REPO,
        env=mpi_env({"DDL_TEST_OUTDIR": str(tmp_path), **(env or {})}),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS,
    )
    return job, time.monotonic() - start


def test_a_job_mpirun_failed_to_start_is_launched_again_and_runs_once(tmp_path):
    tmpdir = _stale_session_directories(tmp_path)
    try:
        job, took = _ddlrun(tmp_path, str(WORKERS / "hello.py"), env={"TMPDIR": tmpdir})
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert job.returncode == 0, job.stderr[-3000:]
    failed = [line for line in job.stderr.splitlines() if line.startswith("The PMIx server's")]
    assert len(failed) == 1, job.stderr  # mpirun's own line: the first launch failed
    retry = [line for line in job.stderr.splitlines() if "launching the job again" in line]
    assert len(retry) == 1, job.stderr
    assert "mpirun failed at start-up, before any rank ran (exit code 213" in retry[0]
    assert "retry 1 of 2, attempt 2" in retry[0]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text())["sum"] for r in (0, 1)] == [1, 1]
    assert took < 30, f"{took:.1f} s"


def test_with_start_retries_0_a_failed_start_is_reported_as_is(tmp_path):
    tmpdir = _stale_session_directories(tmp_path)
    try:
        job, _ = _ddlrun(
            tmp_path, "--start-retries", "0", str(WORKERS / "hello.py"), env={"TMPDIR": tmpdir}
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert job.returncode == 213, job.stderr[-3000:]
    assert "The PMIx server's listener thread failed to start" in job.stderr
    assert "launching the job again" not in job.stderr
    assert "ddlrun: job failed with exit code 213" in job.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_a_job_whose_ranks_ran_is_never_launched_again(tmp_path):
    """Its ranks reached ddlrun's start-up check, had their effect, then failed as a failed
    start does (the same line, status 213): the effect must happen once."""
    effect = tmp_path / "effect"
    job, _ = _ddlrun(tmp_path, str(WORKERS / "side_effect_then_fail.py"), str(effect))
    assert job.returncode == 213, job.stderr[-3000:]
    assert "launching the job again" not in job.stderr, job.stderr[-3000:]
    assert sorted(effect.read_text().split()) == ["0", "1"]
