"""ResNet-50 with TensorFlow 1.x's fused BatchNorm: the same model, the fused kernel's graph."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from numpy.lib.stride_tricks import sliding_window_view

import tflms
from tests.tolerances import summation_bound
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


def _assert_within(actual, desired, bound):
    """Elementwise ``|actual - desired| <= bound``, computed in float64."""
    diff = np.abs(np.asarray(actual, np.float64) - desired)
    bound = np.broadcast_to(bound, diff.shape)
    bad = np.argwhere(diff > bound)
    worst = [(i.tolist(), float(diff[tuple(i)]), float(bound[tuple(i)])) for i in bad[:5]]
    assert not len(bad), (
        f"{len(bad)} of {diff.size} beyond their bound (index, |diff|, bound): {worst}"
    )


def _head_bound(out_error, relu_out, kernel, bias):
    """Bounds on GAP's and ``y``'s rounding errors: ``out``'s, then GAP's 256 terms, Dense's 8 + bias."""
    gap = relu_out.mean((1, 2))
    gap_error = out_error.mean((1, 2)) + summation_bound(256, np.abs(relu_out).mean((1, 2)))
    y_error = gap_error @ np.abs(kernel)
    y_error += summation_bound(10, np.abs(gap) @ np.abs(kernel) + np.abs(bias))
    return gap, gap_error, y_error


def _batch_norm_step_bounds(x, z, weights, cotangent, epsilon):
    """First-order bounds on one kernel's rounding error in ``_small``'s training step.

    Any summation order: each N-term reduction errs by at most
    ``summation_bound`` of its terms' absolute sum (an elementwise rounding
    counts as one more term), carried to the results by the magnitude of its
    coefficient; to first order, so the magnitudes come from an exact
    (float64) step. ``z`` is the convolution's output (one kernel, the same
    bits in both models). Returns the bounds on ``y``, on each trainable
    weight's gradient (in ``trainable_weights`` order), and on the batch mean
    and variance.
    """
    _, _, gamma, beta, _, _, kernel, bias = weights
    ax, n = (0, 1, 2), z.shape[0] * z.shape[1] * z.shape[2]
    mu = z.mean(ax)
    var = ((z - mu) ** 2).mean(ax)
    s = 1 / np.sqrt(var + epsilon)
    zmag = np.abs(z) + np.abs(mu)  # |z - mu| before it cancels (Keras computes z*s - mu*s)
    xh = (z - mu) * s
    out = gamma * xh + beta
    gs = np.abs(gamma) * s
    # forward: the mean's and the variance's N-term sums (all three kernels take Σ(z - mean)²)
    d_mu = summation_bound(n, np.abs(z).mean(ax))
    d_var = summation_bound(n + 2, var)
    d_s = d_var / (2 * (var + epsilon)) + summation_bound(5, 1.0)  # relative; rsqrt to a few ulps
    out_error = gs * (d_mu + np.abs(z - mu) * d_s) + summation_bound(5, gs * zmag + np.abs(beta))
    gap, gap_error, y_error = _head_bound(out_error, np.maximum(out, 0), kernel, bias)
    # backward from a fixed cotangent: Dense's 4-term products, GAP's exact 1/256
    dgap = (cotangent @ kernel.T)[:, None, None, :]
    dgap_error = summation_bound(5, np.abs(cotangent) @ np.abs(kernel.T))[:, None, None, :]
    g = (out > 0) * dgap / 256
    kink = np.abs(out) <= out_error  # the relu's mask may differ there: all of g
    g_error = ((out > 0) * dgap_error + kink * np.abs(dgap)) / 256
    # BN backward: dz = gamma*s*(g - m1 - xh*m2), with m1 and m2 N-term means
    m1, m2 = g.mean(ax), (g * xh).mean(ax)
    m1_error = summation_bound(n, np.abs(g).mean(ax)) + g_error.mean(ax)
    m2_error = s * summation_bound(n + 2, (np.abs(g) * zmag).mean(ax))
    m2_error += (g_error * np.abs(xh)).mean(ax)
    dz = gamma * s * (g - m1 - xh * m2)
    dz_error = gs * (
        g_error
        + m1_error
        + np.abs(xh) * m2_error
        + s * d_mu * (np.abs(m2) + np.abs(xh * m1))  # d dz / d mu
        + (d_s + summation_bound(6, 1.0)) * (np.abs(g) + np.abs(m1) + 3 * np.abs(xh * m2))
    )
    # gradients: the conv kernel's and bias's sum N products of input patches and dz
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    patches = np.abs(sliding_window_view(padded, (3, 3), axis=(1, 2)))  # n, h, w, c, i, j
    conv = "nhwcij,nhwk->ijck"
    d_kernel = np.einsum(conv, patches, dz_error)
    d_kernel += summation_bound(n + 1, np.einsum(conv, patches, np.abs(dz)))
    d_gamma = s * summation_bound(n + 2, (np.abs(g) * zmag).sum(ax))
    d_gamma += (g_error * np.abs(xh) + np.abs(g) * (s * d_mu + np.abs(xh) * d_s)).sum(ax)
    grad_errors = [
        d_kernel,
        dz_error.sum(ax) + summation_bound(n, np.abs(dz).sum(ax)),
        d_gamma,
        g_error.sum(ax) + summation_bound(n, np.abs(g).sum(ax)),
        gap_error.T @ np.abs(cotangent) + summation_bound(9, np.abs(gap).T @ np.abs(cotangent)),
        summation_bound(8, np.abs(cotangent).sum(0)),
    ]
    return y_error, grad_errors, d_mu, d_var


