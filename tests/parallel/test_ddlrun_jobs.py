"""ddlrun under a real launcher: a scheduler stopping the job, horovodrun's hostfile form,
mpirun failing at its own start-up, the job's private base for mpirun's session directories
and the job's private directory (in /dev/shm) for its ranks' shared-memory files.

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

import psutil
import pytest

from ddl_tf import env as ddl_env
from ddl_tf.launch.session import (
    PREFIX,
    SM_PREFIX,
    private_session_base,
    private_sm_directory,
    session_base_setting,
    sm_directory_setting,
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


LOCAL_BASE = ddl_env.PRTE_MCA_prte_local_tmpdir_base
REMOTE_BASE = ddl_env.PRTE_MCA_prte_remote_tmpdir_base
SM_DIRECTORY = ddl_env.OMPI_MCA_btl_sm_backing_directory
SHM = Path("/dev/shm")


def _variable_of(pid: int, name: str) -> Path:
    """The directory in variable ``name`` of rank ``pid``'s environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [v.split(b"=", 1)[1] for v in environ if v.startswith(f"{name}=".encode())]
    assert found, f"rank {pid} has no {name}"
    return Path(found[0].decode())


def _session_of(pid: int) -> Path:
    """Where the launcher of rank ``pid`` keeps its session directory (PMIx tells the rank)."""
    return _variable_of(pid, "PMIX_SERVER_TMPDIR")


def _segments(folder: Path) -> list[str]:
    """The shared-memory backing files of Open MPI's ranks in ``folder``."""
    return sorted(p.name for p in folder.glob("sm_segment.*"))


def _private_sm(directory: str | Path | None) -> Path:
    """ddlrun's private directory for the job's shared-memory files, checked as such."""
    assert directory is not None, "the ranks got no shared-memory directory"
    folder = Path(directory)
    assert folder.parent == SHM and folder.name.startswith(SM_PREFIX), folder
    return folder


needs_shm = pytest.mark.skipif(
    not (SHM.is_dir() and os.access(SHM, os.W_OK)), reason="no writable /dev/shm"
)


def _rank_pids(job: subprocess.Popen, tmp_path: Path, deadline: float) -> list[int]:
    """The two ranks' pids, once each wrote its report to ``tmp_path`` (the job still running)."""
    reports = [tmp_path / f"rank{r}.json" for r in range(2)]
    while not all(p.exists() for p in reports):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the ranks never reported"
        time.sleep(0.2)
    return [json.loads(p.read_text())["pid"] for p in reports]


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
        pids = _rank_pids(job, tmp_path, time.monotonic() + start_timeout)
        sessions = {_session_of(pid) for pid in pids}
        (sm,) = {_variable_of(pid, SM_DIRECTORY) for pid in pids}
        segments = _segments(_private_sm(sm))  # the ranks' files, in the job's directory
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
    assert segments and not sm.exists(), (sm, segments)  # removed with the files in it
    assert not [name for name in segments if (SHM / name).exists()]
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
    sm = _private_sm(reports[0]["sm"])  # the ranks' shared-memory files: in /dev/shm, apart
    assert reports[0]["sm_files"] and not sm.exists()
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
    report = json.loads((tmp_path / "rank1.json").read_text())
    assert report["sm_files"] and not _private_sm(report["sm"]).exists()


