"""The mpirun harness itself: real jobs run, hung jobs are killed and reported, and no job
meets a killed job's leftover session directory."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.harness import (
    SESSION_BASE,
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


def test_each_launch_gets_its_own_session_base_until_the_session_ends():
    first, second = (Path(mpi_env()[SESSION_BASE]) for _ in range(2))
    assert first != second and first.parent == second.parent
    assert first.is_dir() and not any(first.iterdir())
    chosen = mpi_env({SESSION_BASE: "/scratch"})[SESSION_BASE]
    assert chosen == "/scratch"  # a test's own choice wins
    local = mpi_env({"PRTE_MCA_prte_local_tmpdir_base": "/scratch"})
    assert SESSION_BASE not in local  # PRRTE refuses it beside the local/remote form
    assert mpi_env(session_base=False).get(SESSION_BASE) == os.environ.get(SESSION_BASE)
