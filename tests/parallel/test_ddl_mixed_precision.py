"""Mixed precision across ranks under a real mpirun: every rank skips the same steps."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def test_one_rank_overflowing_makes_every_rank_skip_the_same_steps(mpirun):
    result = mpirun(WORKERS / "mixed_precision.py", np=2, timeout=300).check()
    outputs = result.rank_outputs
    assert [o["optimizer"] for o in outputs] == ["DistributedLossScaleOptimizer"] * 2
    steps = [o["steps"] for o in outputs]
    assert steps[0] == steps[1], steps  # the same applied steps and loss scales on both ranks
    applied = [iterations for iterations, _ in steps[0]]
    skipped = [i for i, (a, b) in enumerate(zip([0, *applied], applied, strict=False)) if a == b]
    assert {3, 7} <= set(skipped), steps[0]  # rank 1 alone overflowed at steps 3 and 7
    assert applied[-1] > 0  # and the other steps trained
    assert outputs[0]["digest"] == outputs[1]["digest"]  # replicas bitwise identical
