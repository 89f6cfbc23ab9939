"""Apply: the in-place rewrite of tf.Graph objects and of analysis views."""

import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.graphs import WIDTH, chain_with_skip, fan_out, relu
from tflms import LMS, LMSConfig, apply_plan, apply_to_view, build_view, make_plan, validate
from tflms.apply.core import apply_in_place
from tflms.errors import AlreadyRewrittenError, UnsupportedGraphError, ValidationError
from tflms.graph.view import SWAP_ATTR

OPTIONS = dict(swapout_threshold=5, swapin_ahead=2, min_tensor_bytes=0)


def run(graph, fetch, feed_value):
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(fetch, {"x:0": feed_value})


def test_rewrite_inserts_placed_marked_swap_ops_and_reroutes_consumers(devices):
    g = chain_with_skip(n=12)
    plan = LMS(**OPTIONS).run(g)
    (swap,) = plan.swaps
    out = g.get_operation_by_name("lms/swapout_h1_0")
    swap_in = g.get_operation_by_name("h1-lms/swapin")
    assert (out.type, swap_in.type) == ("Identity", "Identity")
    assert out.device == devices.host and swap_in.device == ""  # `out` (the consumer) is unassigned
    assert out.inputs[0].name == "h1:0" and swap_in.inputs[0].name == "lms/swapout_h1_0:0"
    assert g.get_operation_by_name("out").inputs[1].name == "h1-lms/swapin:0"
    assert g.get_operation_by_name("h2").inputs[0].name == "h1:0"  # the near consumer keeps h1
    assert [op.name for op in swap_in.control_inputs] == [swap.swap_ins[0].trigger]
    assert out.get_attr(SWAP_ATTR) == b"out" and swap_in.get_attr(SWAP_ATTR) == b"in"
    assert out.get_attr("_grappler_do_not_remove") and swap_in.get_attr("_grappler_do_not_remove")
    validate(g, plan)


def test_swap_in_goes_to_the_consumers_device(devices):
    g = tf.Graph()
    with g.as_default(), tf.device(devices.compute):
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        h = tf.nn.relu(x, name="h")
        t = h
        for i in range(10):
            t = relu(t, name=f"t{i}")
        tf.add(t, h, name="out")
    plan = LMS(device=devices.compute, **OPTIONS).run(g)
    assert plan.swaps
    assert g.get_operation_by_name("h-lms/swapin").device == devices.compute
    assert g.get_operation_by_name("lms/swapout_h_0").device == devices.host


@pytest.mark.parametrize("sync_mode", [0, 1, 2, 3])
def test_rewritten_graph_computes_the_same_values(sync_mode):
    x = np.random.default_rng(0).standard_normal((8, WIDTH)).astype("float32")
    fetches = ["tap8:0", "tap10:0", "tap20:0"]
    expected = run(fan_out(), fetches, x)
    g = fan_out()
    plan = LMS(sync_mode=sync_mode, serialization=["3:5"], **OPTIONS).run(g)
    assert plan.swaps
    for got, want in zip(run(g, fetches, x), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_view_rewrite_matches_the_graph_rewrite():
    config = LMSConfig(sync_mode=3, serialization=["2"], **OPTIONS)
    original = fan_out()
    plan = make_plan(build_view(original, config=config), config)
    predicted = apply_to_view(build_view(original, config=config), plan)
    apply_plan(original, plan)
    actual = build_view(original, config=config)
    assert set(predicted.nodes) == set(actual.nodes)

    def edges(view):
        return {
            (u, v, tuple(sorted(d["tensors"])), d["control"]) for u, v, d in view.edges(data=True)
        }

    assert edges(predicted) == edges(actual)
    for name in actual.nodes:
        for key in ("type", "tflms", "level", "placement"):
            assert predicted.nodes[name][key] == actual.nodes[name][key], (name, key)


def test_view_rewrite_leaves_the_input_view_alone():
    view = build_view(fan_out())
    before = {(u, v): (list(d["tensors"]), d["control"]) for u, v, d in view.edges(data=True)}
    apply_to_view(view, make_plan(view, LMSConfig(**OPTIONS)))
    assert before == {
        (u, v): (list(d["tensors"]), d["control"]) for u, v, d in view.edges(data=True)
    }


def _snapshot(view):
    """Everything of a view that ``undo`` restores: nodes, attributes, edges, successor order."""
    return (
        [(n, dict(d)) for n, d in view.nodes(data=True)],
        [(u, [(v, dict(d)) for v, d in view.succ[u].items()]) for u in view],
        dict(view.graph),
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(sync_mode=3, serialization=["2"], **OPTIONS),
        dict(recompute=True, reorder=True, **OPTIONS),
        dict(swapin_groupby=0, n_tensors=1, **OPTIONS),
    ],
    ids=["sync-serialized", "recompute-ordered", "one-swap"],
)
def test_in_place_rewrite_is_the_copied_rewrite_and_undoes_exactly(options):
    config = LMSConfig(**options)
    view = build_view(fan_out(), config=config)
    plan = make_plan(view, config)
    assert plan.swaps or plan.recomputes
    before = _snapshot(view)
    copied = apply_to_view(view, plan, levels=False)
    undo = apply_in_place(view, plan)
    assert _snapshot(view) == _snapshot(copied)  # successor order included
    undo()
    assert _snapshot(view) == before
    again = apply_in_place(view, plan)  # the restored view takes the plan again
    assert _snapshot(view) == _snapshot(copied)
    again()
    assert _snapshot(view) == before


