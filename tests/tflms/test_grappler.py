"""Grappler bridge: what Grappler's virtual GPU counts, checked by hand.

Every figure here is simulated by Grappler (TF 2.21) on a virtual GPU; none
comes from a real device. Sizes are chosen so that each op lasts at least one
microsecond on the default virtual GPU (Grappler's time resolution), except
where the test is about that resolution.
"""

from __future__ import annotations

import json
import logging

import pytest
import tensorflow as tf

from tests.tflms.models import dense_chain_step, keras_cnn_step, protect, swap_by_hand
from tflms.errors import ConfigError, TFLMSError, UnsupportedGraphError
from tflms.simulation.grappler import GrapplerPeak, grappler_optimize, grappler_peak

GPU = "/device:GPU:0"
CPU = "/device:CPU:0"
BATCH, WIDTH = 4096, 64  # one activation = 1 MiB, one weight = 16 KiB


def chain_peak_by_hand(depth: int, a: int, w: int) -> int:
    """Grappler's peak of :func:`dense_chain_step`, derived by hand.

    At the start of the first ReluGrad these are live: ``x`` and ``relu0``..
    ``relu{L-1}`` (kept for the weight gradients and the ReluGrads), the
    upstream gradient ``gradient_tape/Tile``, the new ``ReluGrad`` output, and
    ``fc{L-1}`` (its last consumer ``relu{L-1}`` ended at this very instant and
    Grappler frees 1 ns later): (L + 4) activations. Besides: the reads of
    ``W_1``..``W_{L-1}`` (needed for the input gradients; ``W_0``'s read is
    dead), an int32[2] reduction-axes constant, and L learning-rate scalars.
    """
    return (depth + 4) * a + (depth - 1) * w + 8 + 4 * depth


def big(peak: GrapplerPeak, size: int) -> set[str]:
    """Names of the nodes whose live tensors at the peak weigh ``size`` bytes."""
    return {t.node for t in peak.live_tensors if t.bytes == size}


# --------------------------------------------------------------------------- (a) chain


@pytest.mark.parametrize("depth", [2, 4])
def test_chain_training_step_peak_matches_hand_derived(depth):
    step = dense_chain_step(BATCH, WIDTH, depth)
    a, w = step.activation_bytes, step.weight_bytes

    peak = grappler_peak(step.graph)

    assert peak.peak_bytes == chain_peak_by_hand(depth, a, w)
    last = depth - 1
    assert big(peak, a) == {"x", f"fc{last}", "gradient_tape/Tile", "gradient_tape/ReluGrad"} | {
        f"relu{i}" for i in range(depth)
    }
    assert peak.per_device == {GPU: peak.peak_bytes, CPU: 0}
    assert "GraphMemory" in peak.simulator and tf.__version__ in peak.simulator
    assert json.loads(json.dumps(peak.to_dict()))["peak_bytes"] == peak.peak_bytes


def test_sub_microsecond_ops_pile_up_unless_slowed_down():
    step = dense_chain_step(64, 64, 4)  # each op lasts < 1 us on the virtual V100
    a = w = step.activation_bytes
    by_hand = chain_peak_by_hand(4, a, w)

    collapsed = grappler_peak(step.graph)
    spread = grappler_peak(step.graph, slowdown=100)

    assert collapsed.peak_bytes > 1.8 * by_hand  # nearly every tensor "at once"
    assert spread.peak_bytes == by_hand
    big_step = dense_chain_step(BATCH, WIDTH, 4)
    assert (
        grappler_peak(big_step.graph, slowdown=100).peak_bytes
        == grappler_peak(big_step.graph).peak_bytes
    )


# --------------------------------------------------------------------------- (b) swapping


def test_swap_without_trigger_saves_nothing():
    step = dense_chain_step(BATCH, WIDTH, 4)
    a = step.activation_bytes
    baseline = grappler_peak(step.graph).peak_bytes
    swap_by_hand(step.graph, "relu0:0")

    peak = grappler_peak(step.graph)

    assert peak.peak_bytes == baseline
    # The swap-in ran right after the swap-out and replaced relu0 at the peak.
    assert "lms/swapin_relu0" in big(peak, a) and "relu0" not in big(peak, a)
    swap_in = next(t for t in peak.live_tensors if t.node == "lms/swapin_relu0")
    relu1 = next(t for t in peak.live_tensors if t.node == "relu1")
    assert swap_in.allocated_ns <= relu1.allocated_ns + 3_000  # still in the forward pass


