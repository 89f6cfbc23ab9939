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