def test_in_place_rewrite_that_fails_leaves_the_view_as_it_was():
    view = build_view(fan_out())
    plan = make_plan(view, LMSConfig(**OPTIONS))
    before = _snapshot(view)
    undo = apply_in_place(view, plan)
    with pytest.raises(AlreadyRewrittenError):
        apply_in_place(view, plan)
    undo()
    assert _snapshot(view) == before
    other = make_plan(build_view(chain_with_skip(n=12)), LMSConfig(**OPTIONS))
    with pytest.raises(ValidationError, match="does not match this graph"):
        apply_in_place(view, other)
    assert _snapshot(view) == before


def test_reapplying_is_refused_with_a_clear_error():
    g = chain_with_skip(n=12)
    plan = LMS(**OPTIONS).run(g)
    with pytest.raises(AlreadyRewrittenError, match="already rewritten by tflms"):
        LMS(**OPTIONS).run(g)
    with pytest.raises(AlreadyRewrittenError, match="a plan is applied once per graph"):
        apply_plan(g, plan)


def test_a_plan_for_another_graph_is_refused():
    plan = LMS(**OPTIONS).plan(fan_out())
    with pytest.raises(ValidationError, match="does not match this graph"):
        apply_plan(chain_with_skip(n=12), plan)


def test_taken_names_are_refused():
    g = chain_with_skip(n=12)
    with g.as_default():
        tf.identity(g.get_tensor_by_name("x:0"), name="h1-lms/swapin")
    with pytest.raises(ValidationError, match="already taken"):
        LMS(**OPTIONS).run(g)


def test_finalized_graphs_and_non_graphs_are_refused():
    g = chain_with_skip(n=12)
    plan = LMS(**OPTIONS).plan(g)
    g.finalize()
    with pytest.raises(UnsupportedGraphError, match="finalized"):
        apply_plan(g, plan)
    with pytest.raises(UnsupportedGraphError, match="got GraphDef"):
        apply_plan(g.as_graph_def(), plan)


def test_nothing_to_swap_leaves_the_graph_unchanged_and_says_why(caplog):
    g = chain_with_skip(n=3)
    before = g.as_graph_def().SerializeToString(deterministic=True)
    with caplog.at_level("INFO", logger="tflms"):
        plan = LMS().run(g)
    assert plan.swaps == ()
    assert g.as_graph_def().SerializeToString(deterministic=True) == before
    assert "nothing to swap" in caplog.text


def test_lms_rejects_unknown_options():
    with pytest.raises(tflms.errors.ConfigError, match=r"Unknown LMS option\(s\) \['swap_ahead'\]"):
        LMS(swap_ahead=3)
