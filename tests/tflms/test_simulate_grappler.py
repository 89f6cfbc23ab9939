"""tflms.simulate cross-checked with Grappler on small training steps.

The large models (ResNet-50, VGG16, 3D U-Net, Transformer, MLP) are checked
by ``make bench`` (``benchmarks/bench_fidelity.py``); these are the same
checks on graphs small enough for the normal suite. Every figure on both
sides is simulated.
"""

from __future__ import annotations

import pytest

import tflms
from tests.tflms.models import dense_chain_step, keras_cnn_step
from tflms.simulation.crosscheck import crosscheck

BATCH, WIDTH = 4096, 64  # activations of 1 MiB: every op lasts over a microsecond


def test_chain_matches_grapplers_hand_derived_peak():
    depth = 4
    step = dense_chain_step(BATCH, WIDTH, depth)
    a, w = step.activation_bytes, step.weight_bytes
    view = tflms.build_view(step.graph)

    ours = tflms.simulate(view, link="ideal", accounting="grappler")

    # tests/tflms/test_grappler.py derives Grappler's peak of this step by hand.
    assert ours.device_peak_bytes == (depth + 4) * a + (depth - 1) * w + 4 * depth + 8
    # On a GPU the variables are resident (4 W) and the 1 ns overlap is gone.
    realistic = tflms.simulate(view, link="ideal", accounting="tensors")
    assert realistic.variable_bytes == depth * w
    assert realistic.device_peak_bytes < ours.device_peak_bytes + w


def test_keras_cnn_agrees_with_grappler():
    step = keras_cnn_step(batch=64)

    check = crosscheck(step.graph)

    assert abs(check.relative_error) <= 0.10, check
    assert abs(check.schedule_free_error) <= 0.01, check
    assert check.size_mismatches == 0
    assert check.to_dict()["simulated"] is True


@pytest.mark.parametrize("config", [{}, {"sync_mode": 1}])
def test_swapped_chain_agrees_with_grappler(config):
    step = dense_chain_step(BATCH, WIDTH, 6)
    plain = crosscheck(step.graph, slowdown=100)
    plan = tflms.make_plan(
        tflms.build_view(step.graph),
        tflms.LMSConfig(swapout_threshold=4, swapin_ahead=2, **config),
    )
    assert plan.swaps
    tflms.apply_plan(step.graph, plan)

    # The 64x64 weight updates last under 1 us on the virtual V100, where
    # Grappler's whole-microsecond clock piles buffers up: slow it down.
    check = crosscheck(step.graph, slowdown=100)

    assert check.swap_ops == len(plan.swaps) + plan.num_swap_ins
    assert abs(check.relative_error) <= 0.10, check
    assert check.grappler_peak_bytes < plain.grappler_peak_bytes
    assert check.ours_bytes < plain.ours_bytes
