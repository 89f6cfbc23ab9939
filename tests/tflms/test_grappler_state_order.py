"""The control edges a traced step is still to get (tflms.simulation.grappler.state_order):
the same as TensorFlow's automatic control dependencies add when tracing ends."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from tests.tflms.models import tape_step
from tflms.simulation.grappler.state_order import automatic_control_edges, with_control_edges


def _traced_with_prediction(model, optimizer, x, y):
    """Traces an AdamW step; returns (the edges predicted while tracing, the edges added)."""
    step = tape_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy(True))
    seen = {}

    def traced(x, y):
        loss = step(x, y)
        graph = tf.compat.v1.get_default_graph()
        seen["edges"] = automatic_control_edges(graph)
        seen["held"] = {
            op.name: {c.name for c in op.control_inputs} for op in graph.get_operations()
        }
        return loss

    final = tf.function(traced).get_concrete_function(x, y).graph
    added = {
        (c.name, op.name)
        for op in final.get_operations()
        if op.name in seen["held"]
        for c in op.control_inputs
        if c.name not in seen["held"][op.name]
    }
    return seen["edges"], added


@pytest.mark.parametrize("optimizer", ["adamw", "rmsprop"])
def test_the_edges_are_those_tensorflow_adds_when_tracing_ends(optimizer):
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    opt = keras.optimizers.AdamW(1e-3) if optimizer == "adamw" else keras.optimizers.RMSprop()
    x, y = tf.ones((8, 16)), tf.zeros((8,), tf.int32)
    predicted, added = _traced_with_prediction(model, opt, x, y)
    assert predicted, "an optimizer step orders its variables' reads and writes"
    assert len(predicted) == len(set(predicted))
    assert set(predicted) == added, (
        sorted(set(predicted) - added)[:5],
        sorted(added - set(predicted))[:5],
    )


def test_a_finished_or_v1_graph_gets_no_edge():
    v = tf.Variable(1.0)

    @tf.function
    def step():
        v.assign_add(v.read_value())
        return v.read_value()

    assert automatic_control_edges(step.get_concrete_function().graph) == []
    with tf.Graph().as_default() as graph:
        w = tf.compat.v1.Variable(1.0, use_resource=True)
        w.assign_add(w.read_value())
    assert automatic_control_edges(graph) == []


def test_edges_go_on_the_graph_def_once():
    with tf.Graph().as_default() as graph:
        a = tf.constant(1.0, name="a")
        tf.identity(a, name="b")
    graph_def = graph.as_graph_def()
    for _ in range(2):
        with_control_edges(graph_def, [("a", "b"), ("a", "missing")])
    (b,) = [n for n in graph_def.node if n.name == "b"]
    assert list(b.input) == ["a", "^a"]
