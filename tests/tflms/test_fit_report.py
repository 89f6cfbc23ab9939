"""Without a memory budget, a known GPU gets told whether the plan fits and what to set."""

from __future__ import annotations

import pytest

import tflms
from tflms import zoo
from tflms.frontends.fit_report import fit_report, preset_for_gpu_name, visible_gpu_preset


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-PCIE-32GB", "V100-32GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None),  # no preset for the 40 GB A100
        ("NVIDIA GeForce RTX 4090", None),
        ("", None),
    ],
)
def test_tensorflows_gpu_names_map_to_presets(name, preset):
    assert preset_for_gpu_name(name) == preset


def test_no_gpu_no_report():
    assert visible_gpu_preset() is None  # these machines have no GPU: nothing to say


@pytest.fixture(scope="module")
def lm():
    # GPT-2's vocabulary and context at a tiny width: the 50257-way logits dominate
    return zoo.gpt2(seq=1024, dim=64, heads=2, layers=1)


def test_a_plan_that_fits_says_so(lm):
    view = tflms.analyze(lm, batch_size=1)
    report = fit_report(view, tflms.make_plan(view, tflms.LMSConfig(batch_size=1)), "V100-16GB")
    assert report.fits and report.peak_bytes < report.capacity_bytes == 16 << 30
    assert "it fits" in report.message and "simulated" in report.message


def test_a_plan_that_does_not_fit_names_the_budget_to_set(lm):
    view = tflms.analyze(lm, batch_size=96)
    report = fit_report(view, tflms.make_plan(view, tflms.LMSConfig(batch_size=96)), "V100-16GB")
    assert not report.fits and report.peak_bytes > report.capacity_bytes
    assert "does not fit" in report.message
    assert "memory_budget='V100-16GB'" in report.message
