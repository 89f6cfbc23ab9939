"""The isensee2017 zoo model: shapes, parameter count, instance norm, Dice loss, training, errors."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tflms
from tests.tolerances import EPS32, summation_bound
from tflms import zoo
from tflms.errors import ConfigError
from tflms.zoo.isensee import (
    InstanceNormalization,
    Keras2LeakyReLU,
    Keras2UpSampling3D,
    WeightedDiceLoss,
    isensee2017,
)

SMALL = dict(edge=16, depth=3, base_filters=2, segmentation_levels=2)


@pytest.fixture(scope="module")
def small():
    return isensee2017(**SMALL)


def conv(k: int, cin: int, cout: int) -> int:
    return k**3 * cin * cout + cout


def block(k: int, cin: int, cout: int) -> int:
    """Conv3D + a per-channel normalization (gamma and beta)."""
    return conv(k, cin, cout) + 2 * cout


def expected_params(channels, base_filters, depth, labels, segmentation_levels) -> int:
    f = [base_filters * 2**level for level in range(depth)]
    total = 0
    for level in range(depth):
        cin = channels if level == 0 else f[level - 1]
        total += block(3, cin, f[level])  # entry convolution (strided below level 0)
        total += 2 * block(3, f[level], f[level])  # context module
    for level in range(depth - 1):
        total += block(3, f[level + 1], f[level])  # up-sampling module
        total += block(3, 2 * f[level], f[level])  # localization, on the concatenation
        total += block(1, f[level], f[level])
    total += sum(conv(1, f[level], labels) for level in range(segmentation_levels))
    return total


def test_output_shape_and_sigmoid_range(small):
    assert small.input_shape == (1, 16, 16, 16, 4)
    assert small.output_shape == (1, 16, 16, 16, 3)
    x = np.random.default_rng(0).standard_normal((1, 16, 16, 16, 4)).astype("float32") * 10
    y = np.asarray(small.predict(x, verbose=0))
    assert y.shape == (1, 16, 16, 16, 3)
    assert np.all((y >= 0) & (y <= 1)) and y.std() > 0


@pytest.mark.parametrize(
    "options",
    [
        dict(channels=4, base_filters=2, depth=3, labels=3, segmentation_levels=2),
        dict(channels=2, base_filters=3, depth=4, labels=2, segmentation_levels=3),
        dict(channels=1, base_filters=2, depth=4, labels=1, segmentation_levels=1),
    ],
)
def test_parameter_count_matches_the_architecture(options):
    model = isensee2017(16, **options)
    assert model.count_params() == expected_params(**options)
    counts = {}
    for layer in model.layers:
        kind = type(layer).__name__
        counts[kind] = counts.get(kind, 0) + 1
    depth = options["depth"]
    assert counts["InstanceNormalization"] == 3 * depth + 3 * (depth - 1)
    assert counts["SpatialDropout3D"] == depth
    assert counts["UpSampling3D"] == depth - 1 + options["segmentation_levels"] - 1


def test_group_norm_has_the_same_parameters():
    model = isensee2017(norm="group", **SMALL)
    assert model.count_params() == expected_params(4, 2, 3, 3, 2)
    assert not any(isinstance(layer, InstanceNormalization) for layer in model.layers)


def keras_contrib_instance_norm(x, gamma, beta, epsilon):
    axes = tuple(range(1, x.ndim - 1))
    mean = x.mean(axis=axes, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True)) + epsilon
    return (x - mean) / std * gamma + beta


def instance_norm_error_bound(x, gamma, beta, epsilon):
    """First-order bound on the float32 layer's rounding error, in any summation order."""
    axes = tuple(range(1, x.ndim - 1))
    n = int(np.prod([x.shape[a] for a in axes]))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    std = np.sqrt((centered**2).mean(axis=axes, keepdims=True))
    scale = np.abs(gamma) / (std + epsilon)
    # the mean: n terms and the division; the variance: x - mean and its square, n terms, /n
    d_mean = summation_bound(n + 1, np.abs(x).mean(axis=axes, keepdims=True))
    d_var = summation_bound(n + 4, std**2)
    d_std = d_var / (2 * std) + summation_bound(3, std + epsilon)  # then sqrt and + epsilon
    # (x - mean) / std * gamma + beta: four roundings, on top of the statistics' errors
    return scale * (d_mean + np.abs(centered) * d_std / (std + epsilon)) + summation_bound(
        5, scale * np.abs(centered) + np.abs(beta)
    )


@pytest.mark.parametrize("epsilon", [1e-3, 0.5])
def test_instance_norm_matches_keras_contrib_arithmetic(epsilon):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, 4, 5, 6)) * 0.2 + 3).astype("float32")
    layer = InstanceNormalization(epsilon=epsilon)
    layer.build(x.shape)
    gamma = rng.uniform(0.5, 2, 6).astype("float32")
    beta = rng.standard_normal(6).astype("float32")
    layer.set_weights([gamma, beta])
    out = np.asarray(layer(x))
    x64, gamma64, beta64 = (a.astype("float64") for a in (x, gamma, beta))
    ref = keras_contrib_instance_norm(x64, gamma64, beta64, epsilon)
    bound = instance_norm_error_bound(x64, gamma64, beta64, epsilon)
    np.testing.assert_array_less(np.abs(out - ref), bound)  # 60-term statistics, any order
    # epsilon on the standard deviation: not sqrt(var + eps) as GroupNormalization does,
    # which the check above tells apart (a layer computing it would be out of its bound)
    var_eps = (x64 - x64.mean(axis=(1, 2, 3), keepdims=True)) / np.sqrt(
        x64.var(axis=(1, 2, 3), keepdims=True) + epsilon
    ) * gamma64 + beta64
    assert np.any(np.abs(var_eps - ref) > 2 * bound)


