"""Keras 3 training with DistributedOptimizer on 2 ranks vs one process on the global batches."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def test_keras_training_matches_single_process_and_ranks_agree_bitwise(mpirun):
    result = mpirun(WORKERS / "keras_train.py", np=2, timeout=300).check()
    rank0, rank1 = result.rank_outputs
    for label in ("fit", "tape", "apply", "bpps"):
        assert rank0[f"{label}_identical"] and rank1[f"{label}_identical"], label
        assert rank0[f"{label}_max_diff"] < 1e-5, (label, rank0)
    assert rank0["fit_moved"] > 0.1, "training did not change the weights"
    assert rank0["bpps_iterations"] == 8  # 2 epochs x 8 local batches / 2 passes per step