def test_swap_with_trigger_saves_the_swapped_tensor():
    step = dense_chain_step(BATCH, WIDTH, 4)
    a = step.activation_bytes
    baseline = grappler_peak(step.graph).peak_bytes
    # relu0 is needed again by gradient_tape/fc1/MatMul_1 and ReluGrad_3; bring it
    # back once the backward pass has reached the layer above.
    swap_by_hand(step.graph, "relu0:0", trigger="gradient_tape/ReluGrad_1")

    peak = grappler_peak(step.graph)

    assert peak.peak_bytes == baseline - a
    assert not big(peak, a) & {"relu0", "lms/swapin_relu0"}
    # The host holds the swap-out copy and, for an instant, the _Recv buffer.
    assert peak.per_device[CPU] == 2 * a
    assert "lms/swapout_relu0" in {t.node for t in peak.host_live_tensors}


# --------------------------------------------------------------------------- (c) variables


def test_variables_are_not_persistent_and_reads_are_copies():
    depth = 4
    step = dense_chain_step(BATCH, WIDTH, depth)
    a, w = step.activation_bytes, step.weight_bytes

    peak = grappler_peak(step.graph)

    # Handles weigh nothing; each read is a buffer of its own, live only until
    # its last consumer: W_0's read is dead at the peak, so W_0 is not counted.
    handles = [t for t in peak.live_tensors if t.node.endswith("/resource")]
    assert handles and all(t.bytes == 0 for t in handles)
    assert peak.variable_bytes == depth * w
    assert peak.read_variable_bytes == (depth - 1) * w
    assert "fc0/ReadVariableOp" not in big(peak, w)
    assert peak.peak_with_variables_bytes == chain_peak_by_hand(depth, a, w) + w
    # The input is fed at time 0 and kept until its last consumer, dW_0.
    x = next(t for t in peak.live_tensors if t.node == "x")
    assert x.allocated_ns == 0
    assert x.deallocated_ns == max(t.deallocated_ns for t in peak.live_tensors if t.bytes)


def test_optimizer_slot_reads_are_charged_for_the_whole_step():
    step = keras_cnn_step(batch=32, optimizer="adam")
    model, opt = step.keep
    weights = sum(v.numpy().nbytes for v in model.trainable_variables)

    peak = grappler_peak(step.graph)

    assert peak.variable_bytes == sum(v.numpy().nbytes for v in model.variables + opt.variables)
    # Adam reads its slots m and v at time 0 (the reads need no data) and uses
    # them in the update at the end: Grappler charges both copies at the peak.
    types = {op.name: op.type for op in step.graph.get_operations()}
    slot_reads = [
        t
        for t in peak.live_tensors
        if t.node.startswith(f"{opt.name}/") and types[t.node] == "ReadVariableOp"
    ]
    assert all(t.allocated_ns == 0 for t in slot_reads)
    assert sum(t.bytes for t in slot_reads) == peak.read_variable_bytes == 2 * weights
    assert peak.peak_with_variables_bytes == peak.peak_bytes - 2 * weights + peak.variable_bytes


# --------------------------------------------------------------------------- (d) Identity


def identity_graph(with_identity: bool, device: str | None) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, WIDTH], name="x")
        h = tf.nn.relu(x, name="h")
        if with_identity:
            with tf.device(device):
                h = tf.identity(h, name="copy")
            protect(h)
        tf.reduce_sum(tf.tanh(h, name="t"), name="y")
    return graph


def test_identity_on_the_gpu_is_charged_as_a_copy():
    a = BATCH * WIDTH * 4
    without = grappler_peak(identity_graph(False, None))
    with_copy = grappler_peak(identity_graph(True, None))

    assert with_copy.peak_bytes == without.peak_bytes + a
    assert "copy" in big(with_copy, a) and "h" in big(with_copy, a)


def test_identity_on_the_host_is_a_copy_in_host_memory():
    a = BATCH * WIDTH * 4
    peak = grappler_peak(identity_graph(True, CPU))

    # The host holds the Identity's output and, at the same instant, the
    # buffer of the _Recv that Grappler inserts for the device-to-host edge.
    assert peak.per_device[CPU] == 2 * a
    assert {t.node for t in peak.host_live_tensors} == {"copy", "Recv_h_0_on_/device_CPU_0"}
    # On the GPU, h lives until the remote consumer (the copy) ends.
    assert "h" in big(peak, a)


# --------------------------------------------------------------------------- shapes


