"""Analysis: variables created while a step is traced keep initializers no plan may touch.

Keras builds an optimizer's state (and a ``LossScaleOptimizer``'s counters)
in the first trace of a step when no distribution strategy built it before;
TensorFlow lifts those initializers out of the function when tracing ends
and refuses any that depends on a step op. A serialization chain over the
first levels once tied them to the variables' handles (``UnliftableError``
in ``LMSCallback``'s state trial under ``mixed_float16``).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms.graph.view import build_view


def _model(devices):
    keras.utils.set_random_seed(11)
    with tf.device(devices.compute):
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse", jit_compile=False)
    return model


def _fit(model, devices, callbacks=()):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 32)).astype("float32")
    y = rng.normal(size=(64, 4)).astype("float32")
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=list(callbacks))
    return [v.numpy() for v in model.weights + model.optimizer.variables]


def _traced_views(devices) -> list:
    """The views of each trace of a mixed_float16 Keras step that builds AdamW in its first."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _model(devices)
        views = []

        def step(batch):
            outputs = model.train_step(batch)
            views.append(build_view(tf.compat.v1.get_default_graph(), batch_size=16))
            return outputs

        specs = (tf.TensorSpec((16, 32)), tf.TensorSpec((16, 4)))
        with tf.device(devices.compute):
            tf.function(step, autograph=False).get_concrete_function(specs)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return views


def test_the_view_marks_the_initializers_of_an_optimizer_built_in_the_trace(devices):
    views = _traced_views(devices)
    first = views[0]
    marked = {n for n, d in first.nodes(data=True) if d["initializer"]}
    guards = {n for n, d in first.nodes(data=True) if d["type"] == "VarIsInitializedOp"}
    # AdamW's 2 slots per variable (6 variables), its counters, the loss scale's 2
    assert len(guards) >= 6 * 2 + 2 and guards <= marked
    assert any(n.startswith("loss_scale_optimizer/step_counter/Initializer") for n in marked)
    assert not any(first.nodes[n]["type"] in ("Placeholder", "MatMul") for n in marked)
    # the trace without variable creation has none
    assert not any(d["initializer"] for _, d in views[-1].nodes(data=True))


PLANS = {
    "serialized": dict(serialization=["0:12"]),
    "serialized+swaps": dict(serialization=["0:12"], swapout_threshold=1, min_tensor_bytes=0),
    "ordered+swaps": dict(reorder=True, swapout_threshold=1, min_tensor_bytes=0),
}


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_plan_over_the_first_levels_leaves_a_state_built_in_the_trace_alone(
    devices, policy, plan
):
    # serialization chains each level in the order its ops were made: TensorFlow orders a
    # traced step's stateful ops that way when tracing ends (chained by name, a Keras step
    # closed a cycle of 242 ops)
    keras.mixed_precision.set_global_policy(policy)
    try:
        plain = _fit(_model(devices), devices)
        callback = tflms.LMSCallback(
            device=devices.compute,
            host_device=devices.host,
            **PLANS[plan],
        )
        planned = _fit(_model(devices), devices, [callback])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert callback.plans
    if "serialization" in PLANS[plan]:
        assert any(p.serialization for p in callback.plans)
    else:
        assert any(p.order for p in callback.plans)
    assert len(plain) == len(planned)
    for a, b in zip(plain, planned, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "options",
    [
        dict(sync_mode=3, swapout_threshold=1, min_tensor_bytes=0),
        dict(recompute=True, swapout_threshold=1, min_tensor_bytes=0, swapin_ahead=1),
        dict(
            recompute=True,
            recompute_dense=0.25,
            reorder=True,
            swapout_threshold=0,
            min_tensor_bytes=0,
        ),
    ],
    ids=["sync", "recompute", "dense+order"],
)
def test_no_lever_touches_an_initializer_of_the_first_trace(devices, options):
    """Waits for swap-outs, swap-in and recompute triggers, re-runs and order edges: an
    initializer is lifted out of the function when tracing ends, so none may be one."""
    view = _traced_views(devices)[0]
    config = tflms.LMSConfig(device=devices.compute, host_device=devices.host, **options)
    plan = tflms.make_plan(view, config)
    touched = set(plan.touched())
    assert plan.swaps or plan.recomputes, plan.summary()
    initializers = {n for n, d in view.nodes(data=True) if d["initializer"]}
    assert initializers and not (touched & initializers), sorted(touched & initializers)
