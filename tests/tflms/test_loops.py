"""Loops: the lists a ``While`` keeps for its gradient, sized in the view and simulated.

A recurrent network's memory is the per-step tensors its time loop keeps for
the backward pass, held in ``TensorList`` accumulators that look like
zero-byte ``variant`` scalars to the outer graph. The judge is TensorFlow's
plain BFC CPU allocator (``every_allocation_env``), which counts every one
of them; oneDNN's leaves small allocations out of its peak.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms import zoo
from tflms.graph.loops import static_value
from tflms.utils.cpu import every_allocation_env

REPO = Path(__file__).resolve().parents[2]
BATCH = 8


def _lstm_step_graph(seq: int, *, batch: int = 8, dim: int = 16, units: int = 32, layers: int = 1):
    keras.utils.set_random_seed(3)
    inp = x = keras.Input((seq, dim))
    for i in range(layers):
        x = keras.layers.LSTM(units, return_sequences=i < layers - 1)(x)
    out = keras.layers.Dense(4)(x)
    model = keras.Model(inp, out)
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    step = tf.function(model.train_step, jit_compile=False)
    data = (tf.zeros((batch, seq, dim)), tf.zeros((batch, 4)))
    return step.get_concrete_function(data).graph


def _forward_loop(view):
    loops = [d["loop"] for _, d in view.nodes(data=True) if "loop" in d]
    assert len(loops) == 2, [d.op for d in loops]  # the time loop and its gradient loop
    return next(f for f in loops if "grad" not in f.op)


def test_static_value_folds_the_reductions_keras_bounds_a_loop_with():
    g = tf.Graph()
    with g.as_default():
        steps = tf.reduce_max(tf.constant([12, 256, 7]))
        unknown = tf.reduce_max(tf.compat.v1.placeholder(tf.int32, [3]))
        both = tf.maximum(steps, tf.constant(300))
    assert tf.get_static_value(steps) is None  # what TensorFlow leaves out
    assert int(static_value(steps)) == 256
    assert int(static_value(both)) == 300
    assert static_value(unknown) is None


def test_an_lstms_lists_hold_every_step_it_keeps_for_the_backward_pass():
    batch, dim, units = 8, 16, 32
    views = {seq: tflms.build_view(_lstm_step_graph(seq)) for seq in (16, 32)}
    for seq, view in views.items():
        forward = _forward_loop(view)
        assert forward.trips == seq, forward.bound
        assert not forward.unbounded and not view.graph["unbounded_loops"]
        # Keras' LSTM keeps per step: 3 sigmoid gates, the tanh candidate, tanh(c),
        # c and h of the step before (h: its output list holds only the last one),
        # and the input x_t; the weight reads it pushes alias the variables.
        per_step = (7 * units + dim) * batch * 4
        last_output = units * batch * 4
        assert sum(forward.list_bytes.values()) == seq * per_step + last_output
    # ... and the simulator holds them from the forward loop to the gradient loop.
    peak = {s: tflms.simulate(v, accounting="tensors").device_peak_bytes for s, v in views.items()}
    assert peak[32] - peak[16] >= 16 * (7 * units + dim) * batch * 4


def test_a_loop_takes_its_bodys_time_once_per_iteration():
    from tflms.simulation.schedule import compile_view

    seconds = {}
    for seq in (16, 32):
        view = tflms.build_view(_lstm_step_graph(seq))
        compiled = compile_view(view, device="V100-16GB", link="pcie3")
        forward = _forward_loop(view).op
        assert view.nodes[forward]["body"].number_of_nodes() > 20  # the LSTM cell's ops
        seconds[seq] = compiled.durations[compiled.names.index(forward)]
    assert seconds[32] == pytest.approx(2 * seconds[16], rel=1e-9)
    assert seconds[16] > 16 * 5e-6  # at least a few kernel launches per step


def test_the_lists_a_loop_keeps_are_swapped_and_lower_the_peak():
    # two layers: the first one's lists can wait on the host while the second trains
    # (swap-ins triggered one level ahead: the second layer's gradient loop is one long op)
    view = tflms.build_view(_lstm_step_graph(32, units=64, layers=2))
    config = tflms.LMSConfig(swapout_threshold=4, swapin_ahead=1, min_tensor_bytes=0)
    plan = tflms.make_plan(view, config)
    lists = [s for s in plan.swaps if s.dtype == "variant"]
    loops = {n: d["loop"] for n, d in view.nodes(data=True) if "loop" in d}
    assert lists, plan.summary()
    for s in lists:
        assert s.bytes == loops[s.producer].list_bytes[s.index] > 0
        assert all(view.nodes[i.consumers[0][0]]["type"] == "StatelessWhile" for i in s.swap_ins)
    plain = tflms.simulate(view, accounting="tensors")
    swapped = tflms.simulate(view, plan, accounting="tensors")
    assert swapped.device_peak_bytes < plain.device_peak_bytes
    assert swapped.bytes_swapped_out >= sum(s.bytes for s in lists)


def test_a_loop_without_a_known_bound_is_reported(caplog):
    w = tf.Variable(tf.eye(16) * 0.5)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            _, y = tf.while_loop(
                lambda i, h: tf.reduce_sum(h) > 1.0, lambda i, h: (i + 1, tf.tanh(h @ w)), (0, x)
            )
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, w)

    graph = step.get_concrete_function(tf.TensorSpec([4, 16])).graph
    with caplog.at_level(logging.WARNING, logger="tflms.graph.view"):
        view = tflms.build_view(graph)
    assert view.graph["unbounded_loops"], "a data-dependent loop has no trip bound"
    facts = view.nodes[view.graph["unbounded_loops"][0]]["loop"]
    assert facts.trips is None and "maximum_iterations" in facts.bound
    assert any("cannot be sized" in r.getMessage() for r in caplog.records)


def test_a_cudnn_rnns_reserve_space_is_estimated_not_left_at_one_element():
    # what Keras traces on a GPU: one fused op, its per-step memory in an opaque buffer
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float16, [None, 100, 8], name="x")  # batch-major
        h = tf.zeros([2, 4, 16], tf.float16)  # bidirectional: 2 x (batch 4) x 16 units
        out = tf.raw_ops.CudnnRNNV3(
            input=x,
            input_h=h,
            input_c=h,
            params=tf.zeros([8], tf.float16),
            sequence_lengths=tf.fill([4], 100),
            rnn_mode="gru",
            direction="bidirectional",
            time_major=False,
            is_training=True,
        )
    view = tflms.build_view(g, batch_size=4)
    rnn = out[0].op.name
    assert view.graph["estimated_reserve_space"] == [rnn]
    # 100 steps x batch 4 x 2 directions x (3 gates + 2 states) x 16 units x 2 bytes
    assert view.nodes[rnn]["outputs"][3].bytes == 100 * 4 * 2 * 5 * 16 * 2
    plan = tflms.make_plan(view)
    assert any("reserve spaces are estimated" in note for note in plan.notes)


def _lm():
    return zoo.lstm_lm(vocab=97, seq=32, units=64)


def _fit(model, devices, callbacks=(), precision="float32"):
    x, y = zoo.synthetic_data(model, BATCH * 4)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
@pytest.mark.parametrize("options", ["aggressive", "default", "budgeted"])
def test_an_lstm_language_model_with_dropout_trains_bitwise(options, precision, devices):
    """The zoo's LSTM LM (Zaremba et al.'s medium architecture at a few thousand weights,
    dropout 0.5) trains bit for bit as without LMS, its loops' lists swapped."""
    keras.mixed_precision.set_global_policy(precision)
    try:
        plain = _fit(_lm(), devices)
        common = {"batch_size": BATCH, "device": devices.compute}
        if options == "aggressive":
            callback = tflms.LMSCallback(
                swapout_threshold=4, swapin_ahead=1, min_tensor_bytes=0, **common
            )
        elif options == "default":
            callback = tflms.LMSCallback(**common)
        else:
            roomy = tflms.LMSCallback(memory_budget="1GiB", safety_margin=0.0, **common)
            _fit(_lm(), devices, [roomy])
            need = roomy.tuning.baseline.device_peak_bytes
            # a gradient loop needs its own lists and in-flight terms at once: at this
            # size swaps can take off about 4% (the simulation is deterministic)
            callback = tflms.LMSCallback(
                memory_budget=int(need * 0.98), safety_margin=0.0, **common
            )
        swapped = _fit(_lm(), devices, [callback])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if options != "default":
        assert any(s.dtype == "variant" for s in callback.plan.swaps), callback.plan.summary()
    for a, b in zip(plain.get_weights(), swapped.get_weights(), strict=True):
        np.testing.assert_array_equal(b, a)


