"""tflms.simulate against peaks derived by hand on tiny graphs.

The graphs are built directly as analysis views (as the planner's own tests
do), so every tensor has an exact, known size and nothing else is live.
Unless a test is about copy timing, copies use the ``ideal`` link.
"""

from __future__ import annotations

import json

import networkx as nx
import pytest

from tflms import simulate
from tflms.apply.core import apply_to_view
from tflms.cost.hardware import LinkModel, get_device
from tflms.cost.ops import op_cost
from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.graph.grappler_rules import removed_at_run_time
from tflms.graph.view import TensorInfo, assign_levels
from tflms.plan.swap_plan import Swap, SwapIn, SwapPlan
from tflms.plan.triggers import trigger_filter
from tflms.simulation import native
from tflms.simulation.memory import trace_memory
from tflms.simulation.schedule import compile_view, first_ready

A = 4 << 20  # one activation: 4 MiB, so every op lasts a few microseconds


def tensor(name: str, nbytes: int, dtype: str = "float32") -> TensorInfo:
    cols = 256
    return TensorInfo(f"{name}:0", 0, dtype, (max(1, nbytes // 4 // cols), cols), nbytes)


OP = "Transpose"
"""Default op type: memory-bound like an element-wise op, but its kernel never writes
into its input's buffer, so every output is a fresh buffer (tests of buffer reuse
use element-wise types explicitly)."""


def make_view(nodes, edges, controls=(), name="hand"):
    """``nodes``: (name, bytes or None[, type]); ``edges``: (src, dst, input index)."""
    view = nx.DiGraph(name=name)
    for spec in nodes:
        op, nbytes, op_type = (*spec, OP)[:3]
        outputs = () if nbytes is None else (tensor(op, nbytes),)
        if op_type == "VarHandleOp":
            outputs = (TensorInfo(f"{op}:0", 0, "resource", (), 0),)
        view.add_node(
            op,
            type=op_type,
            device="",
            placement="compute",
            outputs=outputs,
            control_flow=False,
            functions=(),
            stateful=False,
            tflms=None,
        )
    for src, dst, in_idx in edges:
        view.add_edge(src, dst, tensors=[(0, in_idx)], control=False)
    for src, dst in controls:
        view.add_edge(src, dst, tensors=[], control=True)
    assign_levels(view)
    return view


def chain(n: int, nbytes: int = A):
    nodes = [(f"op{i}", nbytes) for i in range(n)]
    edges = [(f"op{i - 1}", f"op{i}", 0) for i in range(1, n)]
    return nodes, edges


def training_chain(layers: int, size: int = A):
    """x -> f1..fL -> bL..b1; b_i reads f_i and b_(i+1) (bL reads fL twice); ``size`` bytes each."""
    nodes = [("x", size)] + [(f"f{i}", size) for i in range(1, layers + 1)]
    nodes += [(f"b{i}", size) for i in range(layers, 0, -1)]
    edges = [("x", "f1", 0)] + [(f"f{i - 1}", f"f{i}", 0) for i in range(2, layers + 1)]
    edges += [(f"f{layers}", f"b{layers}", 0)]
    edges += [(f"b{i + 1}", f"b{i}", 0) for i in range(1, layers)]
    edges += [(f"f{i}", f"b{i}", 1) for i in range(1, layers)]
    return make_view(nodes, edges, name="training_chain")


def swap_f1(view, trigger: str) -> SwapPlan:
    swap_in = SwapIn(
        consumers=(("b1", 1),),
        trigger=trigger,
        trigger_level=view.nodes[trigger]["level"],
        consumer_level=view.nodes["b1"]["level"],
    )
    swap = Swap(
        tensor="f1:0",
        producer="f1",
        index=0,
        bytes=A,
        dtype="float32",
        producer_level=view.nodes["f1"]["level"],
        device="",
        swap_ins=(swap_in,),
    )
    return SwapPlan(swaps=(swap,), graph_name=view.graph["name"])


# --------------------------------------------------------------------------- chains


def test_chain_peaks_at_two_tensors():
    result = simulate(make_view(*chain(6)), link="ideal", accounting="tensors")

    # op_i runs with its input alive and its output allocated: 2 A, first reached by op1.
    assert result.device_peak_bytes == 2 * A
    assert result.peak_op == "op1"
    assert result.host_peak_bytes == 0
    assert result.timeline_ops[0] == "op0" and result.timeline_device[0] == A
    assert len(result.timeline_ops) == 6


def test_chain_with_a_long_skip_keeps_the_skipped_tensor():
    nodes, edges = chain(6)
    edges.append(("op1", "op5", 1))

    result = simulate(make_view(nodes, edges), link="ideal", accounting="tensors")

    assert result.device_peak_bytes == 3 * A  # op1 lives until op5 ends
    assert result.peak_op == "op3"


def test_grappler_accounting_keeps_the_dying_input_for_one_more_op():
    # Grappler frees a buffer 1 ns after its last consumer ends, so the next op's
    # output overlaps it: 3 A where TensorFlow's allocator needs 2 A.
    result = simulate(make_view(*chain(6)), link="ideal", accounting="grappler")

    assert result.device_peak_bytes == 3 * A


def test_diamond_peak_is_the_widest_cut():
    a, b, c, d = A, 2 * A, 3 * A, 5 * A
    view = make_view(
        [("a", a), ("b", b), ("c", c), ("d", d)],
        [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 1)],
    )

    result = simulate(view, link="ideal", accounting="tensors")

    # FirstReady runs b before c (name order); a dies with c; at d: b, c and d.
    assert [n for n in result.timeline_ops] == ["a", "b", "c", "d"]
    assert result.device_peak_bytes == max(a + b + c, b + c + d) == b + c + d
    assert result.peak_op == "d"


def test_diamond_with_the_wide_branch_first():
    view = make_view(
        [("a", 4 * A), ("b", A), ("c", A), ("d", A)],
        [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 1)],
    )

    result = simulate(view, link="ideal", accounting="tensors")

    assert result.device_peak_bytes == 4 * A + A + A  # a, b and c while c runs
    assert result.peak_op == "c"


# --------------------------------------------------------------------------- training chain and swaps


@pytest.mark.parametrize("layers", [4, 6])
def test_training_chain_keeps_every_activation(layers):
    result = simulate(training_chain(layers), link="ideal", accounting="tensors")

    # At b_L: f1..fL (all still needed) and b_L: (L + 1) A.
    assert result.device_peak_bytes == (layers + 1) * A
    assert result.peak_op == f"b{layers}"


@pytest.mark.parametrize("layers", [4, 6])
def test_swapping_the_first_activation_saves_it(layers):
    view = training_chain(layers)
    plan = swap_f1(view, trigger="b3")

    result = simulate(view, plan, link="ideal", accounting="tensors")

    # f1 leaves the device once f2 and the swap-out are done: L A at b_L; it
    # comes back when b3 has finished (4 A at b2: f1', f2, b3, b2).
    assert result.device_peak_bytes == layers * A
    assert result.baseline.device_peak_bytes == (layers + 1) * A
    assert result.host_peak_bytes == A
    assert (result.bytes_swapped_out, result.bytes_swapped_in) == (A, A)
    assert (result.swap_outs, result.swap_ins) == (1, 1)
    assert result.overhead == pytest.approx(0.0, abs=1e-4)  # a few 1 ns dispatch slots


def test_swap_in_without_a_late_trigger_saves_nothing():
    view = training_chain(4)
    # Triggered by f2, the swap-in runs right away in the forward pass.
    result = simulate(view, swap_f1(view, trigger="f2"), link="ideal", accounting="tensors")

    assert result.device_peak_bytes == 5 * A


def test_slow_link_delays_frees_and_consumers():
    view = training_chain(4)
    slow = LinkModel("slow", bandwidth=A / 0.5, latency_s=0.0)  # 0.5 s per copy
    plan = swap_f1(view, trigger="b3")

    result = simulate(view, plan, link=slow, accounting="tensors")

    # The swap-out is still copying while the forward pass ends: f1 stays on
    # the device until it is done, so nothing is saved; b1 waits for the
    # swap-in, which waits for the swap-out: the step takes both copies.
    assert result.device_peak_bytes == 5 * A
    # the two copies, plus at most the (sub-millisecond) compute they do not hide
    assert result.step_time_s == pytest.approx(1.0, abs=result.compute_time_s)
    # A bytes at A / 0.5 s each way
    assert result.copy_time_s == {"d2h": pytest.approx(0.5), "h2d": pytest.approx(0.5)}
    assert result.overhead > 100
    # the same op times, summed in another order (Python floats)
    assert result.compute_time_s == pytest.approx(result.baseline.compute_time_s)


def test_copies_overlap_with_compute():
    view = training_chain(6)
    plan = swap_f1(view, trigger="b5")
    compute = simulate(view, link="ideal", accounting="tensors").step_time_s
    link = LinkModel("fast-enough", bandwidth=A / (compute / 10), latency_s=0.0)

    result = simulate(view, plan, link=link, accounting="tensors")

    assert result.step_time_s == pytest.approx(compute, rel=1e-4)  # fully hidden


def test_a_rewritten_view_simulates_as_the_plan():
    view = training_chain(4)
    plan = swap_f1(view, trigger="b3")

    direct = simulate(apply_to_view(view, plan), link="ideal", accounting="tensors")

    assert (
        direct.device_peak_bytes
        == simulate(view, plan, link="ideal", accounting="tensors").device_peak_bytes
    )
    assert direct.baseline is None and direct.overhead == 0.0


# --------------------------------------------------------------------------- variables and aliases


def test_variables_are_resident_and_reads_alias_them():
    w = 3 * A
    view = make_view(
        [("w", None, "VarHandleOp"), ("read", w, "ReadVariableOp"), ("x", A), ("mm", A, "MatMul")]
        + [("out", A)],
        [("w", "read", 0), ("x", "mm", 0), ("read", "mm", 1), ("mm", "out", 0)],
    )

    result = simulate(view, link="ideal", accounting="tensors")

    assert result.variable_bytes == w
    assert result.device_peak_bytes == w + 2 * A  # x and mm at mm, mm and out at out
    assert min(result.timeline_device) >= w


def test_identity_and_reshape_share_their_input_buffer():
    view = make_view(
        [("a", A), ("ident", A, "Identity"), ("shaped", A, "Reshape"), ("b", A)],
        [("a", "ident", 0), ("ident", "shaped", 0), ("shaped", "b", 0)],
    )

    assert simulate(view, link="ideal", accounting="tensors").device_peak_bytes == 2 * A
    assert simulate(view, link="ideal", accounting="grappler").device_peak_bytes > 2 * A


def identity_n_view():
    """Two gradients through one IdentityN to their updates; g1 is ready long before g2."""
    view = make_view(
        [("g1", A), ("x1", A), ("x2", A), ("g2", A), ("idn", A, "IdentityN"), ("u1", A), ("u2", A)],
        [("g1", "x1", 0), ("x1", "x2", 0), ("x2", "g2", 0), ("g1", "idn", 0), ("g2", "idn", 1)],
    )
    view.nodes["idn"]["outputs"] = (tensor("idn", A), tensor("idn", A)._replace(index=1))
    view.add_edge("idn", "u1", tensors=[(0, 0)], control=False)
    view.add_edge("idn", "u2", tensors=[(1, 0)], control=False)
    assign_levels(view)
    return view


def test_identity_n_is_bypassed_as_grappler_removes_it():
    view = identity_n_view()
    bypassed = compile_view(view, device="V100-16GB", link="ideal")
    kept = compile_view(view, device="V100-16GB", link="ideal", bypass_identity_n=False)
    for graph, u1_before_g2 in ((bypassed, True), (kept, False)):
        start = first_ready(graph).start
        at = {name: start[i] for i, name in enumerate(graph.names)}
        assert (at["u1"] < at["g2"]) is u1_before_g2
    assert bypassed.inputs[bypassed.names.index("idn")] == []
    # u1 frees g1 at once instead of holding it while the chain up to g2 runs
    assert simulate(view, link="ideal", accounting="tensors").device_peak_bytes == 2 * A
    held = trace_memory(kept, first_ready(kept), accounting="tensorflow")
    assert held.device_peak == 3 * A


def test_identity_n_with_a_control_edge_or_behind_another_is_handled():
    # a control edge into the node: Grappler may keep it, so the simulator keeps it too
    view = identity_n_view()
    view.add_node("late", **{**view.nodes["x2"], "outputs": (tensor("late", A),)})
    view.add_edge("x2", "late", tensors=[(0, 0)], control=False)
    view.add_edge("late", "idn", tensors=[], control=True)
    assign_levels(view)
    assert not removed_at_run_time(view, "idn")
    kept = compile_view(view, device="V100-16GB", link="ideal")
    assert kept.inputs[kept.names.index("idn")] != []
    # an IdentityN reading another IdentityN, the outer one compiled first: both
    # bypassed, u1 reads g1 directly
    view = make_view(
        [("g1", A), ("x1", A), ("x2", A), ("g2", A), ("outer", A, "IdentityN")]
        + [("inner", A, "IdentityN"), ("u1", A), ("u2", A)],
        [("g1", "x1", 0), ("x1", "x2", 0), ("x2", "g2", 0), ("g1", "inner", 0), ("g2", "inner", 1)],
    )
    for name in ("outer", "inner"):
        view.nodes[name]["outputs"] = (tensor(name, A), tensor(name, A)._replace(index=1))
    view.add_edge("inner", "outer", tensors=[(0, 0), (1, 1)], control=False)
    view.add_edge("outer", "u1", tensors=[(0, 0)], control=False)
    view.add_edge("outer", "u2", tensors=[(1, 0)], control=False)
    assign_levels(view)
    graph = compile_view(view, device="V100-16GB", link="ideal")
    u1 = graph.names.index("u1")
    assert [graph.names[p] for p, _, _ in graph.inputs[u1]] == ["g1"]
    assert simulate(view, link="ideal", accounting="tensors").device_peak_bytes == 2 * A


def test_an_identity_n_grappler_removes_never_triggers_a_swap_in():
    view = identity_n_view()
    assert not trigger_filter(view)("idn")
    assert trigger_filter(view)("x2")


def test_an_elementwise_op_writes_into_its_dying_input():
    nodes = [("x", A, "Placeholder")] + [(f"r{i}", A, "Relu") for i in range(5)]
    edges = [("x", "r0", 0)] + [(f"r{i - 1}", f"r{i}", 0) for i in range(1, 5)]
    # x is an argument (its caller holds it): r0 cannot reuse it; r1..r4 reuse r0's buffer
    assert (
        simulate(make_view(nodes, edges), link="ideal", accounting="tensors").device_peak_bytes
        == 2 * A
    )
    edges.append(("r1", "r4", 1))  # r1 is read later: r2 cannot reuse it, r3 and r4 reuse r2's
    reused = simulate(make_view(nodes, edges), link="ideal", accounting="tensors")
    assert reused.device_peak_bytes == 2 * A  # x died with r0; r1 and r2..r4
    assert dict(zip(reused.timeline_ops, reused.timeline_device, strict=True))["r2"] == 2 * A
    fresh = simulate(make_view(nodes, edges), link="ideal", accounting="grappler")
    assert fresh.device_peak_bytes > 2 * A


def test_a_cross_entropys_backprop_takes_the_logits_buffer():
    """TensorFlow's (Sparse)SoftmaxCrossEntropyWithLogits kernels write their second output,
    the backprop, into the logits' buffer when nothing else reads the logits: a language
    model's loss holds one logits-sized tensor, not two (measured on bench_remat's GPT
    stack: 64 MiB allocated for the logits, none for the backprop)."""
    view = make_view(
        [("h", A // 8, "Placeholder"), ("labels", 64, "Placeholder"),
         ("logits", A, "MatMul"), ("xent", 64, "SparseSoftmaxCrossEntropyWithLogits"),
         ("dh", A // 8, "MatMul")],
        [("h", "logits", 0), ("logits", "xent", 0), ("labels", "xent", 1)],
    )  # fmt: skip
    view.nodes["xent"]["outputs"] = (tensor("xent", 64), TensorInfo("xent:1", 1, "float32",
                                     (A // 4 // 256, 256), A))  # fmt: skip
    view.add_edge("xent", "dh", tensors=[(1, 0)], control=False)
    assign_levels(view)
    one = simulate(view, link="ideal", accounting="tensors").device_peak_bytes
    assert one < 2 * A, one
    view.add_node("keep", **{**view.nodes["dh"], "type": "Relu"})  # the logits read later
    view.add_edge("logits", "keep", tensors=[(0, 0)], control=False)
    view.add_edge("dh", "keep", tensors=[], control=True)
    assign_levels(view)
    assert simulate(view, link="ideal", accounting="tensors").device_peak_bytes >= 2 * A


def test_buffers_are_reused_only_when_size_dtype_and_readers_allow():
    half = TensorInfo("h:0", 0, "float16", (A // 2 // 256, 256), A // 2)
    view = make_view(
        [("x", A), ("a", A, "Relu"), ("c", A // 2, "Relu")], [("x", "a", 0), ("a", "c", 0)]
    )
    view.nodes["c"]["outputs"] = (half,)  # another size and dtype: a fresh buffer
    assert (
        simulate(view, link="ideal", accounting="tensors").device_peak_bytes == A + A + A // 2 - A
    )  # x died at a
    # a swap-out still copying holds a reference: no reuse until the copy is done
    slow = LinkModel("slow", bandwidth=A / 1e-3)
    nodes = [("x", A), ("a", A, "Relu"), ("b", A, "Relu"), ("c", A, "Relu")]
    view = make_view(nodes, [("x", "a", 0), ("a", "b", 0), ("b", "c", 0), ("a", "c", 1)])
    plan = SwapPlan(
        swaps=(Swap("a:0", "a", 0, A, "float32", 1, "", (SwapIn((("c", 1),), trigger="b"),)),),
    )
    fast = simulate(view, plan, link="ideal", baseline=False, accounting="tensors")
    slowed = simulate(view, plan, link=slow, baseline=False, accounting="tensors")
    at_b = {
        r.link: dict(zip(r.timeline_ops, r.timeline_device, strict=True))["b"]
        for r in (fast, slowed)
    }
    assert at_b == {"ideal": A, "slow": 2 * A}  # b reuses a only once a's copy is done


# --------------------------------------------------------------------------- time model


def test_convolution_and_matmul_flops():
    dev = get_device("V100-16GB")
    x = TensorInfo("x:0", 0, "float32", (8, 32, 32, 16), 8 * 32 * 32 * 16 * 4)
    k = TensorInfo("k:0", 0, "float32", (3, 3, 16, 64), 3 * 3 * 16 * 64 * 4)
    y = TensorInfo("y:0", 0, "float32", (8, 32, 32, 64), 8 * 32 * 32 * 64 * 4)
    conv = op_cost("Conv2D", [x, k], [y], dev)
    assert conv.flops == 2 * 8 * 32 * 32 * 64 * 3 * 3 * 16 and conv.dense
    sizes = TensorInfo("s:0", 0, "int32", (4,), 16)
    assert op_cost("Conv2DBackpropInput", [sizes, k, y], [x], dev).flops == conv.flops
    assert op_cost("Conv2DBackpropFilter", [x, sizes, y], [k], dev).flops == conv.flops
    a = TensorInfo("a:0", 0, "float32", (128, 512), 128 * 512 * 4)
    b = TensorInfo("b:0", 0, "float32", (512, 256), 512 * 256 * 4)
    c = TensorInfo("c:0", 0, "float32", (128, 256), 128 * 256 * 4)
    assert op_cost("MatMul", [a, b], [c], dev).flops == 2 * 128 * 512 * 256
    relu = op_cost("Relu", [y], [y], dev)
    bandwidth = dev.memory_bandwidth * dev.memory_efficiency
    # the cost model's formula, to the rounding of its Python floats
    assert relu.seconds == pytest.approx(dev.kernel_overhead_s + 2 * y.bytes / bandwidth)
    assert op_cost("Reshape", [y], [y], dev).seconds < 1e-6


def test_faster_device_is_faster():
    view = training_chain(4)
    v100 = simulate(view, device="V100-16GB", accounting="tensors").step_time_s
    h100 = simulate(view, device="H100-80GB", accounting="tensors").step_time_s
    assert h100 < v100


# --------------------------------------------------------------------------- export and errors


def test_json_export_round_trips(tmp_path):
    view = training_chain(4)
    result = simulate(view, swap_f1(view, trigger="b3"), link="nvlink2", accounting="tensors")
    path = tmp_path / "result.json"

    result.save_json(path)
    data = json.loads(path.read_text())

    assert data["simulated"] is True and "FirstReady" in data["simulator"]
    assert data["device_peak_bytes"] == result.device_peak_bytes
    assert data["link"] == "nvlink2" and data["device"] == "V100-16GB"
    assert len(data["timeline"]["ops"]) == len(result.timeline_ops)
    assert data["baseline"]["device_peak_bytes"] == 5 * A
    assert "timeline" not in json.loads(result.to_json(timeline=False))
    assert "device peak" in result.summary()


def test_plot_writes_a_png(tmp_path):
    view = training_chain(6)
    result = simulate(view, swap_f1(view, trigger="b3"), link="pcie3", accounting="tensors")
    path = tmp_path / "plots" / "timeline.png"

    result.plot(path, budget_bytes=6 * A, title="training chain")

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "P100"}, "Unknown device model 'P100'"),
        ({"link": "usb2"}, "Unknown link model 'usb2'"),
        ({"accounting": "exact"}, "accounting must be one of"),
        ({"plan": "f1"}, "plan must be a tflms.SwapPlan"),
    ],
)
def test_bad_arguments_raise_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        simulate(training_chain(2), **kwargs)


@pytest.mark.skipif(not native.COMPILED, reason="kernels not built (no C compiler)")
def test_compiled_first_ready_is_the_python_schedule_to_the_bit():
    import dataclasses
    import random

    import tflms
    from tflms import zoo

    view = tflms.analyze(zoo.resnet50(64), batch_size=8)
    plan = tflms.make_plan(view, tflms.LMSConfig(swapout_threshold=4, recompute=True))
    rewritten = apply_to_view(view, plan)
    rng = random.Random(3)
    for graph_view in (view, rewritten):
        for link in ("pcie3", "ideal"):
            graph = compile_view(graph_view, device="V100-16GB", link=link)
            if graph_view is rewritten:  # swap-ins: dispatched by the compute stream
                assert "h2d" in graph.lanes
            graphs = [graph]
            for _ in range(5):  # many equal ready times: ties go by name rank in both
                durations = [
                    rng.choice([0.0, 1e-6, 2e-6, rng.random() * 1e-3]) for _ in graph.names
                ]
                graphs.append(dataclasses.replace(graph, durations=durations, derived={}))
            for g in graphs:
                fast, reference = first_ready(g, compiled=True), first_ready(g, compiled=False)
                assert fast == reference
                assert list(fast.lanes) == list(reference.lanes)  # lanes in first-use order


def test_a_cycle_is_reported_by_both_schedulers():
    view = nx.DiGraph(name="loop")
    info = TensorInfo("a:0", 0, "float32", (4,), 16)
    for name in ("a", "b"):
        view.add_node(
            name,
            type="Relu",
            device="",
            placement="compute",
            outputs=(info._replace(name=f"{name}:0"),),
            control_flow=False,
            functions=(),
            stateful=False,
            tflms=None,
        )
    view.add_edge("a", "b", tensors=[(0, 0)], control=False)
    view.add_edge("b", "a", tensors=[(0, 0)], control=False)
    graph = compile_view(view, device="V100-16GB", link="pcie3")
    for compiled in {False, native.COMPILED}:
        with pytest.raises(UnsupportedGraphError, match="never become ready"):
            first_ready(graph, compiled=compiled)


@pytest.mark.parametrize("decay_waits", [False, True])
def test_a_weight_updated_while_its_read_is_held_is_copied(decay_waits):
    """A decay that waits for nothing (Keras's ``var.assign_sub(var * lr * wd)``) writes
    the weight while the forward pass's read still holds its buffer for the backward pass:
    TensorFlow copies it, and the old value lives until the weight's backward reader ends.
    A decay made after the gradient finds the buffer free."""
    import tensorflow as tf

    import tflms

    w = tf.Variable(tf.ones((256, 1024)))  # 1 MiB

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w))
            loss = tf.reduce_sum(tf.tanh(tf.matmul(h, w, transpose_b=True)))
        (g,) = tape.gradient(loss, [w])
        with tf.control_dependencies([g] if decay_waits else []):
            w.assign_sub(w * 0.01)
        w.assign_sub(0.1 * g)
        return loss

    graph = step.get_concrete_function(tf.TensorSpec((512, 256), tf.float32)).graph
    result = simulate(tflms.build_view(graph), link="ideal", accounting="tensors")
    copies = [b for b in result.live_at_peak if "the value before" in b.tensor]
    if decay_waits:
        assert copies == []
    else:
        (copy,) = copies
        assert copy.bytes == 1 << 20 and "AssignSubVariableOp" in copy.tensor