def test_dice_loss_perfect_disjoint_and_numpy():
    loss = WeightedDiceLoss()
    rng = np.random.default_rng(2)
    y = (rng.random((2, 4, 4, 4, 3)) < 0.3).astype("float32")
    # sums of {0, 1} are exact, so numerator and denominator are one float and dice is 1:
    # exactly under IEEE division, else within the division's and the means' 6 roundings
    assert float(loss(y, y)) == pytest.approx(-1.0, abs=summation_bound(7, 1.0))
    # nothing shared: smooth / (64 + smooth) per label, after 4 roundings (+, /, the mean's 2)
    smooth = float(np.float32(1e-5))
    expected = -smooth / (64 + smooth)
    assert float(loss(y, 1.0 - y)) == pytest.approx(expected, rel=summation_bound(5, 1.0))
    p = rng.random((2, 4, 4, 4, 3)).astype("float32")
    y64, p64 = y.astype("float64"), p.astype("float64")
    inter = (y64 * p64).sum(axis=(1, 2, 3))
    dice = (2 * inter + 1e-5) / (y64.sum(axis=(1, 2, 3)) + p64.sum(axis=(1, 2, 3)) + 1e-5)
    # two 64-term sums of nonnegative terms (relative gamma_63 each), then <= 8 roundings
    rel = 2 * summation_bound(64, 1.0) + summation_bound(9, 1.0)
    assert float(loss(y, p)) == pytest.approx(-dice.mean(), rel=rel)
    np.testing.assert_allclose(np.asarray(loss.call(y, p)), -dice.mean(axis=-1), rtol=rel)
    assert not loss.sparse_labels and loss.binary_labels


def test_one_training_step(small):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 16, 16, 4)).astype("float32")
    y = (rng.random((1, 16, 16, 16, 3)) < 0.2).astype("float32")
    history = small.fit(x, y, batch_size=1, epochs=1, verbose=0)
    (value,) = history.history["loss"]
    assert np.isfinite(value) and -1.0 <= value <= 0.0
    assert float(small.optimizer.learning_rate) == pytest.approx(5e-4)  # float32: one rounding
    assert type(small.optimizer).__name__ == "Adam"


def test_synthetic_data_has_binary_label_maps(small):
    # the Dice loss scores {0, 1} maps, one per label (binary_labels)
    x, y = zoo.synthetic_data(small, 2)
    assert x.shape == (2, 16, 16, 16, 4) and y.shape == (2, 16, 16, 16, 3)
    assert str(y.dtype) == "float32" and set(np.unique(y)) == {0.0, 1.0}


def test_analyze_and_simulate(small):
    view = tflms.analyze(small, batch_size=1)
    assert view.graph["batch_size"] == 1
    assert view.number_of_nodes() > 100
    result = tflms.simulate(view)
    assert result.device_peak_bytes > 16**3 * 3 * 4


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(edge=18, depth=3), r"multiple of 2\*\*\(depth-1\) = 4; e\.g\. edge=16"),
        (dict(edge=16, depth=3, norm="batch"), r"norm must be one of \('instance', 'group'\)"),
        (dict(edge=16, depth=3, segmentation_levels=4), r"use segmentation_levels=2"),
        (dict(edge=16, depth=3, segmentation_levels=3), r"between 1 and depth-1 = 2"),
        (dict(edge=16, depth=1), r"depth must be at least 2"),
        (dict(edge=16, depth=3, segmentation_levels=2, dropout=1.0), r"dropout must be in"),
        (dict(edge=16, depth=3, segmentation_levels=2, arithmetic="tf2"), r"arithmetic must be"),
    ],
)
def test_config_errors(options, match):
    with pytest.raises(ConfigError, match=match):
        isensee2017(**options)


def test_the_tf1_layers_compute_what_keras3_layers_compute():
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 2, 3)).astype("float32")
    leaky = keras.layers.LeakyReLU(negative_slope=0.3)(x)
    # each element is x, or 0.3f * x rounded once (relu(-x) and 0 - y are exact), in both
    np.testing.assert_allclose(Keras2LeakyReLU(0.3)(x), leaky, rtol=EPS32)
    up = keras.layers.UpSampling3D(2)(x)
    np.testing.assert_array_equal(Keras2UpSampling3D()(x), up)
    assert Keras2UpSampling3D().compute_output_shape((1, 4, 6, 2, 3)) == (1, 8, 12, 4, 3)


def test_the_tf1_arithmetic_has_the_same_weights_and_holds_more():
    tf1 = isensee2017(**SMALL, arithmetic="tf1")
    keras3 = isensee2017(**SMALL)
    assert tf1.count_params() == keras3.count_params()
    ops = {node["type"] for _, node in tflms.analyze(tf1, batch_size=1).nodes(data=True)}
    assert {"Neg", "Split"} <= ops  # relu(x) - a * relu(-x); split + concat per axis
    peaks = [
        tflms.simulate(tflms.analyze(m, batch_size=1), accounting="tensors").device_peak_bytes
        for m in (keras3, tf1)
    ]
    assert peaks[1] > peaks[0]
