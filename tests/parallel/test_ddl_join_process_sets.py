"""Horovod's process sets and join() on 4 ranks under mpirun, checked against numpy.

Every rank's outcome is asserted: a check that only reads rank 0 would miss the
ranks outside a set (their local gradients) and the ranks inside it.
"""

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
        assert o["keras_pair_error"] < 1e-6, o  # members: the pair's mean; others: alone
        # Horovod's dynamic sets: lowest free id reused, removed objects re-added
        assert o["ids"] == [1, 2, 3] and o["invalidated"] and o["reused"] == 2, o
        assert o["readded"] == 4, o
        assert o["duplicates"] == [True, True], o  # ValueError for the global set and b again
        assert o["registered"] == {"0": [0, 1, 2, 3], "1": [0], "2": [0, 3], "3": [3], "4": [1, 2]}
        assert o["str"] == [
            "ProcessSet(process_set_id=0, ranks=[0, 1, 2, 3], mpi_comm=None)",
            "ProcessSet(process_set_id=2, ranks=[0, 3], mpi_comm=None)",
        ]
        assert o["removed_all"] == [True] * 4 and o["registered_after"] == {"0": [0, 1, 2, 3]}
    assert [o["tape_pair"] for o in out] == [0.0, 4.0, 4.0, 4.0]  # 2*rank outside, 2*mean(1,3)
    assert [o.get("readded_sum") for o in out] == [None, 2.0, 2.0, None]
    assert [o["included_op"] for o in out] == [0, 1, 0, 1]
    # join: rank r had 2 + r batches; rank 3 joined last; Horovod's semantics hold
    for o in out:
        assert o["last"] == 3 and o["join_error"] < 1e-12, o
        assert o["refusal_last"] == 3
    assert [o.get("refusal") for o in out] == [None, True, True, True]
