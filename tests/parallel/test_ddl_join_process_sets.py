"""Horovod's process sets and join() on 4 ranks under mpirun, checked against numpy."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def test_process_sets_run_side_by_side_and_join_handles_uneven_data(mpirun):
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    result = mpirun(WORKERS / "join_process_sets.py", np=4, env=env, timeout=240).check()
    out = result.rank_outputs
    assert len(out) == 4
    # process sets: {0, 2} ran 7 allreduces while {1, 3} ran 3, each matching numpy
    assert [o["set"] for o in out] == [
        [2, [0, 2], 2, 0],
        [1, [1, 3], 2, 0],
        [2, [0, 2], 2, 1],
        [1, [1, 3], 2, 1],
    ]
    assert [len(o["allreduce"]) for o in out] == [7, 3, 7, 3]
    for o in out:
        assert all(o["allreduce"]) and o["average"] and o["allgather"] and o["broadcast"], o
        assert o["objects"] and o["outsider"] is True and o["size_op"] == 2, o
        assert o["keras_error"] < 1e-6, o  # DistributedOptimizer(process_set=) = numpy SGD
        assert o["removed"] == [True, False] and o["global_after"] == 6.0
    assert [o["included_op"] for o in out] == [0, 1, 0, 1]
    # join: rank r had 2 + r batches; rank 3 joined last; Horovod's semantics hold
    for o in out:
        assert o["last"] == 3 and o["join_error"] < 1e-12, o
        assert o["refusal_last"] == 3
    assert [o.get("refusal") for o in out] == [None, True, True, True]
