"""ddlrun under a real launcher: a scheduler stopping the job, horovodrun's hostfile form,
mpirun failing at its own start-up, the job's private base for mpirun's session directories.

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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddl_tf.launch.session import (
    LOCAL_BASE,
    PREFIX,
    REMOTE_BASE,
    private_session_base,
    session_base_setting,
)
from tests.harness import (
    mpi_env,
    mpirun_executable,
    stale_rendezvous_names,
    stale_session_directories,
)
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


def _env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment without the harness's session base: ddlrun makes its own."""
    return mpi_env({"DDL_TEST_OUTDIR": str(tmp_path), **(extra or {})}, session_base=False)


def _session_of(pid: int) -> Path:
    """Where the launcher of rank ``pid`` keeps its session directory (PMIx tells the rank)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"PMIX_SERVER_TMPDIR=")]
    assert found, f"rank {pid} has no PMIX_SERVER_TMPDIR"
    return Path(found[0].decode())


def _stop(tmp_path: Path, worker: str, signum: int, *args: str, start_timeout: float = 120):
    mpirun_executable()  # skips without an MPI
    env = _env(tmp_path)
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
        sessions = {_session_of(pid) for pid in pids}
        start = time.monotonic()
        job.send_signal(signum)
        _, err = job.communicate(timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS)
        took = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    (session,) = sessions
    base = session.parent  # ddlrun's private base, which it removes when the job ends
    assert base.name.startswith(PREFIX) and not base.exists(), (session, err[-3000:])
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
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert json.loads((tmp_path / "rank1.json").read_text())["sum"] == 1.0


# ----------------------------------------------------------- mpirun failing at its start-up


def _ddlrun(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    mpirun_executable()  # skips without an MPI
    start = time.monotonic()
    job = subprocess.run(
        [str(DDLRUN), "-np", "2", *args],
        cwd=REPO,
        env=_env(tmp_path, env),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS,
    )
    return job, time.monotonic() - start


@pytest.fixture
def stale(tmp_path):
    """A directory that makes every mpirun using it as its session base fail at start-up."""
    base = stale_session_directories(tmp_path)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_job_mpirun_failed_to_start_is_launched_again_and_runs_once(tmp_path, stale):
    # a base the user set wins over ddlrun's own: here it is the one full of stale sessions
    job, took = _ddlrun(
        tmp_path, str(WORKERS / "hello.py"), env={"PRTE_MCA_prte_tmpdir_base": str(stale)}
    )
    assert job.returncode == 0, job.stderr[-3000:]
    failed = [line for line in job.stderr.splitlines() if line.startswith("The PMIx server's")]
    assert len(failed) == 1, job.stderr  # mpirun's own line: the first launch failed
    retry = [line for line in job.stderr.splitlines() if "launching the job again" in line]
    assert len(retry) == 1, job.stderr
    assert "mpirun failed at start-up, before any rank ran (exit code 213" in retry[0]
    assert "retry 1 of 2, attempt 2" in retry[0]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in reports] == [1, 1]
    assert Path(reports[0]["session"]).parent == stale  # the user's base, not one of ddlrun's
    assert took < 30, f"{took:.1f} s"


def test_with_start_retries_0_a_failed_start_is_reported_as_is(tmp_path, stale):
    job, _ = _ddlrun(
        tmp_path,
        "--start-retries",
        "0",
        str(WORKERS / "hello.py"),
        env={"PRTE_MCA_prte_tmpdir_base": str(stale)},
    )
    assert job.returncode == 213, job.stderr[-3000:]
    assert "The PMIx server's listener thread failed to start" in job.stderr
    assert "launching the job again" not in job.stderr
    assert "ddlrun: job failed with exit code 213" in job.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_a_stale_session_directory_no_longer_fails_a_job(tmp_path, stale):
    """The same leftovers in $TMPDIR, where mpirun would put its session directory by
    default: ddlrun's job keeps it in a fresh directory of its own, so it starts at the
    first launch, touches none of the leftovers, and removes its directory at the end."""
    before = len(os.listdir(stale))
    job, took = _ddlrun(tmp_path, str(WORKERS / "hello.py"), env={"TMPDIR": str(stale)})
    assert job.returncode == 0, job.stderr[-3000:]
    assert "The PMIx server's" not in job.stderr, job.stderr[-3000:]
    assert "launching the job again" not in job.stderr, job.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in reports] == [1, 1]
    session = Path(reports[0]["session"])  # <TMPDIR>/ddlrun-ompi-XXXXXXXX/ompi.<pid>
    assert session.parent.parent == stale and session.parent.name.startswith(PREFIX), session
    assert session.name.startswith("ompi.")
    assert [r["TMPDIR"] for r in reports] == [str(stale)] * 2  # the ranks' own, unchanged
    assert not session.parent.exists()  # removed when the job ended
    assert len(os.listdir(stale)) == before  # nothing of the job's left, nothing else removed
    assert sorted(p.name for p in (stale / "stale").iterdir()) == stale_rendezvous_names()
    assert took < 30, f"{took:.1f} s"


def test_a_failed_jobs_session_directory_is_removed_too(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    job, _ = _ddlrun(tmp_path, str(WORKERS / "hello.py"), "3", env={"TMPDIR": str(tmpdir)})
    assert job.returncode == 3, job.stderr[-3000:]
    session = Path(json.loads((tmp_path / "rank0.json").read_text())["session"])
    assert session.parent.parent == tmpdir and session.parent.name.startswith(PREFIX), session
    assert not session.parent.exists()
    assert not list(tmpdir.glob(f"{PREFIX}*"))


def test_the_users_session_base_wins_and_only_open_mpi_gets_one(tmp_path):
    mpirun = mpirun_executable()
    environ = {"HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    assert session_base_setting(mpirun, [], environ) is None
    for name in ("prte_tmpdir_base", "prte_local_tmpdir_base", "prte_remote_tmpdir_base"):
        setting = session_base_setting(mpirun, [], {**environ, f"PRTE_MCA_{name}": "/x"})
        assert setting == f"PRTE_MCA_{name}=/x"
        assert session_base_setting(mpirun, ["--prtemca", name, "/x"], environ)
    (tmp_path / ".prte").mkdir()  # the user's own parameter file, read by prte_info
    (tmp_path / ".prte" / "mca-params.conf").write_text("prte_remote_tmpdir_base = /y\n")
    setting = session_base_setting(mpirun, [], environ)
    assert setting == "prte_remote_tmpdir_base=/y (Open MPI's parameter files)"
    with private_session_base(
        mpirun, [], flavor="openmpi", same_machine=True, environ=environ
    ) as v:
        assert v == {}
    environ["HOME"] = str(tmp_path / "nowhere")
    with private_session_base(mpirun, [], flavor="hydra", same_machine=True, environ=environ) as v:
        assert v == {}
    with private_session_base(
        mpirun, [], flavor="openmpi", same_machine=False, environ=environ
    ) as v:
        base = Path(v.pop(LOCAL_BASE))
        assert v == {} and base.parent == tmp_path and base.is_dir()  # REMOTE_BASE: not set
    assert not base.exists()
    with pytest.raises(RuntimeError):  # removed when the job fails with an exception too
        with private_session_base(
            mpirun, [], flavor="openmpi", same_machine=True, environ=environ
        ) as v:
            assert v[LOCAL_BASE] == v[REMOTE_BASE]
            (Path(v[LOCAL_BASE]) / "ompi.1").mkdir()
            raise RuntimeError
    assert not Path(v[LOCAL_BASE]).exists()


def test_a_job_whose_ranks_ran_is_never_launched_again(tmp_path):
    """Its ranks reached ddlrun's start-up check, had their effect, then failed as a failed
    start does (the same line, status 213): the effect must happen once."""
    effect = tmp_path / "effect"
    job, _ = _ddlrun(tmp_path, str(WORKERS / "side_effect_then_fail.py"), str(effect))
    assert job.returncode == 213, job.stderr[-3000:]
    assert "launching the job again" not in job.stderr, job.stderr[-3000:]
    assert sorted(effect.read_text().split()) == ["0", "1"]