def test_the_fused_layer_computes_keras_batch_norm_and_its_gradient():
    fused = _small(FusedBatchNormalization(momentum=0.9, epsilon=1e-3))
    plain = _small(keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3))
    plain.set_weights(fused.get_weights())
    weights = [w.astype(np.float64) for w in fused.get_weights()]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((8, 16, 16, 3), dtype=np.float32))
    # a fixed cotangent: the gradients carry the batch norm's rounding, not y's through a loss
    cotangent = rng.standard_normal((8, 4), dtype=np.float32)
    grads, outputs = [], []
    for model in (fused, plain):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_sum(y * cotangent)
        outputs.append(y.numpy())
        grads.append(tape.gradient(loss, model.trainable_weights))
    z = plain.layers[1](x).numpy().astype(np.float64)  # the same convolution kernel in both
    x64, cot64 = x.numpy().astype(np.float64), cotangent.astype(np.float64)
    y_error, grad_errors, d_mu, d_var = _batch_norm_step_bounds(x64, z, weights, cot64, 1e-3)
    # each kernel is within its bound of the exact value, so the two are within twice it
    _assert_within(outputs[0], outputs[1], 2 * y_error)
    for a, b, bound in zip(*grads, grad_errors, strict=True):
        _assert_within(a.numpy(), b.numpy(), 2 * bound)
    # the moving statistics moved the same way (the variance up to Bessel's correction)
    n = 8 * 16 * 16
    bn_f, bn_p = fused.layers[2], plain.layers[2]
    # 0.9 * 0 + 0.1 * mean: each kernel's mean bound, and one rounding of 0.1 * mean
    mean_bound = 0.1 * d_mu + summation_bound(2, 0.1 * np.abs(z.mean((0, 1, 2))))
    _assert_within(bn_f.moving_mean.numpy(), bn_p.moving_mean.numpy(), 2 * mean_bound)
    keep, step = np.float32(0.9), np.float32(0.1)  # the update's float32 constants
    moving_f, moving_p = (bn.moving_variance.numpy().astype(np.float64) for bn in (bn_f, bn_p))
    var_f = (moving_f - keep) / step * (n - 1) / n
    var_p = (moving_p - keep) / step
    # each kernel's variance bound, and <= 4 roundings of the update (magnitude <= the result) / 0.1
    _assert_within(var_f, var_p, 2 * (d_var + summation_bound(5, moving_p) / step))
    # inference on the same statistics: elementwise (about 7 roundings), then GAP and Dense
    bn_p.set_weights(bn_f.get_weights())
    _, _, gamma, beta, mean, variance, kernel, bias = (
        w.astype(np.float64) for w in fused.get_weights()
    )
    scale = np.abs(gamma) / np.sqrt(variance + 1e-3)
    out = gamma / np.sqrt(variance + 1e-3) * (z - mean) + beta
    out_error = summation_bound(8, scale * (np.abs(z) + np.abs(mean)) + np.abs(beta))
    *_, y_error = _head_bound(out_error, np.maximum(out, 0), kernel, bias)
    _assert_within(fused(x).numpy(), plain(x).numpy(), 2 * y_error)


def test_resnet50_with_fused_batch_norm_has_the_kernel_and_its_gradient_in_its_step():
    fused = resnet50(64, classes=5, batch_norm="fused")
    plain = resnet50(64, classes=5)
    plain.set_weights(fused.get_weights())
    assert sum(isinstance(layer, FusedBatchNormalization) for layer in fused.layers) == 53
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in fused.layers)
    x = np.random.default_rng(0).random((2, 64, 64, 3), dtype=np.float32)
    # A fresh BN (mean 0, variance 1, gamma 1, beta 0) multiplies by rsqrt(1 + epsilon):
    # a few roundings in either kernel (the constant to 2 ulps, the product to one).
    z = keras.Model(plain.input, plain.get_layer("conv1_bn").input)(x).numpy()
    norms = [model.get_layer("conv1_bn")(z).numpy() for model in (fused, plain)]
    epsilon = plain.get_layer("conv1_bn").epsilon
    _assert_within(norms[0], norms[1], 2 * summation_bound(5, np.abs(z) / np.sqrt(1 + epsilon)))
    if np.array_equal(*norms):
        # the kernels round alike, so every op downstream is one kernel on the same bits;
        # where they do not, no useful bound carries through 50 layers: this layer's is it
        np.testing.assert_array_equal(fused.predict(x, verbose=0), plain.predict(x, verbose=0))
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
