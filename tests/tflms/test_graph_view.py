"""Analysis: the networkx view of hand-built graphs, checked by hand."""

import networkx as nx
import pytest
import tensorflow as tf

from tests.tflms.graphs import WIDTH, chain_with_skip, diamond
from tflms import LMSConfig, build_view
from tflms.errors import UnsupportedGraphError
from tflms.graph.view import assign_levels, consumers


def test_levels_edges_and_sizes_of_a_chain_with_a_skip():
    view = build_view(chain_with_skip(n=6, batch=8))
    assert view.nodes["x"]["level"] == 0
    assert [view.nodes[f"h{i}"]["level"] for i in range(6)] == [1, 2, 3, 4, 5, 6]
    assert view.nodes["out"]["level"] == 7 and view.graph["depth"] == 8
    assert view["h1"]["out"] == {"tensors": [(0, 1)], "control": False}
    assert sorted(consumers(view, "h1", 0)) == [("h2", 0), ("out", 1)]
    info = view.nodes["h1"]["outputs"][0]
    assert (info.name, info.dtype, info.shape, info.bytes) == (
        "h1:0",
        "float32",
        (8, WIDTH),
        8 * WIDTH * 4,
    )
    assert view.nodes["h1"]["placement"] == "compute"


def test_diamond_levels_follow_the_longest_path():
    view = build_view(diamond())
    levels = nx.get_node_attributes(view, "level")
    assert (levels["a"], levels["b"], levels["c"], levels["d"]) == (1, 2, 2, 3)
    assert levels["end"] == levels["t9"] + 1 == 14


def test_batch_dimension_comes_from_config_then_signature_then_per_sample():
    g = chain_with_skip(n=3, batch=None)
    by_config = build_view(g, config=LMSConfig(batch_size=32))
    assert by_config.graph["batch_source"] == "LMSConfig.batch_size"
    assert by_config.nodes["h0"]["outputs"][0].bytes == 32 * WIDTH * 4
    per_sample = build_view(g)
    assert per_sample.graph["batch_size"] is None
    assert per_sample.nodes["h0"]["outputs"][0].bytes == WIDTH * 4
    assert "h0:0" in per_sample.graph["unsized_batch"]

    @tf.function
    def f(x):
        return tf.nn.relu(x)

    traced = f.get_concrete_function(tf.TensorSpec([16, WIDTH])).graph
    assert build_view(traced).graph["batch_size"] == 16
    assert build_view(traced).graph["batch_source"] == "input signature"


def test_unknown_inner_dimensions_are_counted_as_one_and_reported():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, None, 10], name="x")
        tf.nn.relu(x, name="r")
    view = build_view(g)
    assert view.nodes["r"]["outputs"][0].bytes == 4 * 1 * 10 * 4
    assert "r:0" in view.graph["unknown_dims"]


def test_control_edges_and_placement_classes(devices):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        with tf.device(devices.host):
            a = tf.nn.relu(x, name="on_host")
        with tf.device("/device:CPU:1"):
            b = tf.nn.relu(x, name="on_compute")
        with tf.control_dependencies([a]):
            tf.identity(b, name="after")
    view = build_view(g, config=LMSConfig(device=devices.compute))
    assert view.nodes["on_host"]["placement"] == "host"
    assert view.nodes["on_compute"]["placement"] == "compute"
    assert view.nodes["x"]["placement"] == "compute"  # unassigned ops run on the compute device
    assert view["on_host"]["after"] == {"tensors": [], "control": True}
    assert view.nodes["after"]["level"] == 2


def test_functional_control_flow_is_marked_and_its_bodies_listed():
    @tf.function
    def f(x, flag):
        return tf.cond(flag, lambda: tf.nn.relu(x), lambda: x * 2.0)

    graph = f.get_concrete_function(tf.TensorSpec([4, 4]), tf.TensorSpec([], tf.bool)).graph
    view = build_view(graph)
    cond_ops = [n for n, d in view.nodes(data=True) if d["type"] in ("If", "StatelessIf")]
    assert cond_ops and all(view.nodes[n]["control_flow"] for n in cond_ops)
    assert view.nodes[cond_ops[0]]["functions"]  # body function names are reported
    assert cond_ops[0] in view.graph["control_flow_ops"]


def test_v1_while_loop_back_edges_do_not_break_levelling():
    tf.compat.v1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
            tf.compat.v1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), [0, x])
    finally:
        tf.compat.v1.enable_control_flow_v2()
    view = build_view(g)
    assert any(d["type"] == "NextIteration" for _, d in view.nodes(data=True))
    inside = [n for n, d in view.nodes(data=True) if d["control_flow"]]
    assert any(n.startswith("while/mul") for n in inside)  # ops inside the loop frame are marked


def test_a_real_cycle_is_rejected():
    view = nx.DiGraph(name="cyclic")
    for name in "abc":
        view.add_node(name, type="Relu")
    view.add_edges_from([("a", "b"), ("b", "c"), ("c", "a")], tensors=[(0, 0)], control=False)
    with pytest.raises(UnsupportedGraphError, match="cycle"):
        assign_levels(view)


def test_not_a_graph_is_rejected():
    with pytest.raises(UnsupportedGraphError, match="needs a tf.Graph or FuncGraph, got function"):
        build_view(lambda x: x)


def test_analysis_does_not_mutate_the_graph():
    g = chain_with_skip()
    before = g.as_graph_def().SerializeToString(deterministic=True)
    build_view(g, config=LMSConfig(batch_size=2))
    assert g.as_graph_def().SerializeToString(deterministic=True) == before
