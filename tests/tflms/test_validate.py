"""validate(): each broken invariant is reported by name."""

import networkx as nx
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tests.tflms.graphs import chain_with_skip
from tflms import LMS, validate
from tflms.errors import ValidationError
from tflms.graph.view import SWAP_ATTR, build_view

OPTIONS = dict(swapout_threshold=5, swapin_ahead=2, min_tensor_bytes=0)


def rewritten():
    g = chain_with_skip(n=12)
    return g, LMS(**OPTIONS).run(g)


def test_a_correct_rewrite_passes_with_and_without_the_plan():
    g, plan = rewritten()
    validate(g, plan)
    validate(g)


def test_missing_trigger_edge_is_reported():
    g, plan = rewritten()
    g.get_operation_by_name("h1-lms/swapin")._remove_all_control_inputs()
    with pytest.raises(ValidationError, match="lacks its control edge from h10"):
        validate(g, plan)


def test_swap_out_on_the_wrong_device_is_reported():
    g, plan = rewritten()
    g.get_operation_by_name("lms/swapout_h1_0")._set_device("/device:CPU:1")
    with pytest.raises(ValidationError, match="is on '/device:CPU:1', expected the host"):
        validate(g, plan)


def test_consumer_not_rerouted_is_reported():
    g, plan = rewritten()
    g.get_operation_by_name("out")._update_input(1, g.get_tensor_by_name("h1:0"))
    with pytest.raises(ValidationError, match="input 1 of out does not read swap-in h1-lms/swapin"):
        validate(g, plan)


def test_orphan_swap_ops_are_reported():
    g, plan = rewritten()
    with g.as_default(), tf.device("/device:CPU:0"):
        stray = tf.identity(g.get_tensor_by_name("h3:0"), name="lms/swapout_stray")
    stray.op._set_attr(SWAP_ATTR, attr_value_pb2.AttrValue(s=b"out"))
    with pytest.raises(ValidationError) as err:
        validate(g, plan)
    assert "lms/swapout_stray feeds no swap-in" in str(err.value)
    assert "lms/swapout_stray is not part of the plan" in str(err.value)


def test_a_cyclic_view_is_reported():
    view = nx.DiGraph(name="v")
    for n in "ab":
        view.add_node(n, type="Relu", tflms=None)
    view.add_edge("a", "b", tensors=[(0, 0)], control=False)
    view.add_edge("b", "a", tensors=[], control=True)
    with pytest.raises(ValidationError, match="cycle"):
        validate(view)


def test_a_swap_that_blocks_a_grappler_fold_is_refused():
    """The swap ops must not change what Grappler's arithmetic optimizer folds: a
    swapped tensor inside an add chain, a trigger hung on a product chain."""
    g = tf.Graph()
    with g.as_default():
        a, b, c, p, q, r = (tf.compat.v1.placeholder(tf.float32, [4, 4], name=n) for n in "abcpqr")
        add1 = tf.add(a, b, name="add1")
        out = tf.identity(add1, name="swap_out")
        swap_in = tf.identity(out, name="swap_in")
        tf.add(swap_in, c, name="add2")  # add1 -> add2 is an AddOpsRewrite fold
        m1 = tf.multiply(p, q, name="m1")
        tf.multiply(m1, r, name="m2")  # m1 -> m2: a chain of one associative op
    view = build_view(g, batch_size=4)
    view.nodes["swap_out"].update(tflms="out", device="/device:CPU:0")
    view.nodes["swap_in"]["tflms"] = "in"
    with pytest.raises(ValidationError, match="adds a consumer to add1"):
        validate(view)
    view.add_edge("m1", "swap_in", tensors=[], control=True)  # a trigger inside a fold
    with pytest.raises(ValidationError, match="m1 has a control edge to swap_in"):
        validate(view)
