"""Memory rules the CPU judge found missing (issue 44): what TensorFlow prunes, what kernels hold.

* A traced function's ops that nothing it returns, no control output and no
  stateful op needs never run (``PruneFunctionBody``): ``tf.nn.silu``'s
  gradient with respect to its constant ``beta`` computes ``Square(x)`` and
  three products per activation that nobody reads. The simulator counted them
  (a diffusion U-Net's peak at +23%).
* ``Einsum``'s kernel copies operands it must transpose, and a product it must
  transpose, into temporaries the CPU allocator sees during the op.
"""

from __future__ import annotations

import networkx as nx
import pytest
import tensorflow as tf

import tflms
from tflms.cost.temporaries import einsum_temporary_bytes
from tflms.graph.view import TensorInfo
from tflms.simulation.bypass import dead_at_run_time
from tflms.simulation.schedule import compile_view

ROWS, COLS = 512, 512
ACT = ROWS * COLS * 4  # one activation: 1 MiB


def _silu_step():
    w = tf.Variable(tf.ones((COLS, COLS)) * 0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.silu(x @ w))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    return tflms.build_view(step.get_concrete_function(tf.ones((ROWS, COLS))).graph)


def test_silu_beta_gradient_is_pruned_from_the_peak():
    view = _silu_step()
    dead = dead_at_run_time(view)
    squares = [n for n in dead if view.nodes[n]["type"] == "Square"]
    assert squares, sorted(dead)  # the beta gradient's Square(x), an activation's size
    assert all(view.nodes[n]["outputs"][0].bytes == ACT for n in squares)
    pruned = tflms.simulate(view, accounting="tensors").device_peak_bytes

    unknown = nx.DiGraph(view)  # as if the function's results were not known: nothing pruned
    unknown.graph = {**view.graph, "returns": None}
    assert not dead_at_run_time(unknown)
    kept = tflms.simulate(unknown, accounting="tensors").device_peak_bytes
    assert kept >= pruned + ACT, (kept, pruned)

    removed = nx.DiGraph(view)
    removed.remove_nodes_from(dead)
    assert tflms.simulate(removed, accounting="tensors").device_peak_bytes == pruned


def test_pruned_ops_take_no_time_and_hold_nothing():
    view = _silu_step()
    dead = dead_at_run_time(view)
    graph = compile_view(view, device="V100-16GB", link="pcie3")
    for i, name in enumerate(graph.names):
        if name in dead:
            assert graph.durations[i] == 0.0 and not graph.inputs[i]
            assert all(t.bytes == 0 for t in graph.outputs[i])
    kept = compile_view(view, device="V100-16GB", link="pcie3", prune_dead=False)
    assert any(kept.outputs[graph.names.index(n)][0].bytes for n in dead)


def test_a_step_planned_while_it_is_traced_knows_its_results(devices):
    # LMSCallback plans the train step before its trace ends: the pipeline takes what the
    # step returned as its results, so the dead silu-beta gradients are pruned there too
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    with tf.device(devices.compute):
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(64, activation="silu"), keras.layers.Dense(1)]
        )
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    callback = tflms.LMSCallback(device=devices.compute, host_device=devices.host)
    x, y = np.ones((32, 64), "float32"), np.ones((32, 1), "float32")
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    assert callback.view.graph["returns"]
    dead = dead_at_run_time(callback.view)
    assert any(callback.view.nodes[n]["type"] == "Square" for n in dead), sorted(dead)


def test_a_graph_without_results_prunes_nothing():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (ROWS, COLS))
        tf.square(x, name="fetched_by_a_session")
    view = tflms.build_view(g)
    assert view.graph["returns"] is None and not dead_at_run_time(view)


def _info(shape):
    n = 4
    for d in shape:
        n *= d
    return TensorInfo("t:0", 0, "float32", tuple(shape), n)


@pytest.mark.parametrize(
    ("equation", "shapes", "out", "copied"),
    [
        # Keras MultiHeadAttention: scores, both operands transposed to B N T H
        ("aecd,abcd->acbe", [(8, 16, 4, 32), (8, 16, 4, 32)], (8, 4, 16, 16), (0, 1, "out")),
        ("BTNH,BSNH->BNTS", [(8, 16, 4, 32), (8, 16, 4, 32)], (8, 4, 16, 16), (0, 1)),
        # its output: the product B N T H transposed into B T N H
        ("BNTS,BSNH->BTNH", [(8, 4, 16, 16), (8, 16, 4, 32)], (8, 16, 4, 32), (1, "out")),
        ("abc,acd->abd", [(8, 16, 32), (8, 32, 16)], (8, 16, 16), ()),  # a batch matmul
        ("abc,adc->abd", [(8, 16, 32), (8, 16, 32)], (8, 16, 16), ()),  # adjoint flags absorb it
        ("ab,bc->ac", [(16, 32), (32, 8)], (16, 8), ()),
        ("ab,cb->ac", [(16, 32), (8, 32)], (16, 8), ()),
        ("...ab,bc->...ac", [(2, 16, 32), (32, 8)], (2, 16, 8), ()),  # ellipsis: not modelled
    ],
)
def test_einsum_temporaries(equation, shapes, out, copied):
    inputs = [_info(s) for s in shapes]
    output = _info(out)
    want = sum(output.bytes if c == "out" else inputs[c].bytes for c in copied)
    assert einsum_temporary_bytes(equation, inputs, output) == want


def test_einsum_temporaries_count_under_tensorflows_conventions_only():
    q = tf.Variable(tf.ones((COLS, 4 * 32)) * 0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.reshape(x @ q, (ROWS // 8, 8, 4, 32))  # B S N H
            loss = tf.reduce_sum(tf.einsum("BTNH,BSNH->BNTS", h, h))
        q.assign_sub(tape.gradient(loss, q))
        return loss

    view = tflms.build_view(step.get_concrete_function(tf.ones((ROWS, COLS))).graph)
    graph = compile_view(view, device="V100-16GB", link="pcie3")
    forward = [i for i, n in enumerate(graph.names) if n.endswith("Einsum") and "grad" not in n]
    assert [graph.temporaries[i] for i in forward] == [2 * ROWS * 4 * 32 * 4]
    blind = nx.DiGraph(view)  # the equation unknown: no temporaries
    for n in blind:
        blind.nodes[n].pop("equation", None)
    for accounting, more in (("tensors", True), ("grappler", False)):
        peak = tflms.simulate(view, accounting=accounting).device_peak_bytes
        assert (peak > tflms.simulate(blind, accounting=accounting).device_peak_bytes) is more
