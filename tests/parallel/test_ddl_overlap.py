"""Overlapped gradient allreduce on 2 real ranks (see workers/overlap.py for the cases)."""

from pathlib import Path

import pytest

from tests.timing import HANG_SECONDS

WORKERS = Path(__file__).parent / "workers"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def test_buckets_overlap_backprop_keep_ranks_identical_and_catch_mismatches(mpirun):
    result = mpirun(WORKERS / "overlap.py", np=2, timeout=300).check()
    rank0, rank1 = result.rank_outputs
    for out in (rank0, rank1):
        # Keras fit: bitwise identical across ranks with overlap on and off, and on == off
        assert out["fit_identical_overlap_True"] and out["fit_identical_overlap_False"]
        assert out["fit_on_equals_off"] and out["fit_moved"] > 1e-3
        # DistributedGradientTape in tf.function: last layer first, first layer last, and the
        # first bucket's collective does not wait for the first layer's gradient ...
        on, off = out["tape_overlap_True"], out["tape_overlap_False"]
        assert out["tape_identical_overlap_True"] and out["tape_identical_overlap_False"]
        assert on["buckets"] >= 4 and on["last_layer_bucket"] == 0
        assert on["first_layer_bucket"] >= on["buckets"] - 2
        assert on["first_waits_for_first_layer_gradient"] is False
        # ... while the fused collective of overlap=False does (the check can fail)
        assert off["buckets"] == 1 and off["first_waits_for_first_layer_gradient"] is True
        # tflms-rewritten train step: swap ops in the graph, still no wait on the last gradient
        assert out["tflms_swaps"] > 0 and out["tflms_swap_ops"] > 0
        assert out["tflms"]["buckets"] >= 4 and out["tflms"]["last_layer_bucket"] == 0
        assert out["tflms"]["first_waits_for_first_layer_gradient"] is False
        assert out["tflms_identical"]
        # a rank with different gradient shapes fails the step on every rank, quickly
        assert out["mismatch"]["raised"] == "FailedPreconditionError", out["mismatch"]
        assert "CollectiveMismatchError" in out["mismatch"]["message"]
        assert out["mismatch"]["seconds"] < HANG_SECONDS
        assert out["after"] == [2.0, 2.0]
    # the timeline: the first bucket's collective starts before the last bucket's gradients
    # exist, in most steps of both ranks
    for rank in (0, 1):
        timeline = rank0[f"timeline_rank{rank}"]
        assert timeline["buckets"] >= 4 and timeline["steps"] == 8, timeline
        assert timeline["overlapped_steps"] >= 6, timeline
