"""Segments of the forward pass re-run from checkpoints (tflms.plan.segments), and the gates
that let Grappler optimize recompute clones as it optimizes their originals."""

from __future__ import annotations

from pathlib import Path

import keras
import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import tflms
from benchmarks.remat_models import batch, build
from tests.tflms.models import measured_in_a_fresh_process, tape_step
from tflms.apply.core import apply_plan, apply_with
from tflms.apply.proto_editor import ProtoEditor
from tflms.errors import ConfigError
from tflms.graph.view import TensorInfo, assign_levels
from tflms.plan.phases import turn_level
from tflms.plan.recompute import make_group
from tflms.plan.segments import forward_cuts, plan_segments
from tflms.plan.triggers import trigger_filter
from tflms.simulation.grappler.optimize import grappler_optimize
from tflms.simulation.grappler.rewrites import compare_rewrites

ROOT = Path(__file__).resolve().parents[2]
SEGMENTS = dict(
    swap=False, recompute=True, recompute_segments=2, swapout_threshold=2, min_tensor_bytes=0
)


def _train(family, devices, config, *, steps=3, blocks=2):
    """Weights after ``steps`` AdamW steps of a custom loop, and the step (tflms or plain)."""
    model = build(family, False, blocks=blocks)
    optimizer = keras.optimizers.AdamW(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    step = tape_step(model, optimizer, loss_fn)
    fn = tflms.function(step, config=config) if config is not None else tf.function(step)
    with tf.device(devices.compute):
        x, y = (tf.constant(a) for a in batch(family))
        for _ in range(steps):
            fn(x, y)
    return [w.numpy() for w in model.weights], fn, (x, y)


def test_cuts_are_the_residual_stream_between_blocks(devices):
    _, fn, args = _train("gpt", devices, None, steps=1)
    view = tflms.build_view(fn.get_concrete_function(*args).graph)
    cuts = forward_cuts(view, turn_level(view))
    # each block's two residual sums (after attention, after the MLP); then the head's
    blocks = [op.rsplit("/", 1)[-1] for op, _ in cuts if "/block" in op]
    assert blocks == ["add", "add_1", "add", "add_1"], cuts
    assert view.nodes[cuts[0][0]]["type"] == "GatherV2", cuts  # the embedding's output


@pytest.mark.parametrize(("family", "every"), [("gpt", 2), ("cnn", 4)])  # a block's cuts
def test_segments_train_bitwise_and_rerun_whole_blocks(family, every, devices):
    plain, _, _ = _train(family, devices, None)
    config = tflms.LMSConfig(**{**SEGMENTS, "recompute_segments": every})
    weights, fn, args = _train(family, devices, config)
    plan = fn.plan_for(*args)
    for a, b in zip(plain, weights, strict=True):
        assert a.tobytes() == b.tobytes(), plan.summary()
    assert plan.notes[-1].startswith("Grappler rewrites the step alike"), plan.notes[-1]
    dense = {"MatMul", "BatchMatMulV2", "Einsum", "Conv2D"}
    view = tflms.build_view(fn.get_concrete_function(*args).graph)  # rewritten: originals kept
    reruns = [{view.nodes[op]["type"] for op in r.ops} & dense for r in plan.recomputes]
    assert sum(bool(kinds) for kinds in reruns) >= 2, plan.summary()  # a block per group


def test_checkpoints_counted_from_the_phase_that_reruns_less(devices):
    """Every second cut of a transformer stack: the residual stream after each block is
    kept (each segment re-runs the attention's output projection to rebuild the stream
    after the attention), not the stream after each attention (each segment would re-run
    the MLP's down projection, four times the multiply-adds), as RematScope re-runs a block.
    """
    _, fn, args = _train("gpt", devices, None, steps=1)
    view = tflms.build_view(fn.get_concrete_function(*args).graph)
    config = tflms.LMSConfig(**SEGMENTS)
    groups = plan_segments(view, config, config.target())
    cuts = forward_cuts(view, turn_level(view))[:5]  # the embedding's output, 2 per block
    rerun = [any(op in g.ops for g in groups) for op, _ in cuts]
    assert rerun == [False, True, False, True, False], cuts  # kept: the blocks' outputs
    mlp = [op for g in groups for op in g.ops if view.nodes[op]["type"] == "MatMul"]
    assert len(mlp) == 2, mlp  # the up projection of each of the 2 blocks, not the down one


def test_clones_behind_gates_are_fused_like_their_originals():
    """Grappler fuses a recomputed MatMul + BiasAdd + ReLU as it fuses the original; the
    clones are kept apart from the originals by their gate alone."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (64, 256), name="x")
        w = tf.constant(np.full((256, 256), 0.01, np.float32))
        b = tf.constant(np.full((256,), 0.1, np.float32))
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w, name="mm"), b, name="ba"), name="relu")
        y = tf.matmul(h, w, name="next")
        for i in range(8):
            y = tf.tanh(y, name=f"t{i}")
        tf.reduce_sum(tf.multiply(y, h, name="late"), name="out")
    view = tflms.build_view(graph)
    levels = nx.get_node_attributes(view, "level")
    config = tflms.LMSConfig(recompute=True, swapout_threshold=4, min_tensor_bytes=0)
    memo = {op: (True, 0.0) for op in ("mm", "ba", "relu")}
    group = make_group(view, ["mm", "ba", "relu"], levels, config, trigger_filter(view), memo)
    assert group is not None and group.gates == (("x", 0),)
    apply_plan(graph, tflms.SwapPlan(recomputes=(group,), config=config))
    nodes = {n.name: n for n in graph.as_graph_def().node}
    gate = nodes[group.gate_name(0)]
    assert gate.attr["_grappler_do_not_remove"].b and f"^{group.trigger}" in gate.input
    assert not any(nodes[c].attr["_grappler_do_not_remove"].b for c in group.clone_names)
    optimized = grappler_optimize(
        graph.as_graph_def(), fetches=["out"], device="/device:CPU:0", host_device="/device:CPU:0"
    )
    ops = {n.name: (n.op, [i for i in n.input if not i.startswith("^")]) for n in optimized.node}
    clone = group.clone_name("relu")
    assert ops["relu"][0] == ops[clone][0] == "_FusedMatMul", ops
    assert ops[clone][1][0] == group.gate_name(0)  # not merged with the original


def test_holds_keep_the_forward_pass_as_grappler_rewrites_it(devices):
    """GELU's ``0.5 * x`` is read by the GELU's product and by its gradient. Once the
    gradient reads the clone, the original has one reader and Grappler's arithmetic
    optimizer moves the constant into the product: the forward pass computes otherwise.
    Its hold keeps the second reader: the check agrees at once, nothing pinned, and the
    same plan without its holds is rewritten apart."""
    model = build("gpt", False, blocks=2)
    step = tf.function(
        tape_step(
            model,
            keras.optimizers.AdamW(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    )
    with tf.device(devices.compute):
        x, y = (tf.constant(a) for a in batch("gpt"))
        graph = step.get_concrete_function(x, y).graph
    plan = tflms.LMS(**SEGMENTS, device=devices.compute).plan(graph)
    assert plan.notes[-1].endswith("(1 round(s), 0 op(s) pinned)"), plan.notes[-1]
    halves = [t for r in plan.recomputes for t in r.tensors if t.endswith("Gelu/mul:0")]
    assert halves, plan.summary()
    holds = {r.hold_name(i) for r in plan.recomputes for i in range(len(r.held))}
    original, rewritten = graph.as_graph_def(), graph.as_graph_def()
    apply_with(ProtoEditor(rewritten), plan)
    nodes = {n.name: n for n in rewritten.node}
    for r in plan.recomputes:
        for i, (op, k) in enumerate(r.held):
            hold = nodes[r.hold_name(i)]
            assert hold.op == "Identity" and hold.attr["_grappler_do_not_remove"].b
            assert list(hold.input) == [f"{op}:{k}" if k else op]
    without = type(rewritten)()
    for node in rewritten.node:
        if node.name not in holds:
            kept = without.node.add()
            kept.CopyFrom(node)
            del kept.input[:]
            kept.input.extend(i for i in node.input if i.lstrip("^") not in holds)
    without.library.CopyFrom(rewritten.library)
    fetches = [t.op.name for t in graph.outputs] + [op.name for op in graph.control_outputs]
    check = dict(fetches=fetches, device="/device:CPU:0")
    assert compare_rewrites(original, rewritten, **check).agree
    apart = compare_rewrites(original, without, **check)
    assert any("Gelu/mul" in d.op for d in apart.differences), apart.summary()


def _toy_view(device: str = ""):
    """A hand-made analysis view, and ``op(name, type, *inputs)`` adding an op to it whose
    one output is a (8, 1024) float32 tensor, read by ``inputs``' outputs in that order."""
    view = nx.DiGraph(name="toy")

    def op(name, kind, *ins):
        out = TensorInfo(f"{name}:0", 0, "float32", (8, 1024), 1 << 15)
        view.add_node(name, type=kind, device=device, placement="compute", outputs=(out,),
                      control_flow=False, functions=(), stateful=False, tflms=None)  # fmt: skip
        for i, src in enumerate(ins):
            view.add_edge(src, name, tensors=[(0, i)], control=False)

    return view, op


def test_a_chain_is_checkpointed_every_nth_cut():
    view, op = _toy_view()

    op("x", "Placeholder")
    for i in range(8):
        op(f"t{i}", "Tanh", f"t{i - 1}" if i else "x")
    op("loss", "Sum", "t7")
    for i in reversed(range(8)):
        op(f"g{i}", "TanhGrad", f"t{i}", "loss" if i == 7 else f"g{i + 1}")
    assign_levels(view)
    sizes = {}
    for every in (1, 2, 4):
        config = tflms.LMSConfig(recompute=True, recompute_segments=every, swapout_threshold=1,
                                 swapin_ahead=1, min_tensor_bytes=0)  # fmt: skip
        groups = plan_segments(view, config, config.target())
        sizes[every] = [len(g.ops) for g in groups]
    assert sizes[1] == []  # every tensor kept as a checkpoint: nothing between them
    assert max(sizes[4]) > max(sizes[2]) > 0


def test_a_tensor_kept_for_its_backward_reader_is_read_not_rerun():
    """On CPU a ``MaxPoolGrad`` must read its ``MaxPool``'s own output (oneDNN links the
    two through a workspace), so ``pool`` stays kept: the clones read it instead of
    re-running it, and re-run the rest of the segment."""
    view, op = _toy_view(device="/device:CPU:0")

    op("x", "Placeholder")
    op("t0", "Tanh", "x")
    op("pool", "MaxPool", "t0")
    for i in range(1, 6):
        op(f"t{i}", "Tanh", f"t{i - 1}" if i > 1 else "pool")
    op("loss", "Sum", "t5")
    for i in reversed(range(1, 6)):
        op(f"g{i}", "TanhGrad", f"t{i}", "loss" if i == 5 else f"g{i + 1}")
    op("gpool", "MaxPoolGrad", "t0", "pool", "g1")
    op("g0", "TanhGrad", "t0", "gpool")
    assign_levels(view)
    config = tflms.LMSConfig(recompute=True, recompute_segments=8, swapout_threshold=1,
                             swapin_ahead=1, min_tensor_bytes=0)  # fmt: skip
    (group,) = plan_segments(view, config, config.target())
    assert "pool" not in {op for _, _, op, _ in group.consumers}  # gpool reads the original
    assert "pool" not in group.ops and {"t0", "t1", "t2"} <= set(group.ops), group.ops


def test_a_rerun_waits_for_the_side_readers_of_the_losss_backprop(devices):
    """The last block's re-run of bench_remat's GPT stack starts after the output layer's
    bias and weight gradients have read the loss's backprop, so that the 64 MiB tensor is
    freed first (measured: alive through that re-run in one step of two or three
    without the wait, +45 MiB at the real allocator's peak); the step stays bitwise."""
    plain, _, _ = _train("gpt", devices, None, steps=2)
    weights, fn, args = _train("gpt", devices, tflms.LMSConfig(**SEGMENTS), steps=2)
    for a, b in zip(plain, weights, strict=True):
        assert a.tobytes() == b.tobytes()
    plan = fn.plan_for(*args)
    blocks = [g for g in plan.recomputes if len(g.ops) > 4]
    last = min(blocks, key=lambda g: g.trigger_level)  # the last block: the first re-run
    graph = fn.get_concrete_function(*args).graph  # the rewritten step: edges into the gates
    view = tflms.build_view(graph)
    kind = nx.get_node_attributes(view, "type")
    head = min((view.nodes[o]["level"], o) for o in view if kind[o] == "BiasAddGrad")[1]
    head_weight = head.replace("BiasAdd/BiasAddGrad", "Tensordot/MatMul/MatMul_1")
    assert {head, head_weight} <= set(last.control_inputs), last.control_inputs
    gates = [
        op for op in graph.get_operations() if op.name.startswith(last.clone_name(last.ops[0]))
    ]
    gate_inputs = {c.name for op in gates if "_gate" in op.name for c in op.control_inputs}
    assert set(last.control_inputs) <= gate_inputs, gate_inputs


def test_a_rerun_never_waits_beside_a_sum_of_three():
    """A side reader of an AddN of 3+ inputs' input is not waited for: ordering the two
    would decide which buffer the sum reuses, hence its summation order."""
    from tflms.plan.entries import Recompute
    from tflms.plan.release import release_waits

    view, op = _toy_view()

    op("x", "Placeholder")
    op("h", "Tanh", "x")
    op("g", "Sum", "h")  # the turn
    op("d", "TanhGrad", "h", "g")
    op("a", "Neg", "d")
    op("b", "MatMul", "d")
    op("total", "AddN", "d", "a", "b")  # a sum of 3 reads d
    op("t", "Exp", "total")  # the trigger
    op("side", "BiasAddGrad", "d")  # a side reader of d, due by t
    op("late", "Mul", "side", "t")
    assign_levels(view)
    group = Recompute(ops=("h",), consumers=(), trigger="t", trigger_level=view.nodes["t"]["level"])
    turn = view.nodes["g"]["level"]
    (waited,) = release_waits(view, (group,), turn=turn, min_bytes=1)
    assert waited.control_inputs == ()
    view.remove_edge("b", "total")  # a sum of 2: its order is fixed; b and side are waited for
    (waited,) = release_waits(view, (group,), turn=turn, min_bytes=1)
    assert waited.control_inputs == ("b", "side")


def test_bad_segment_options_are_named():
    with pytest.raises(ConfigError, match="recompute_segments.*recompute=True"):
        tflms.LMSConfig(recompute_segments=2)
    with pytest.raises(ConfigError, match="recompute_segments"):
        tflms.LMSConfig(recompute=True, recompute_segments=-1)


@pytest.mark.measures
def test_segments_cut_the_real_allocators_peak_bitwise():
    """TensorFlow's CPU allocator, one process each (bench_remat's 4-block GPT stack, AdamW;
    the median of 3 steps): results/remat.json measured 62-64% of plain's peak."""
    results = {
        name: measured_in_a_fresh_process("gpt", config)
        for name, config in (("plain", None), ("segments", SEGMENTS))
    }
    assert results["segments"]["weights"] == results["plain"]["weights"]
    assert results["segments"]["peak"] <= 0.8 * results["plain"]["peak"], results


def test_mixed_precision_recomputation_stays_bitwise(devices):
    """Groups computing in float16 keep their clones from Grappler (no gates): with gated
    clones a MobileNetV3 under mixed_float16 trained 1e-3 away from plain training."""
    from tests.tflms.users_models import USERS_MODELS, users_data

    def train(options):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = USERS_MODELS["mobilenet_v3"]()
            x, y = users_data(model, 24)
            callbacks = [tflms.LMSCallback(batch_size=8, **options)] if options else []
            with tf.device(devices.compute):
                model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                          callbacks=callbacks)  # fmt: skip
        finally:
            keras.mixed_precision.set_global_policy("float32")
        return model.get_weights(), (callbacks[0].plan if callbacks else None)

    plain, _ = train(None)
    options = dict(SEGMENTS, recompute_segments=0)
    weights, plan = train(options)
    assert plan.recomputes, plan.summary()
    assert any(not r.gates for r in plan.recomputes), plan.summary()  # the float16 groups
    for a, b in zip(plain, weights, strict=True):
        assert a.tobytes() == b.tobytes()
