"""ProtoEditor: the same plans, applied to GraphDef and FunctionDef protobufs."""

import copy

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import function_pb2, node_def_pb2

from tests.tflms.graphs import WIDTH, chain_with_skip, fan_out, relu
from tflms import LMSConfig, apply_plan, build_view, make_plan, validate
from tflms.apply.core import apply_with
from tflms.apply.proto_editor import ProtoEditor
from tflms.errors import AlreadyRewrittenError, UnsupportedGraphError, ValidationError
from tflms.graph.graph_def import graph_from_function_def, graph_from_graph_def
from tflms.graph.op_signatures import OpSignatures
from tflms.graph.view import SWAP_ATTR

OPTIONS = dict(swapout_threshold=5, swapin_ahead=2, min_tensor_bytes=0)


def edges(view):
    return {(u, v, tuple(sorted(d["tensors"])), d["control"]) for u, v, d in view.edges(data=True)}


@pytest.mark.parametrize("sync_mode", [0, 1, 2, 3])
def test_graph_def_rewrite_equals_the_live_graph_rewrite(sync_mode):
    config = LMSConfig(sync_mode=sync_mode, serialization=["3:4"], **OPTIONS)
    live = fan_out()
    graph_def = live.as_graph_def()
    plan = make_plan(build_view(live, config=config), config)
    assert plan.swaps
    apply_plan(live, plan)
    assert apply_with(ProtoEditor(graph_def), plan) == len(plan.swaps) + plan.num_swap_ins

    from_proto = build_view(graph_from_graph_def(graph_def), config=config)
    from_live = build_view(live, config=config)
    validate(from_proto, plan)
    assert set(from_proto.nodes) == set(from_live.nodes)
    assert edges(from_proto) == edges(from_live)
    live_def = {n.name: n for n in live.as_graph_def().node}
    for node in graph_def.node:
        if SWAP_ATTR in node.attr:
            assert node.device == live_def[node.name].device
            for key in ("T", SWAP_ATTR, "_grappler_do_not_remove"):
                assert node.attr[key] == live_def[node.name].attr[key], (node.name, key)


def test_rewritten_graph_def_computes_the_same_values():
    x = np.random.default_rng(0).standard_normal((8, WIDTH)).astype("float32")
    fetches = ["tap8:0", "tap10:0", "tap20:0"]
    original = fan_out()
    graph_def = original.as_graph_def()
    plan = make_plan(build_view(original), LMSConfig(**OPTIONS))
    apply_with(ProtoEditor(graph_def), plan)
    results = []
    for graph in (original, graph_from_graph_def(graph_def)):
        with tf.compat.v1.Session(graph=graph) as sess:
            results.append(sess.run(fetches, {"x:0": x}))
    for got, want in zip(*results, strict=True):
        np.testing.assert_array_equal(got, want)


def _split_function():
    """A function whose swapped tensor is output 1 of a multi-output op (``split``)."""

    @tf.function(input_signature=[tf.TensorSpec([8, 2 * WIDTH])])
    def f(x):
        a, b = tf.split(x, 2, axis=1, name="split")
        h = a
        for i in range(10):
            h = relu(h, name=f"r{i}")
        return tf.subtract(h, b, name="out")  # not commutative: output 1 may be swapped

    cf = f.get_concrete_function()
    return cf, cf.graph.as_graph_def().library


def test_function_def_rewrite_uses_function_tensor_names():
    cf, library = _split_function()
    fdef = copy.deepcopy(cf.function_def)
    view = build_view(graph_from_function_def(fdef, library))
    plan = make_plan(view, LMSConfig(**OPTIONS))
    assert [s.tensor for s in plan.swaps] == ["split:1"]
    apply_with(ProtoEditor(fdef, library=library), plan)

    nodes = {n.name: n for n in fdef.node_def}
    out = nodes["lms/swapout_split_1"]
    swap_in = nodes["split-lms/swapin_out1"]
    assert list(out.input) == ["split:output:1"] and out.device == "/device:CPU:0"
    assert list(swap_in.input)[0] == "lms/swapout_split_1:output:0"
    assert "split-lms/swapin_out1:output:0" in nodes["out"].input
    assert out.attr["T"].type == tf.float32.as_datatype_enum
    assert swap_in.attr[SWAP_ATTR].s == b"in" and swap_in.attr["_grappler_do_not_remove"].b
    validate(build_view(graph_from_function_def(fdef, library)), plan)


def test_rewritten_function_def_computes_the_same_values():
    cf, library = _split_function()
    fdef = copy.deepcopy(cf.function_def)
    original = graph_from_function_def(cf.function_def, library)
    plan = make_plan(build_view(original), LMSConfig(**OPTIONS))
    apply_with(ProtoEditor(fdef, library=library), plan)
    x = np.random.default_rng(1).standard_normal((8, 2 * WIDTH)).astype("float32")
    arg = cf.function_def.signature.input_arg[0].name
    out = "out:0"
    results = []
    for graph in (original, graph_from_function_def(fdef, library)):
        with tf.compat.v1.Session(graph=graph) as sess:
            results.append(sess.run(out, {f"{arg}:0": x}))
    np.testing.assert_array_equal(*results)


