"""The auto-tuner's shared work (PlanSimulator, memoized recomputations) changes no result.

The reference path (``benchmarks/from_scratch.py``) simulates every plan from
scratch with :func:`tflms.simulate` and composes every option setting's plan
with a fresh lever composition, as the search did before it reused work
across plans; both paths must choose the
same plan with the same predicted peak and report the same candidates.
"""

from __future__ import annotations

import pytest

import tflms
from benchmarks.from_scratch import from_scratch
from tflms import zoo
from tflms.simulation.plans import PlanSimulator, plan_key


def _reference(*args, **kwargs) -> tflms.AutotuneResult:
    with from_scratch():
        return tflms.autotune(*args, **kwargs)


def _assert_same(fast: tflms.AutotuneResult, slow: tflms.AutotuneResult) -> None:
    assert fast.config == slow.config
    assert fast.plan == slow.plan
    assert fast.retime == slow.retime
    assert fast.result == slow.result
    assert fast.baseline == slow.baseline
    assert fast.candidates == slow.candidates


@pytest.mark.parametrize(
    ("model", "batch", "fraction", "link"),
    [
        (lambda: zoo.gpt2(vocab=64, seq=32, dim=32, heads=2, layers=2), 8, 0.55, "pcie3"),
        (lambda: zoo.cnn(16, (8, 8, 16)), 16, 0.8, "nvlink2"),
    ],
    ids=["gpt2", "cnn"],
)
def test_same_plan_peak_and_candidates_as_simulating_from_scratch(model, batch, fraction, link):
    view = tflms.analyze(model(), batch_size=batch)
    peak = tflms.simulate(view, accounting="tensors").device_peak_bytes
    budget = int(peak * fraction)
    options = dict(safety_margin=0.0, link=link, config=tflms.LMSConfig(min_tensor_bytes=0))
    fast = tflms.autotune(view, budget, **options)
    slow = _reference(view, budget, **options)
    assert fast.lms_needed and fast.plan.recomputes or fast.plan.swaps
    _assert_same(fast, slow)


def test_plan_simulator_matches_simulate_over_each_link():
    view = tflms.analyze(zoo.gpt2(vocab=64, seq=32, dim=32, heads=2, layers=1), batch_size=4)
    config = tflms.LMSConfig(swapout_threshold=4, min_tensor_bytes=0, recompute=True)
    plan = tflms.make_plan(view, config)
    assert plan.swaps and plan.recomputes
    plans = PlanSimulator(view, device="V100-16GB", link="pcie3", accounting="realistic")
    assert plans.baseline == tflms.simulate(view)
    for link in ("pcie3", "ideal", "nvlink2", "pcie3"):  # relinked, then from the memo
        expected = tflms.simulate(view, plan, link=link, baseline=plans.baseline)
        assert plans.simulate(plan, link=link, baseline=plans.baseline) == expected
    assert plan_key(plan) != plan_key(tflms.SwapPlan())
