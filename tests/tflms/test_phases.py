"""Where the forward pass ends (tflms.plan.phases.turn_level): after the loss, on models
whose gradients have factors computed from forward values alone."""

from __future__ import annotations

import keras
import networkx as nx
import pytest

import tflms
from tests.tflms.keras_models import MODELS
from tests.tflms.users_models import USERS_MODELS, users_data
from tflms.cost.ops import DENSE_OPS
from tflms.graph.view import is_gradient_op
from tflms.plan.phases import turn_level


def _view(name: str):
    keras.backend.clear_session()
    if name in MODELS:
        model, x, y = MODELS[name](8)
    else:
        model = USERS_MODELS[name]()
        x, y = users_data(model, 8)
    return tflms.build_view(tflms.train_step_graph(model, x=x, y=y))


def assert_the_turn_follows_the_loss(view) -> None:
    """The turn lies after the cross-entropy (the loss: the last forward op) and no later
    than the first matrix product or convolution of the backward pass (the head's weight
    gradient)."""
    levels = nx.get_node_attributes(view, "level")
    (loss,) = [n for n, d in view.nodes(data=True) if d["type"].startswith("SparseSoftmaxCross")]
    head = min(
        levels[n]
        for n, d in view.nodes(data=True)
        if levels[n] > levels[loss] and is_gradient_op(n, d["type"]) and d["type"] in DENSE_OPS
    )
    assert levels[loss] < turn_level(view) <= head, (levels[loss], turn_level(view), head)


@pytest.mark.parametrize(
    "name",
    [
        "mobilenet_v3",  # hard-swish's x / 6: its gradient's -x / 6**2 runs at level 17 of 306
        "unet3d",  # the Dice loss's gradient factors, computed from the softmax alone
        "conv_bigru",  # a GRU's gradient loop's zeros, filled from the variables' shapes
    ],
)
def test_the_turn_comes_after_the_loss(name):
    """Taken at the first gradient op that reads another, the turn fell in the first tenth
    of the forward pass on these three (level 17 of 306 on the MobileNetV3), so segments,
    recomputation and update waits took most of the forward pass for backward."""
    assert_the_turn_follows_the_loss(_view(name))
