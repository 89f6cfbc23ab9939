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