def _kill_mpirun_and_ranks(tmp_path: Path, env: dict[str, str] | None = None):
    """A ddlrun job whose mpirun and ranks are killed with SIGKILL (the OOM killer, a node's
    watchdog) once the ranks run: ddlrun lives on. Returns the job, the ranks' shared-memory
    directory and the backing files that were in it."""
    mpirun_executable()  # skips without an MPI
    job = subprocess.Popen(
        [str(DDLRUN), "-np", "2", str(WORKERS / "cluster_sleeper.py"), "wait"],
        cwd=REPO,
        env=_env(tmp_path, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        pids = _rank_pids(job, tmp_path, deadline)
        (sm,) = {_variable_of(pid, SM_DIRECTORY) for pid in pids}
        while len(_segments(sm)) < 2:  # each rank's own, made at MPI_Init
            assert time.monotonic() < deadline, _segments(sm)
            time.sleep(0.1)
        segments = _segments(sm)
        (mpirun,) = psutil.Process(job.pid).children()
        for victim in (mpirun.pid, *pids):
            os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job, err, sm, segments


@needs_shm
def test_a_killed_jobs_shared_memory_files_go_with_its_private_directory(tmp_path):
    """mpirun and the ranks killed with SIGKILL leave their 16 MiB shared-memory files
    behind (control: the directory the user chose keeps them); in ddlrun's own directory
    in /dev/shm they go when the job ends, and ddlrun, alive, reports the job's status."""
    chosen, control = tmp_path / "sm", tmp_path / "control"
    chosen.mkdir()
    control.mkdir()
    job, err, sm, segments = _kill_mpirun_and_ranks(control, {SM_DIRECTORY: str(chosen)})
    assert job.returncode == 137, err[-3000:]
    assert sm == chosen and len(segments) == 2
    assert _segments(chosen) == segments  # the user's directory: left as it is, files and all

    job, err, sm, segments = _kill_mpirun_and_ranks(tmp_path)
    assert job.returncode == 137, err[-3000:]
    assert "ddlrun: job failed with exit code 137" in err, err[-3000:]
    assert len(segments) == 2 and not _private_sm(sm).exists()
    assert not [name for name in segments if (SHM / name).exists()]


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


def test_the_users_shared_memory_directory_wins_and_only_one_machine_gets_one(tmp_path):
    mpirun = mpirun_executable()
    environ = {"HOME": str(tmp_path)}
    assert sm_directory_setting(mpirun, [], environ) is None
    for variable in (SM_DIRECTORY, ddl_env.OMPI_MCA_btl_vader_backing_directory):
        assert sm_directory_setting(mpirun, [], {**environ, variable: "/x"}) == f"{variable}=/x"
    for name in ("btl_sm_backing_directory", "btl_vader_backing_directory"):
        setting = sm_directory_setting(mpirun, ["--mca", name, "/x"], environ)
        assert setting == f"mpirun argument {name}"
    (tmp_path / ".openmpi").mkdir()  # the user's own parameter file, read by ompi_info
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.write_text("btl_sm_backing_directory = /y\n")
    setting = sm_directory_setting(mpirun, [], environ)
    assert setting == f"btl_sm_backing_directory=/y (ompi_info: file ({conf}:1))"
    with private_sm_directory(
        mpirun, [], flavor="openmpi", same_machine=True, environ=environ, shm=str(tmp_path)
    ) as v:
        assert v == {}
    environ["HOME"] = str(tmp_path / "nowhere")
    shm = tmp_path / "shm"
    shm.mkdir()
    for flavor, same_machine in (("hydra", True), ("openmpi", False)):
        with private_sm_directory(
            mpirun, [], flavor=flavor, same_machine=same_machine, environ=environ, shm=str(shm)
        ) as v:
            assert v == {}
    missing = str(tmp_path / "missing")
    with private_sm_directory(
        mpirun, [], flavor="openmpi", same_machine=True, environ=environ, shm=missing
    ) as v:
        assert v == {}
    with pytest.raises(RuntimeError):  # removed, with the files in it, on an exception too
        with private_sm_directory(
            mpirun, [], flavor="openmpi", same_machine=True, environ=environ, shm=str(shm)
        ) as v:
            folder = Path(v[SM_DIRECTORY])
            assert folder.parent == shm and folder.name.startswith(SM_PREFIX)
            (folder / "sm_segment.host.0.1.0").write_bytes(b"\0")
            raise RuntimeError
    assert not folder.exists() and not list(shm.iterdir())


def test_a_job_whose_ranks_ran_is_never_launched_again(tmp_path):
    """Its ranks reached ddlrun's start-up check, had their effect, then failed as a failed
    start does (the same line, status 213): the effect must happen once."""
    effect = tmp_path / "effect"
    job, _ = _ddlrun(tmp_path, str(WORKERS / "side_effect_then_fail.py"), str(effect))
    assert job.returncode == 213, job.stderr[-3000:]
    assert "launching the job again" not in job.stderr, job.stderr[-3000:]
    assert sorted(effect.read_text().split()) == ["0", "1"]