def test_unknown_batch_dimension_is_an_error_unless_sized():
    unknown = dense_chain_step(None, WIDTH, 2)
    known = dense_chain_step(BATCH, WIDTH, 2)

    with pytest.raises(UnsupportedGraphError, match=r"x \[None, 64\].*batch_size=N"):
        grappler_peak(unknown.graph)
    sized = grappler_peak(unknown.graph, batch_size=BATCH).peak_bytes
    # Traced with an unknown batch, the loss gradient reads the shape at run time
    # (a few int32 Shape tensors instead of constants): equal up to a few bytes.
    assert abs(sized - grappler_peak(known.graph).peak_bytes) <= 16
    assert grappler_peak(unknown.graph, input_shapes={"x": [BATCH, WIDTH]}).peak_bytes == sized
    # Left unknown, Grappler sizes the dimension as 1 (it feeds a fake tensor of 1).
    undercount = grappler_peak(unknown.graph, allow_unknown_shapes=True, slowdown=100)
    assert (
        undercount.peak_bytes == grappler_peak(unknown.graph, batch_size=1, slowdown=100).peak_bytes
    )


def test_graphdef_of_a_funcgraph_loses_variable_shapes():
    step = dense_chain_step(BATCH, WIDTH, 2)
    graph_def = step.graph.as_graph_def()

    with pytest.raises(UnsupportedGraphError, match="variable of unknown shape"):
        grappler_peak(graph_def)
    loose = grappler_peak(graph_def, allow_unknown_shapes=True)
    assert loose.variable_bytes == 0
    assert loose.peak_bytes < grappler_peak(step.graph).peak_bytes


# --------------------------------------------------------------------------- inputs


def test_tf_graph_graphdef_and_concrete_function_agree():
    graph = identity_graph(False, None)
    from_graph = grappler_peak(graph, fetches=["y"])
    assert grappler_peak(graph.as_graph_def()).peak_bytes == from_graph.peak_bytes
    assert from_graph.fetches == ("y",)

    @tf.function
    def f(x):
        return tf.reduce_sum(tf.tanh(tf.nn.relu(x)))

    concrete = f.get_concrete_function(tf.TensorSpec([BATCH, WIDTH]))
    assert grappler_peak(concrete).peak_bytes == grappler_peak(concrete.graph).peak_bytes

    with graph.as_default():
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.TRAIN_OP, graph.get_tensor_by_name("t:0")
        )
    assert grappler_peak(graph).fetches == ("t",)  # a TRAIN_OP collection wins over sinks


def test_placement_host_ops_stay_on_cpu_everything_else_goes_to_gpu(devices):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        with tf.device(devices.compute):
            h = tf.nn.relu(x, name="h")
        with tf.device(devices.host):
            out = tf.identity(h, name="out")
        with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
            out2 = tf.identity(out, name="out2")
        back = tf.identity(out2, name="back")
        protect(out, out2, back)
        tf.reduce_sum(back, name="y")

    placed = {n.name: n.device for n in grappler_optimize(graph, optimizers=["dependency"]).node}

    assert placed["h"] == placed["back"] == placed["x"] == GPU
    assert placed["out"] == placed["out2"] == CPU


def test_keras_cnn_training_step():
    step = keras_cnn_step(batch=None)

    peak = grappler_peak(step.graph, batch_size=64)

    conv1 = 64 * 30 * 30 * 16 * 4
    assert peak.live_tensors[0].bytes == conv1
    assert len(big(peak, conv1)) == 3  # conv1 output, its MaxPoolGrad and ReluGrad
    assert 3 * conv1 < peak.peak_bytes < 5 * conv1 and peak.fits
    types = {op.name: op.type for op in step.graph.get_operations()}
    assert "AssignSubVariableOp" in {types[name] for name in peak.fetches}  # the update ran
    assert not grappler_peak(step.graph, batch_size=64, gpu_memory_bytes=peak.peak_bytes).fits
    optimized = grappler_peak(grappler_optimize(step.graph, batch_size=64))
    assert optimized.variable_bytes == peak.variable_bytes
    assert 3 * conv1 < optimized.peak_bytes < 5 * conv1


# --------------------------------------------------------------------------- optimize


def swap_pattern(mark: bool, trigger: bool) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        h = tf.nn.relu(x, name="h")
        with tf.device(CPU):
            out = tf.identity(h, name="lms/swapout_h")
        u = tf.sigmoid(tf.tanh(h), name="u")
        with tf.control_dependencies([u] if trigger else []):
            back = tf.identity(out, name="lms/swapin_h")
        tf.reduce_sum(u * back, name="y")
        if mark:
            protect(out, back)
    return graph


