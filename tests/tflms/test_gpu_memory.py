"""The realistic GPU memory model: what a TensorFlow process holds beyond its tensors.

Terms are checked against the facts they come from (a real V100 log,
TensorFlow's reserve rules), and the simulator's realistic accounting against
the tensors-only one on graphs whose sizes are known exactly.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tflms
from tests.tflms.test_simulate import A, make_view, training_chain
from tflms.cost import gpu_memory
from tflms.cost.hardware import DeviceModel, get_device
from tflms.errors import ConfigError
from tflms.simulation.allocator import BFCModel

MIB = 1 << 20
V100 = get_device("V100-16GB")


def test_the_tf1_terms_reproduce_the_limit_a_real_v100_log_prints():
    # Summit's AC922 V100-SXM2-16GB under TensorFlow ~1.13: 'with 14828 MB memory'
    assert round(gpu_memory.allocator_limit(V100, "tf1") / MIB) == 14828
    terms = gpu_memory.process_terms(V100, "tf1")
    assert list(terms) == ["driver", "cuda_context", "tensorflow_reserve"]
    assert sum(terms.values()) + gpu_memory.allocator_limit(V100, "tf1") == V100.memory_bytes


@pytest.mark.parametrize(
    ("device", "reserve_mib"), [("V100-16GB", 1050), ("A100-80GB", 1536), ("H100-80GB", 1536)]
)
def test_tf2_reserves_by_compute_capability(device, reserve_mib):
    terms = gpu_memory.process_terms(get_device(device), "tf2")
    assert terms["tensorflow_reserve"] == reserve_mib * MIB
    assert terms["cuda_context"] == 300 * MIB


def test_unknown_stacks_are_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="Known: tf2, tf1"):
        gpu_memory.get_stack("tf3")


def test_every_term_cites_a_known_source():
    cited = {s for stack in gpu_memory.STACKS.values() for s in stack.sources}
    cited |= {facts.source for facts in gpu_memory.GPU_FACTS.values() if facts.source}
    assert cited <= set(gpu_memory.SOURCES)


def test_realistic_peak_is_the_tensors_plus_named_terms():
    view = training_chain(4)
    tensors = tflms.simulate(view, link="ideal", accounting="tensors")
    real = tflms.simulate(view, link="ideal")  # the default on a GPU preset
    assert real.accounting == "realistic" and real.stack == "tf2"
    terms = real.memory_terms
    assert list(terms) == [
        "driver",
        "cuda_context",
        "tensorflow_reserve",
        "tensors",
        "workspace",
        "allocator",
    ]
    assert terms["tensors"] == tensors.device_peak_bytes == 5 * A
    assert sum(terms.values()) == real.device_peak_bytes
    assert terms["workspace"] == 0 and terms["allocator"] >= 0  # no convolution here
    # the timeline is what the GPU holds: the process terms under every point
    constant = sum(gpu_memory.process_terms(V100, "tf2").values())
    assert min(real.timeline_device) >= constant
    assert "CUDA context" in real.summary() and "TensorFlow's reserve" in real.summary()
    assert real.to_dict(timeline=False)["memory_terms"] == terms


def test_the_verdict_is_the_device_memory_and_tensors_over_the_limit_do_not_fit():
    limit = gpu_memory.allocator_limit(V100, "tf2")
    small = make_view([("x", A), ("y", A)], [("x", "y", 0)])
    big = make_view([("x", limit // 2 + A), ("y", limit // 2 + A)], [("x", "y", 0)])
    assert tflms.simulate(small).fits(V100.memory_bytes)
    over = tflms.simulate(big)
    assert over.memory_terms["tensors"] > limit and not over.fits(V100.memory_bytes)


def test_fragmentation_counts_in_the_allocator_term():
    # a, then b (both live), a freed, then c (larger than a) cannot reuse a's hole
    nodes = [("a", 64 * MIB), ("b", 64 * MIB), ("c", 96 * MIB), ("d", A)]
    edges = [("a", "b", 0), ("b", "c", 0), ("c", "d", 0), ("b", "d", 1)]
    real = tflms.simulate(make_view(nodes, edges), link="ideal")
    terms = real.memory_terms
    assert terms["tensors"] == (64 + 96) * MIB + A
    assert terms["allocator"] >= 64 * MIB - A  # c sits above a's free 64 MiB


def test_a_convolution_takes_its_workspace_only_where_it_fits():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 64, 64, 64, 16], name="x")
        w = tf.ones([3, 3, 3, 16, 16])
        tf.nn.relu(tf.nn.conv3d(x, w, [1] * 5, "SAME", name="conv"), name="out")
    view = tflms.build_view(graph)
    real = tflms.simulate(view)
    # im2col: 64^3 positions x 27 taps x 16 channels x 4 bytes
    assert real.memory_terms["workspace"] == 64**3 * 27 * 16 * 4
    # the same workspace above the limit is never run: cuDNN takes another algorithm
    assert gpu_memory.conv_workspace_bytes("Conv3D", 64**3, 27 * 16, 4, 1 << 20) == 0
    assert gpu_memory.conv_workspace_bytes("Relu", 64**3, 27 * 16, 4, 4 << 30) == 0


def test_a_soft_allocation_fails_without_counting_a_failure():
    bfc = BFCModel(1 << 30, allow_growth=False)
    assert bfc.allocate(MIB) is not None
    assert bfc.allocate(2 * MIB, below=2 * MIB) is None and bfc.failed == 0
    assert bfc.allocate(MIB, below=2 * MIB) is not None


def test_custom_devices_and_cpu_judge_modes_default_to_tensors():
    tiny = DeviceModel("tiny", 64 * MIB, 1e12, 1e12, 1e12, 1e11)
    view = training_chain(2)
    assert tflms.simulate(view, device=tiny).accounting == "tensors"
    assert tflms.simulate(view, allocator="bfc").accounting == "tensors"
    with pytest.raises(ConfigError, match="already replays the GPU's BFC allocator"):
        tflms.simulate(view, accounting="realistic", allocator="bfc")


def test_autotune_judges_a_gpu_preset_realistically_and_bytes_by_tensors():
    view = training_chain(6)
    preset = tflms.autotune(view, "V100-16GB", config=tflms.LMSConfig(min_tensor_bytes=0))
    assert preset.result.accounting == "realistic" and not preset.lms_needed
    tensors_peak = tflms.simulate(view, accounting="tensors").device_peak_bytes
    in_bytes = tflms.autotune(
        view, tensors_peak, config=tflms.LMSConfig(min_tensor_bytes=0), safety_margin=0
    )
    assert in_bytes.result.accounting == "tensors" and not in_bytes.lms_needed


def test_a_calibrated_stack_names_its_fitted_term_and_the_sourced_one_has_none():
    view = training_chain(4)
    sourced = tflms.simulate(view, link="ideal", stack="tf1")
    stack = gpu_memory.calibrated("tf1", 1.5, "a test")
    fitted = tflms.simulate(view, link="ideal", stack=stack)
    assert "calibration" not in sourced.memory_terms
    terms = fitted.memory_terms
    assert list(terms)[3:5] == ["tensors", "calibration"]
    assert terms["tensors"] == sourced.memory_terms["tensors"]
    assert terms["calibration"] == round(0.5 * terms["tensors"])
    assert sum(terms.values()) == fitted.device_peak_bytes
    assert fitted.device_peak_bytes == sourced.device_peak_bytes + terms["calibration"]
    assert fitted.stack == "tf1+calibrated"
    assert "calibration (fitted, not sourced)" in fitted.summary()
    # the timeline carries the fitted memory too
    assert max(fitted.timeline_device) > max(sourced.timeline_device)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("tf1", 0.9, "x"), "finite number >= 1.0"),
        (("tf1", float("nan"), "x"), "finite number >= 1.0"),
        (("tf1", True, "x"), "finite number >= 1.0"),
        (("tf1", 1.2, " "), "fitted_on must say"),
        ((gpu_memory.calibrated("tf2", 1.2, "x"), 1.1, "y"), "already calibrated"),
        (("tf3", 1.2, "x"), "Known: tf2, tf1"),
    ],
)
def test_calibration_refuses_what_it_cannot_mean(args, match):
    with pytest.raises(ConfigError, match=match):
        gpu_memory.calibrated(*args)


def test_autotune_plans_for_the_calibrated_memory():
    # a 5-layer training chain of activations an eighth of the allocator's
    # limit fits the sourced model; times a fitted 1.6 it does not, and swaps
    # of the early activations bring it back under the device's memory
    view = training_chain(5, gpu_memory.allocator_limit(V100, "tf1") // 8)
    config = tflms.LMSConfig(min_tensor_bytes=0, swapout_threshold=1, swapin_ahead=1)
    sourced = tflms.autotune(view, "V100-16GB", config=config, safety_margin=0, stack="tf1")
    assert not sourced.lms_needed
    stack = gpu_memory.calibrated("tf1", 1.6, "a test")
    assert not tflms.simulate(view, stack=stack).fits(V100.memory_bytes)
    fitted = tflms.autotune(
        view, "V100-16GB", config=config, safety_margin=0, stack=stack, link="ideal"
    )
    assert fitted.lms_needed and fitted.plan.swaps
    assert fitted.result.memory_terms["calibration"] > 0
    assert fitted.result.device_peak_bytes <= V100.memory_bytes


def test_a_factor_fitted_to_a_boundary_reproduces_it():
    # on "a real GPU" the chain trained with 1/10-limit activations and ran out
    # of memory with 1/8: the sourced model says both fit
    limit = gpu_memory.allocator_limit(V100, "tf1")
    small, large = training_chain(5, limit // 10), training_chain(5, limit // 8)
    fit_terms = tflms.simulate(small, link="ideal", stack="tf1").memory_terms
    no_fit_terms = tflms.simulate(large, link="ideal", stack="tf1").memory_terms
    fit = gpu_memory.fit_tensor_factor(fit_terms, no_fit_terms, V100.memory_bytes)
    assert 1.0 < fit.low < fit.fitted <= fit.high
    stack = gpu_memory.calibrated("tf1", fit.fitted, "the chain: 1/10 fits, 1/8 does not")
    assert tflms.simulate(small, link="ideal", stack=stack).fits(V100.memory_bytes)
    assert not tflms.simulate(large, link="ideal", stack=stack).fits(V100.memory_bytes)
    with pytest.raises(ConfigError, match="largest size that fit first"):
        gpu_memory.fit_tensor_factor(no_fit_terms, fit_terms, V100.memory_bytes)
    with pytest.raises(ConfigError, match="with accounting='realistic'"):
        gpu_memory.fit_tensor_factor({"tensors": 0}, no_fit_terms, V100.memory_bytes)
    calibrated_terms = tflms.simulate(large, link="ideal", stack=stack).memory_terms
    with pytest.raises(ConfigError, match="from a calibrated stack"):
        gpu_memory.fit_tensor_factor(fit_terms, calibrated_terms, V100.memory_bytes)
    with pytest.raises(ConfigError, match="not optimistic here"):
        gpu_memory.fit_tensor_factor(fit_terms, no_fit_terms, V100.memory_bytes // 2)


def test_lms_config_tensor_factor_calibrates_what_the_auto_tuner_plans_with():
    view = training_chain(5, gpu_memory.allocator_limit(V100, "tf2") // 8)
    options = dict(min_tensor_bytes=0, swapout_threshold=1, swapin_ahead=1)
    config = tflms.LMSConfig(memory_budget="V100-16GB", tensor_factor=1.6, **options)
    by_config = tflms.autotune(view, config=config, safety_margin=0, link="ideal")
    stack = gpu_memory.calibrated("tf2", 1.6, "the same factor, given as a stack")
    by_stack = tflms.autotune(
        view,
        "V100-16GB",
        config=tflms.LMSConfig(**options),
        safety_margin=0,
        link="ideal",
        stack=stack,
    )
    assert by_config.lms_needed and by_config.result.stack == "tf2+calibrated"
    assert by_config.result.device_peak_bytes == by_stack.result.device_peak_bytes
    assert by_config.plan.swaps == by_stack.plan.swaps
    with pytest.raises(ConfigError, match="calibrates the realistic GPU memory model"):
        tflms.autotune(view, "16GiB", config=config)
    with pytest.raises(ConfigError, match="already calibrated"):
        tflms.autotune(view, config=config, stack=stack)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"memory_budget": "V100-16GB", "tensor_factor": 0.8}, "a finite number >= 1.0"),
        ({"memory_budget": "V100-16GB", "tensor_factor": "1.5"}, "a finite number >= 1.0"),
        ({"tensor_factor": 1.5}, "set memory_budget"),
        ({"memory_budget": "12GiB", "tensor_factor": 1.5}, "a budget in bytes does not use"),
    ],
)
def test_lms_config_refuses_a_tensor_factor_it_cannot_use(options, match):
    with pytest.raises(ConfigError, match=match):
        tflms.LMSConfig(**options)
