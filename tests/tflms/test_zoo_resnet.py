"""ResNet-50 with TensorFlow 1.x's fused BatchNorm: the same model, the fused kernel's graph."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms.errors import ConfigError
from tflms.zoo.vision import FusedBatchNormalization, resnet50


def _small(norm_layer):
    keras.utils.set_random_seed(3)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inp)
    x = norm_layer(x)
    x = keras.layers.Activation("relu")(x)
    out = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inp, out)


def test_the_fused_layer_computes_keras_batch_norm_and_its_gradient():
    fused = _small(FusedBatchNormalization(momentum=0.9, epsilon=1e-3))
    plain = _small(keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3))
    plain.set_weights(fused.get_weights())
    x = tf.constant(np.random.default_rng(0).random((8, 16, 16, 3), dtype=np.float32))
    grads, outputs = [], []
    for model in (fused, plain):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_sum(y * y)
        outputs.append(y.numpy())
        grads.append(tape.gradient(loss, model.trainable_weights))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)
    scale = max(float(np.abs(g.numpy()).max()) for g in grads[1])
    for a, b in zip(*grads, strict=True):  # the conv bias's gradient is 0 up to rounding
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-5 * scale)
    # the moving statistics moved the same way (the variance up to Bessel's correction)
    n = 8 * 16 * 16
    bn_f, bn_p = fused.layers[2], plain.layers[2]
    np.testing.assert_allclose(bn_f.moving_mean.numpy(), bn_p.moving_mean.numpy(), atol=1e-6)
    var_f = (bn_f.moving_variance.numpy() - 0.9) / 0.1 * (n - 1) / n
    var_p = (bn_p.moving_variance.numpy() - 0.9) / 0.1
    np.testing.assert_allclose(var_f, var_p, rtol=1e-4)
    np.testing.assert_allclose(fused(x).numpy(), plain(x).numpy(), rtol=1e-4, atol=1e-5)


def test_resnet50_with_fused_batch_norm_has_the_kernel_and_its_gradient_in_its_step():
    fused = resnet50(64, classes=5, batch_norm="fused")
    plain = resnet50(64, classes=5)
    plain.set_weights(fused.get_weights())
    assert sum(isinstance(layer, FusedBatchNormalization) for layer in fused.layers) == 53
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in fused.layers)
    x = np.random.default_rng(0).random((2, 64, 64, 3), dtype=np.float32)
    np.testing.assert_allclose(fused.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6)
    types = {data["type"] for _, data in tflms.analyze(fused, batch_size=2).nodes(data=True)}
    assert {"FusedBatchNormV3", "FusedBatchNormGradV3"} <= types
    plain_types = {d["type"] for _, d in tflms.analyze(plain, batch_size=2).nodes(data=True)}
    assert "FusedBatchNormV3" not in plain_types


def test_bad_inputs_are_refused_with_the_alternative():
    with pytest.raises(ConfigError, match="batch_norm must be one of"):
        resnet50(32, batch_norm="tf1")
    with pytest.raises(ConfigError, match="Use keras.layers.BatchNormalization"):
        FusedBatchNormalization()(keras.Input((4, 4, 4, 2)))
    layer = FusedBatchNormalization(momentum=0.9, epsilon=1e-5, name="bn")
    assert FusedBatchNormalization.from_config(layer.get_config()).momentum == 0.9


def test_the_fused_layer_trains_under_mixed_precision():
    # float16 activations, float32 parameters and statistics, as the kernel wants
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _small(FusedBatchNormalization())
        model.compile(optimizer="sgd", loss="mse")
        x = np.random.default_rng(1).random((4, 16, 16, 3), dtype=np.float32)
        loss = model.train_on_batch(x, np.zeros((4, 4), np.float32))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    norm = model.layers[2]
    assert np.isfinite(loss)
    assert norm.compute_dtype == "float16"
    assert {w.dtype for w in norm.weights} == {"float32"}
    assert not np.allclose(norm.moving_mean.numpy(), 0.0)  # the statistics moved
