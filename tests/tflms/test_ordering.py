"""Memory-aware ordering on real Keras training steps: edges are legal in the graph as written.

The simulator bypasses the ``IdentityN`` Keras puts between the gradients and the
optimizer updates (Grappler removes it before the step runs), so a simulated schedule
may run an update before a later gradient. An order edge from such an update to that
gradient would close a cycle through the ``IdentityN`` in the graph tflms rewrites.
"""

import pytest

import tflms
from tflms import zoo
from tflms.apply.core import apply_to_view


@pytest.fixture(scope="module")
def mlp_view():
    return tflms.analyze(zoo.mlp(256, (1024,) * 4, classes=100), batch_size=256)


def test_order_edges_never_close_a_cycle_through_identity_n(mlp_view):
    assert any(d["type"] == "IdentityN" for _, d in mlp_view.nodes(data=True))
    depth = mlp_view.graph["depth"]
    config = tflms.LMSConfig(
        swapout_threshold=max(1, depth // 40),
        swapin_ahead=3,
        recompute=True,
        reorder=True,
        link="ideal",
    )
    plan = tflms.make_plan(mlp_view, config)
    assert plan.order  # ordering found something to do here
    rewritten = apply_to_view(mlp_view, plan)  # raises on a cycle
    tflms.validate(rewritten, plan)


def _fork_view():
    """Two branches of two big temporaries each below ``dy``, then a small result each."""
    import networkx as nx

    from tflms.graph.view import TensorInfo, assign_levels

    view = nx.DiGraph(name="fork")

    def op(name, nbytes, *inputs):
        out = TensorInfo(f"{name}:0", 0, "float32", (nbytes // 4,), nbytes)
        view.add_node(name, type="Relu", device="", placement="compute", outputs=(out,),
                      control_flow=False, functions=(), stateful=False, tflms=None)  # fmt: skip
        for i, src in enumerate(inputs):
            view.add_edge(src, name, tensors=[(0, i)], control=False)

    op("dy", 1 << 20)
    for b in "ab":
        op(f"{b}1", 64 << 20, "dy")
        op(f"{b}2", 64 << 20, f"{b}1")
        op(f"{b}3", 4, f"{b}1", f"{b}2")
    op("join", 4, "a3", "b3")
    assign_levels(view)
    return view


def test_a_plan_may_order_without_swapping_or_recomputing():
    """``reorder=True`` alone: a plan of order edges only, applied like any other."""
    view = _fork_view()
    plan = tflms.make_plan(view, tflms.LMSConfig(reorder=True, link="ideal"))
    assert not plan.swaps and not plan.recomputes
    assert plan.order == (("a3", "b1"),)
    before = tflms.simulate(view, accounting="tensors", link="ideal").device_peak_bytes
    after = tflms.simulate(view, plan, accounting="tensors", link="ideal").device_peak_bytes
    assert after < before


def test_no_order_edge_starts_or_ends_at_a_pinned_op():
    """Grappler's check pins an op it rewrites otherwise with the plan; a control edge into
    it can move a rewrite too (MobileNetV3: where constant folding pushed a factor), so
    ordering takes the other branch first, or orders nothing."""
    from tflms.graph.grappler_rules import PINNED

    view = _fork_view()
    view.graph[PINNED] = frozenset({"b1"})
    plan = tflms.make_plan(view, tflms.LMSConfig(reorder=True, link="ideal"))
    assert plan.order == (("b3", "a1"),)
    view.graph[PINNED] = frozenset({"b1", "a1"})
    assert not tflms.make_plan(view, tflms.LMSConfig(reorder=True, link="ideal")).order


def test_order_edges_close_no_cycle_with_the_ops_tensorflow_orders_on_each_variable(devices):
    """A traced step is rewritten before tracing ends; TensorFlow then orders the ops on
    each variable as they were created. An order edge into an RMSprop slot's read closed
    a cycle with those edges and TensorFlow refused to run the step ("16 nodes in a
    cycle"); ordering now predicts them."""
    import networkx as nx
    import tensorflow as tf

    from tests.tflms.users_models import mlp_rmsprop, users_data

    model = mlp_rmsprop()
    x, y = users_data(model, 24)
    options = dict(swapout_threshold=3, swapin_ahead=1, min_tensor_bytes=0, recompute=True)
    lms = tflms.LMSCallback(batch_size=8, reorder=True, check_rewrites=False, **options)
    with tf.device(devices.compute):  # raised before: 16 nodes in a cycle
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[lms])
    trace = lms.traces[0]
    graph = trace._graph()  # noqa: SLF001 - the rewritten FuncGraph, as TensorFlow ran it
    ran = nx.DiGraph()
    for op in graph.get_operations():
        ran.add_edges_from((t.op.name, op.name) for t in op.inputs)
        ran.add_edges_from((c.name, op.name) for c in op.control_inputs)
    assert nx.is_directed_acyclic_graph(ran)
