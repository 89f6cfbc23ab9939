"""Small Keras 3 models covering the layer families LMS must handle.

Each builder returns ``(model, x, y)`` with a compiled model (SGD, fixed
seed, no dropout) and enough data for the requested number of batches.
Shapes are small so a CPU trains 50 steps in seconds.
"""

from __future__ import annotations

import keras
import numpy as np

BATCH = 4


def _data(rng, x_shape, y_shape, n, classes=None):
    x = rng.standard_normal((n, *x_shape)).astype("float32")
    if classes:
        y = rng.integers(0, classes, (n, *y_shape)).astype("int64")
    else:
        y = rng.standard_normal((n, *y_shape)).astype("float32")
    return x, y


def _compile(model, loss):
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss, jit_compile=False)
    return model


def mlp(n):
    keras.utils.set_random_seed(7)
    inp = keras.Input((64,))
    x = inp
    for width in (256, 256, 256, 128):
        x = keras.layers.Dense(width, activation="relu")(x)
    out = keras.layers.Dense(10)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (model, *_data(np.random.default_rng(0), (64,), (), n, classes=10))


def cnn_bn(n):
    keras.utils.set_random_seed(7)
    inp = keras.Input((16, 16, 3))
    x = inp
    for filters in (8, 16, 16, 32):
        x = keras.layers.Conv2D(filters, 3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(10)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (model, *_data(np.random.default_rng(0), (16, 16, 3), (), n, classes=10))


def resnet(n):
    keras.utils.set_random_seed(7)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    for filters, stride in ((16, 1), (16, 1), (32, 2), (32, 1)):
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same")(x)
        y = keras.layers.BatchNormalization()(y)
        y = keras.layers.Activation("relu")(y)
        y = keras.layers.Conv2D(filters, 3, padding="same")(y)
        y = keras.layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride)(shortcut)
        x = keras.layers.Activation("relu")(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(10)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (model, *_data(np.random.default_rng(0), (16, 16, 3), (), n, classes=10))


def unet3d(n, size=16, base=4, depth=2, channels=2, classes=3):
    """A 3D U-Net: Conv3D, max pooling, upsampling, skip concatenations."""
    keras.utils.set_random_seed(7)
    inp = keras.Input((size, size, size, channels))
    x = inp
    skips = []
    for level in range(depth):
        f = base * 2**level
        x = keras.layers.Conv3D(f, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv3D(f, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = keras.layers.MaxPooling3D(2)(x)
    x = keras.layers.Conv3D(base * 2**depth, 3, padding="same", activation="relu")(x)
    for level in reversed(range(depth)):
        f = base * 2**level
        x = keras.layers.UpSampling3D(2)(x)
        x = keras.layers.Concatenate()([x, skips[level]])
        x = keras.layers.Conv3D(f, 3, padding="same", activation="relu")(x)
    out = keras.layers.Conv3D(classes, 1)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (
        model,
        *_data(
            np.random.default_rng(0),
            (size, size, size, channels),
            (size, size, size),
            n,
            classes=classes,
        ),
    )


def transformer(n, seq=32, dim=32, heads=4):
    """One Transformer encoder block: MultiHeadAttention, LayerNorm, MLP."""
    keras.utils.set_random_seed(7)
    inp = keras.Input((seq, dim))
    attn = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(inp, inp)
    x = keras.layers.LayerNormalization()(inp + attn)
    ff = keras.layers.Dense(4 * dim, activation="gelu")(x)
    ff = keras.layers.Dense(dim)(ff)
    x = keras.layers.LayerNormalization()(x + ff)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(10)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (model, *_data(np.random.default_rng(0), (seq, dim), (), n, classes=10))


def lstm(n, seq=12, dim=16):
    """An LSTM: its time loop is a While op whose body LMS must leave alone."""
    keras.utils.set_random_seed(7)
    inp = keras.Input((seq, dim))
    x = keras.layers.Dense(64, activation="relu")(inp)
    x = keras.layers.LSTM(32)(x)
    out = keras.layers.Dense(10)(x)
    model = _compile(
        keras.Model(inp, out), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return (model, *_data(np.random.default_rng(0), (seq, dim), (), n, classes=10))


MODELS = {
    "mlp": mlp,
    "cnn_bn": cnn_bn,
    "resnet": resnet,
    "unet3d": unet3d,
    "transformer": transformer,
    "lstm": lstm,
}
