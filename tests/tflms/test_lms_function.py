"""tflms.function: a tf.function whose traced graphs are rewritten."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, cnn_bn
from tflms.errors import ConfigError

CONFIG = tflms.LMSConfig(
    batch_size=BATCH, swapout_threshold=8, swapin_ahead=3, min_tensor_bytes=1024
)


def custom_loop(decorate, steps=20):
    model, x, y = cnn_bn(BATCH * steps)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @decorate
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    losses = [
        float(train_step(x[i : i + BATCH], y[i : i + BATCH])) for i in range(0, len(x), BATCH)
    ]
    return model, losses, train_step


def test_custom_loop_trains_bitwise_identically(devices):
    with tf.device(devices.compute):
        plain, plain_losses, _ = custom_loop(tf.function)
        lms, lms_losses, step = custom_loop(tflms.function(config=CONFIG))
    assert lms_losses == plain_losses
    for a, b in zip(plain.get_weights(), lms.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert step.plans and all(isinstance(p, tflms.SwapPlan) for p in step.plans)
    x = tf.zeros([BATCH, 16, 16, 3])
    y = tf.zeros([BATCH], tf.int64)
    assert step.plan_for(x, y).swaps  # the concrete function in use was rewritten


def test_each_trace_gets_its_own_plan():
    @tflms.function(config=CONFIG.replace(swapout_threshold=2, min_tensor_bytes=0))
    def f(x):
        h = x
        for _ in range(6):
            h = tf.nn.relu(h @ tf.ones([h.shape[-1], h.shape[-1]]))
        return h + x

    f(tf.ones([2, 8]))
    f(tf.ones([2, 16]))
    assert len(f.plans) == 2
    assert f.plan_for(tf.ones([2, 8])) is not f.plan_for(tf.ones([2, 16]))
    assert f.__name__ == "f" and f.python_function.__name__ == "f"


def test_tf_function_options_pass_through():
    spec = [tf.TensorSpec([None, 4])]

    @tflms.function(input_signature=spec, reduce_retracing=True)
    def f(x):
        return tf.nn.relu(x)

    f(tf.ones([1, 4]))
    f(tf.ones([3, 4]))
    assert len(f.plans) == 1  # one signature, one trace


def test_methods_can_be_decorated():
    class Model:
        def __init__(self):
            self.w = tf.Variable(tf.ones([8, 8]))

        @tflms.function(config=CONFIG.replace(swapout_threshold=1, min_tensor_bytes=0))
        def step(self, x):
            h = x
            for _ in range(4):
                h = tf.nn.relu(h @ self.w)
            return tf.reduce_sum(h + x)

    m = Model()
    assert float(m.step(tf.ones([2, 8]))) > 0
    assert Model.step.plans


def test_jit_compile_is_refused():
    with pytest.raises(ConfigError, match="does not accept jit_compile=True"):
        tflms.function(lambda x: x, jit_compile=True)


def test_config_must_be_an_lms_config():
    with pytest.raises(ConfigError, match="config must be an LMSConfig"):
        tflms.function(lambda x: x, config={"swapin_ahead": 2})
