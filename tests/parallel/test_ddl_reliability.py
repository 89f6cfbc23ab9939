"""Failures become errors or job aborts, never hangs: each case runs under a real mpirun."""

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def test_mismatched_collectives_raise_on_every_rank_and_ranks_stay_in_step(mpirun):
    timeout = HANG_SECONDS + PROCESS_MARGIN_SECONDS
    result = mpirun(WORKERS / "reliability.py", np=3, args=["mismatch"], timeout=timeout).check()
    for out in result.rank_outputs:
        cases = out["cases"]
        for label in ("shape", "dtype", "name", "op", "kind", "order"):
            assert cases[label]["raised"] == "CollectiveMismatchError", (label, cases[label])
            assert cases[label]["seconds"] < HANG_SECONDS
            assert "Ranks issued different collectives" in cases[label]["message"]
        assert (
            "float32[3]" in cases["shape"]["message"] and "float32[4]" in cases["shape"]["message"]
        )
        assert "'grad_0'" in cases["name"]["message"]
        # inside tf.function the error reaches the caller as a TensorFlow error carrying ours
        assert cases["graph"]["raised"] is not None
        assert "CollectiveMismatchError" in cases["graph"]["message"]
        assert cases["graph"]["seconds"] < HANG_SECONDS
        assert cases["after"] == [3.0, 3.0]


def test_stall_warning_names_the_missing_rank_on_every_waiting_rank(mpirun):
    env = {"DDL_STALL_WARNING_SECONDS": "1"}
    result = mpirun(WORKERS / "reliability.py", np=3, args=["stall"], env=env, timeout=120)
    result.check()
    rank0, rank1, rank2 = result.rank_outputs
    assert any("for rank(s) 1 of 3" in m for m in rank0["warnings"]), rank0["warnings"]
    assert any("missing rank(s) 1" in m for m in rank2["warnings"]), rank2["warnings"]
    assert rank1["warnings"] == []


def _orphans(token: str) -> str:
    return subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    ("mode", "env", "evidence"),
    [
        pytest.param(
            "stall_abort",
            {"DDL_STALL_WARNING_SECONDS": "1", "DDL_STALL_SHUTDOWN_SECONDS": "3"},
            "rank(s) 1 did not arrive within 3 s",
            id="stall-shutdown",
        ),
        pytest.param("exception", {}, "rank 1 failed on purpose", id="exception"),
        pytest.param("kill", {}, "signal 9", id="sigkill"),
        pytest.param("exit", {}, "rank(s) 1: #1 shutdown", id="early-exit"),
    ],
)
def test_a_failing_rank_ends_the_whole_job_nonzero(mpirun, mode, env, evidence):
    token = uuid.uuid4().hex
    timeout = HANG_SECONDS + PROCESS_MARGIN_SECONDS
    result = mpirun(WORKERS / "reliability.py", np=2, args=[mode, token], env=env, timeout=timeout)
    assert result.returncode != 0, result.describe()
    assert result.elapsed < HANG_SECONDS, result.describe()
    assert evidence in result.stdout + result.stderr, result.describe()
    assert _orphans(token) == "", "processes of the failed job survive"


def test_ranks_started_with_different_settings_refuse_to_start(mpirun):
    # MPMD: rank 0 and rank 1 get different DDL_ALLREDUCE_ALGO
    import sys

    script = str(WORKERS / "reliability.py")
    result = mpirun(
        script,
        np=1,
        args=[
            "mismatch",
            ":",
            "-np",
            "1",
            "-x",
            "DDL_ALLREDUCE_ALGO=ring",
            sys.executable,
            script,
            "mismatch",
        ],
        timeout=120,
    )
    assert result.returncode != 0
    assert "different ddl_tf settings" in result.stderr
