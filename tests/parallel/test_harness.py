"""The mpirun harness itself: real jobs run, hung jobs are killed and reported."""

import subprocess
import uuid
from pathlib import Path

import pytest

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