@pytest.mark.parametrize("trigger", [False, True])
def test_swap_identities_survive_grappler_only_when_marked(trigger):
    removed = grappler_optimize(swap_pattern(mark=False, trigger=trigger))
    kept = grappler_optimize(swap_pattern(mark=True, trigger=trigger))

    # The dependency optimizer drops Identity ops even across devices.
    assert not [n.name for n in removed.node if n.name.startswith("lms/")]
    nodes = {n.name: n for n in kept.node}
    assert nodes["lms/swapout_h"].device == CPU and nodes["lms/swapout_h"].input == ["h"]
    expected = ["lms/swapout_h"] + (["^u"] if trigger else [])
    assert nodes["lms/swapin_h"].device == GPU and list(nodes["lms/swapin_h"].input) == expected
    only_dependency = grappler_optimize(
        swap_pattern(mark=False, trigger=trigger), optimizers=["dependency"]
    )
    assert not [n.name for n in only_dependency.node if n.name.startswith("lms/")]


def test_optimize_inlines_function_calls_that_peak_treats_as_one_op(caplog):
    @tf.function
    def inner(x):
        return tf.nn.relu(x, name="inner_relu") * 3.0

    @tf.function
    def outer(x):
        return tf.reduce_sum(inner(x) + 1.0)

    graph = outer.get_concrete_function(tf.TensorSpec([BATCH, WIDTH])).graph
    assert "PartitionedCall" in {op.type for op in graph.get_operations()}
    with caplog.at_level(logging.WARNING, logger="tflms.simulation.grappler"):
        grappler_peak(graph)
    assert "simulates 1 op(s) as one op each, not their bodies (PartitionedCall" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tflms.simulation.grappler"):
        optimized = grappler_optimize(graph)  # inlines: nothing to warn about
    assert "as one op" not in caplog.text

    assert "PartitionedCall" not in {n.op for n in optimized.node}
    assert any(n.name.endswith("inner_relu") for n in optimized.node)
    assert grappler_peak(optimized).peak_bytes >= 3 * BATCH * WIDTH * 4


def test_optimize_handles_graphs_below_grappler_minimum_size():
    graph = tf.Graph()
    with graph.as_default():
        tf.negative(tf.identity(tf.compat.v1.placeholder(tf.float32, [4], name="x"), "copy"), "y")

    # Grappler skips graphs of fewer than 4 nodes unless min_graph_nodes=-1.
    assert [n.name for n in grappler_optimize(graph).node] == ["x", "y"]
    untouched = grappler_optimize(graph, config=tf.compat.v1.ConfigProto())
    assert [n.name for n in untouched.node] == ["x", "copy", "y"]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("function", [grappler_peak, grappler_optimize])
def test_not_a_graph_and_empty_graph_are_unsupported(function):
    with pytest.raises(UnsupportedGraphError, match=r"Received a int: 42.*get_concrete_function"):
        function(42)
    with pytest.raises(UnsupportedGraphError, match="no nodes"):
        function(tf.Graph())
    with pytest.raises(UnsupportedGraphError, match="no nodes"):
        function(tf.compat.v1.GraphDef())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fetches": ["nope"]}, r"fetches \['nope'\] are not nodes of the graph"),
        ({"fetches": "nope:0"}, r"fetches \['nope'\]"),
        ({"fetches": []}, "fetches nothing"),
        ({"fetches": [3]}, "Received 3"),
        ({"device": "/device:CPU:1"}, "device must name a GPU device"),
        ({"host_device": "/device:GPU:1"}, "host_device must name a CPU device"),
        ({"device": "gpu zero"}, "is not a device name"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"input_shapes": {"z": [1]}}, r"input_shapes names \['z'\]"),
        ({"slowdown": 0}, "slowdown must be an int >= 1"),
    ],
)
def test_bad_options_raise_config_errors(kwargs, message):
    graph = identity_graph(False, None)
    with pytest.raises(ConfigError, match=message) as caught:
        grappler_peak(graph, **kwargs)
    assert isinstance(caught.value, TFLMSError)


def test_a_graph_larger_than_the_device_is_reported_as_not_fitting():
    @tf.function
    def step(x):
        return tf.reduce_sum(tf.nn.relu(x) * 2.0)

    graph = step.get_concrete_function(tf.TensorSpec([None, 1024])).graph
    peak = grappler_peak(graph, batch_size=512, gpu_memory_bytes=1 << 20)  # 1 MiB device
    assert not peak.fits and peak.peak_bytes // (512 * 1024 * 4) == 3  # x, relu(x), the product
