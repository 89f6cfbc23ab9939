"""Horovod parity suite: every test of workers/parity on 2 ranks, in ONE mpirun.

The suite (written from Horovod 0.28.1's documented semantics) covers rank-local
argument errors, error types, integer averages and scale factors, the new
grouped and in-place collectives, gradient definitions, Keras callbacks on
unbuilt models, local layers, elastic state and SyncBatchNormalization. It runs
as one job on purpose: a test failing on one rank must not leave the ranks out
of step for the tests after it (one test makes rank 1 leave early on purpose).
"""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

ENV = {
    # no hang may outlive the job: stalled collectives raise after 60 s
    "DDL_STALL_WARNING_SECONDS": "20",
    "DDL_STALL_SHUTDOWN_SECONDS": "60",
}


def test_horovod_parity_suite_in_one_mpirun(mpirun):
    result = mpirun(WORKERS / "parity_main.py", np=2, env=ENV, timeout=600)
    outputs = result.rank_outputs
    assert len(outputs) == 2, result.describe()
    rank0, rank1 = (o["tests"] for o in outputs)
    assert rank0.keys() == rank1.keys(), "both ranks ran the same tests"
    failed = {
        r: {
            t: o["failures"].get(t.rpartition("::")[2], "")
            for t, v in o["tests"].items()
            if v == "failed"
        }
        for r, o in enumerate(outputs)
    }
    assert failed == {0: {}, 1: {}}, failed
    early = next(
        t
        for t in rank0
        if t.endswith("test_rank_1_leaves_early_and_rank_0_gets_an_error_not_a_hang")
    )
    assert (rank0[early], rank1[early]) == ("passed", "xfailed")
    after = next(t for t in rank0 if t.endswith("test_the_next_test_runs_in_step"))
    assert rank0[after] == rank1[after] == "passed"
    assert sum(v == "passed" for v in rank0.values()) >= 40, rank0
    assert not any(v == "skipped" for v in rank0.values()), rank0
    assert [o["exit"] for o in outputs] == [0, 0]
    result.check()
