"""The mpirun harness itself: real jobs run, hung jobs are killed and reported, no job
meets a killed job's leftover session directory, and killed jobs' shared-memory files do
not stay in /dev/shm."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.harness import (
    REPO,
    SESSION_BASE,
    SHM,
    SM_DIRECTORY,
    mpi_env,
    mpirun_executable,
    stale_rendezvous_names,
    stale_session_directories,
)

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def test_job_runs_on_every_rank(mpirun):
    result = mpirun(WORKERS / "hello.py", np=3, timeout=60).check()
    assert [r["size"] for r in result.rank_outputs] == [3, 3, 3]
    assert {r["sum"] for r in result.rank_outputs} == {0.0 + 1.0 + 2.0}


def test_hung_job_is_killed_and_fails_the_test(mpirun):
    token = uuid.uuid4().hex  # makes this job's processes findable
    with pytest.raises(pytest.fail.Exception, match="hung and was killed after 8s"):
        mpirun(WORKERS / "hang.py", np=2, timeout=8, args=[token])
    leftovers = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
    assert leftovers == "", f"processes of the killed job survive: {leftovers}"


def test_a_direct_mpirun_job_never_meets_a_stale_session_directory(mpirun, tmp_path):
    """mpirun's default session base, $TMPDIR, full of killed jobs' leftovers: a plain
    mpirun fails at start-up (status 213); with the harness's environment the job
    keeps its session in a fresh directory of its own and starts at once."""
    stale = stale_session_directories(tmp_path)
    try:
        plain = mpi_env(
            {"TMPDIR": str(stale), "DDL_TEST_OUTDIR": str(tmp_path)}, session_base=False
        )
        control = subprocess.run(
            [mpirun_executable(), "-np", "2", sys.executable, str(WORKERS / "hello.py")],
            env={k: v for k, v in plain.items() if k != SESSION_BASE},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert control.returncode == 213, control.stderr[-3000:]
        assert "The PMIx server's listener thread failed to start" in control.stderr
        for name in stale_rendezvous_names():  # the failed mpirun removed what it refused
            (stale / "stale" / name).write_text("tcp4://127.0.0.1:1\n")
        result = mpirun(WORKERS / "hello.py", np=2, env={"TMPDIR": str(stale)}, timeout=60).check()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
    session = Path(result.rank_outputs[0]["session"])
    assert session.name.startswith("ompi.") and session.parent.parent.name.startswith(
        "ddl-tests-ompi-"
    ), session
    assert [r["TMPDIR"] for r in result.rank_outputs] == [str(stale)] * 2  # theirs, unchanged
    assert "The PMIx server's" not in result.stderr
    if SHM.is_dir() and os.access(SHM, os.W_OK):  # and the shared-memory files: in /dev/shm, apart
        sm = Path(result.rank_outputs[0]["sm"])
        assert sm.parent.parent == SHM and sm.parent.name.startswith("ddl-tests-sm-"), sm
        assert len(result.rank_outputs[0]["sm_files"]) == 2


def test_each_launch_gets_its_own_session_base_until_the_session_ends():
    first, second = (Path(mpi_env()[SESSION_BASE]) for _ in range(2))
    assert first != second and first.parent == second.parent
    assert first.is_dir() and not any(first.iterdir())
    chosen = mpi_env({SESSION_BASE: "/scratch"})[SESSION_BASE]
    assert chosen == "/scratch"  # a test's own choice wins
    local = mpi_env({"PRTE_MCA_prte_local_tmpdir_base": "/scratch"})
    assert SESSION_BASE not in local  # PRRTE refuses it beside the local/remote form
    assert mpi_env(session_base=False).get(SESSION_BASE) == os.environ.get(SESSION_BASE)


@pytest.mark.skipif(not (SHM.is_dir() and os.access(SHM, os.W_OK)), reason="no /dev/shm")
def test_each_launch_gets_its_own_shared_memory_directory_until_the_session_ends():
    first, second = (Path(mpi_env()[SM_DIRECTORY]) for _ in range(2))
    assert first != second and first.parent == second.parent and first.parent.parent == SHM
    assert first.parent.name.startswith("ddl-tests-sm-")
    assert first.is_dir() and not any(first.iterdir())
    assert mpi_env({SM_DIRECTORY: "/scratch"})[SM_DIRECTORY] == "/scratch"  # a test's wins
    vader = mpi_env({"OMPI_MCA_btl_vader_backing_directory": "/scratch"})  # its old name
    assert vader.get(SM_DIRECTORY) == os.environ.get(SM_DIRECTORY)
    assert mpi_env(session_base=False).get(SM_DIRECTORY) == os.environ.get(SM_DIRECTORY)
    # a test process's folders go when it ends, with what killed jobs left in them
    code = (
        "import os, sys; from tests.harness import mpi_env; e = mpi_env();"
        "open(os.path.join(e['OMPI_MCA_btl_sm_backing_directory'], 'sm_segment.x'), 'w');"
        "print(e['OMPI_MCA_btl_sm_backing_directory'], e['PRTE_MCA_prte_tmpdir_base'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in (SM_DIRECTORY, SESSION_BASE)}
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr[-3000:]
    sm, base = map(Path, child.stdout.split())
    assert sm.parent.parent == SHM and not sm.parent.exists(), sm
    assert not base.parent.exists(), base