def test_output_names_follow_output_args_and_function_signatures():
    sigs = OpSignatures()
    bn = node_def_pb2.NodeDef(name="bn", op="FusedBatchNormV3")
    bn.attr["T"].type = bn.attr["U"].type = tf.float32.as_datatype_enum
    assert [sigs.function_tensor_name(bn, k) for k in (0, 2)] == [
        "bn:y:0",
        "bn:batch_variance:0",
    ]
    assert sigs.flat_index(bn, "batch_variance", 0) == 2
    library = function_pb2.FunctionDefLibrary()
    fdef = library.function.add()
    fdef.signature.name = "my_fn"
    for name, dtype in (("first", tf.float32), ("second", tf.int64)):
        fdef.signature.output_arg.add(name=name, type=dtype.as_datatype_enum)
    call = node_def_pb2.NodeDef(name="call", op="my_fn")
    assert OpSignatures(library).function_tensor_name(call, 1) == "call:second:0"
    assert OpSignatures(library).output_dtype(call, 1) == tf.int64.as_datatype_enum
    with pytest.raises(UnsupportedGraphError, match="has 2 outputs; output 5"):
        OpSignatures(library).function_tensor_name(call, 5)
    with pytest.raises(UnsupportedGraphError, match="not registered|neither registered"):
        sigs.output_layout(node_def_pb2.NodeDef(name="m", op="NoSuchOpAnywhere"))


def test_reapplying_and_foreign_plans_are_refused():
    graph_def = chain_with_skip(n=12).as_graph_def()
    plan = make_plan(build_view(graph_from_graph_def(graph_def)), LMSConfig(**OPTIONS))
    apply_with(ProtoEditor(graph_def), plan)
    with pytest.raises(AlreadyRewrittenError, match="a plan is applied once per graph"):
        apply_with(ProtoEditor(graph_def), plan)
    other = fan_out().as_graph_def()
    with pytest.raises(ValidationError, match="does not match this graph"):
        apply_with(ProtoEditor(other), plan)
    with pytest.raises(UnsupportedGraphError, match="got Graph"):
        ProtoEditor(tf.Graph())
    with pytest.raises(ValidationError, match="has 1 data inputs"):
        ProtoEditor(other).reroute("h1", 3, ("x", 0))


def test_control_edges_are_not_duplicated():
    graph_def = chain_with_skip(n=3).as_graph_def()
    editor = ProtoEditor(graph_def)
    editor.add_control("h0", "h2")
    editor.add_control("h0", "h2")
    (h2,) = [n for n in graph_def.node if n.name == "h2"]
    assert list(h2.input) == ["h1", "^h0"]


def test_a_swapped_clone_keeps_its_originals_attributes_and_dtype():
    """A weight's cast re-run on the host whose float16 output is then swapped (weight
    streaming under mixed precision): the swap ops take the clone's dtype from its
    signature, and the clone gains no attribute, in a protobuf as in a live graph (until
    2026-12-02 the protobuf's clone gained an empty ``T``, its swap ops ``T=DT_INVALID``,
    and Grappler's check found the step rewritten otherwise)."""
    from tflms.plan.entries import Recompute, Swap, SwapIn
    from tflms.plan.swap_plan import SwapPlan

    live = tf.Graph()
    with live.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        c = tf.cast(x, tf.float16, name="c")
        h = c
        for i in range(6):
            h = tf.nn.relu(h, name=f"r{i}")
        tf.add(h, c, name="out")
    graph_def = live.as_graph_def()
    group = Recompute(ops=("c",), consumers=(("out", 1, "c", 0),), device="/device:CPU:0")
    clone = group.clone_name("c")
    swap = Swap(
        f"{clone}:0",
        clone,
        0,
        8 * WIDTH * 2,
        "float16",
        1,
        "",
        swap_ins=(SwapIn(consumers=(("out", 1),), trigger="r4"),),
    )
    plan = SwapPlan(recomputes=(group,), swaps=(swap,))
    apply_plan(live, plan)
    apply_with(ProtoEditor(graph_def), plan)
    live_def = {n.name: n for n in live.as_graph_def().node}
    made = {n.name: n for n in graph_def.node}
    assert set(made) == set(live_def)
    assert set(made[clone].attr) == set(live_def[clone].attr)
    assert "T" not in made[clone].attr
    for name, node in made.items():
        if SWAP_ATTR in node.attr and node.op == "Identity":
            assert node.attr["T"].type == tf.float16.as_datatype_enum, name
            assert node.attr["T"] == live_def[name].attr["T"], name
    x_value = np.random.default_rng(0).standard_normal((8, WIDTH)).astype("float32")
    results = []
    for graph in (live, graph_from_graph_def(graph_def)):
        with tf.compat.v1.Session(graph=graph) as sess:
            results.append(sess.run("out:0", {"x:0": x_value}))
    np.testing.assert_array_equal(*results)