JUDGE = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import keras, tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tflms
    from tflms import zoo
    from tflms.simulation.measure import measure_cpu_step

    out = {}
    for kind in ("LSTM", "GRU"):
        keras.utils.set_random_seed(1)
        inp = keras.Input((256, 64))
        x = getattr(keras.layers, kind)(256, return_sequences=True)(inp)
        x = getattr(keras.layers, kind)(256)(x)
        model = keras.Model(inp, keras.layers.Dense(10)(x))
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.optimizer.build(model.trainable_variables)
        xs, ys = zoo.synthetic_data(model, 32)
        data = (tf.constant(xs), tf.constant(ys))
        step = tf.function(model.train_step, jit_compile=False)
        view = tflms.build_view(step.get_concrete_function(data).graph)
        m = measure_cpu_step(step, data, runs=3, profile=False)
        out[kind] = {"measured": list(m.peaks_bytes),
                     "simulated": tflms.simulate(view, accounting="tensors").device_peak_bytes}
    print(json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.measures
def test_two_layer_rnns_at_256_steps_are_simulated_near_the_cpu_allocators_peak():
    """The issue's models: 2-layer LSTM and GRU, 256 steps, batch 32 (measured 4.4-5.3x before).

    The simulator holds each gradient loop's running weight-gradient sums for
    all ``parallel_iterations`` (32) iterations TensorFlow may run at once: an
    upper bound; how far the CPU executor runs ahead varies from run to run.
    Measured here: 0.74x without those, 1.04-1.20x with them.
    """
    done = subprocess.run(
        [sys.executable, "-c", JUDGE],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=every_allocation_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, r in result.items():
        ratio = r["simulated"] / max(r["measured"])
        assert 0.85 <= ratio <= 1.3, (kind, ratio, r)
