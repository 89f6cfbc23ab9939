"""Models the planner's rules were not written for: what 2026 Keras users bring.

Each is written here the way its family's public Keras code writes it, small
enough that a CPU trains a few steps in a second, with layers the reference
models (:mod:`tests.tflms.keras_models`) do not have: hard-swish and
squeeze-excite (MobileNetV3), stochastic depth and layer scale (ConvNeXt),
patch embedding with a class token and tanh-approximate GELU (ViT), GroupNorm
with a time input (a diffusion U-Net), a masked bidirectional GRU over
Conv1D features, an encoder-decoder with cross attention and ``mask_zero``,
and RMSprop (whose ``a / sqrt(b)`` Grappler rewrites into ``a * rsqrt(b)``).

Every entry of :data:`USERS_MODELS` returns a compiled model with fixed seeds,
so two calls give the same initial weights; :func:`users_data` gives its data.
"""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["USERS_MODELS", "users_data"]

_SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mobilenet_v3(classes: int = 10) -> keras.Model:
    """Inverted residuals with hard-swish, depthwise convolutions and squeeze-excite."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("hard_swish")(h)
    for expand in (32, 48):
        x = keras.layers.Conv2D(expand, 1, use_bias=False)(h)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("hard_swish")(x)
        x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("hard_swish")(x)
        squeeze = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
        squeeze = keras.layers.Conv2D(8, 1, activation="relu")(squeeze)
        squeeze = keras.layers.Conv2D(expand, 1, activation="hard_sigmoid")(squeeze)
        x = keras.layers.Multiply()([x, squeeze])
        x = keras.layers.Conv2D(16, 1, use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        h = keras.layers.Add()([h, x])
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(classes)(h))
    model.compile(keras.optimizers.Adam(1e-3), _SPARSE)
    return model


class StochasticDepth(keras.layers.Layer):
    """Drops the residual branch per sample in training, scaled by ``1 / keep`` (as timm/KerasCV)."""

    def __init__(self, rate: float, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate
        self.seed = keras.random.SeedGenerator(7)

    def call(self, x, training=None):
        if not training:
            return x
        keep = 1.0 - self.rate
        shape = (keras.ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.ops.floor(keep + keras.random.uniform(shape, seed=self.seed))
        return x / keep * mask


class LayerScale(keras.layers.Layer):
    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],), initializer=keras.initializers.Constant(1e-1)
        )

    def call(self, x):
        return x * self.gamma


def convnext(classes: int = 10) -> keras.Model:
    """ConvNeXt blocks: 7x7 depthwise, LayerNorm, 4x GELU MLP, layer scale, stochastic depth."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(24, 4, strides=4)(inputs)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    for rate in (0.1, 0.2):
        x = keras.layers.DepthwiseConv2D(7, padding="same")(h)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x)
        x = keras.layers.Dense(96, activation="gelu")(x)
        x = keras.layers.Dense(24)(x)
        x = LayerScale()(x)
        h = keras.layers.Add()([h, StochasticDepth(rate)(x)])
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    model = keras.Model(inputs, keras.layers.Dense(classes)(h))
    model.compile(keras.optimizers.AdamW(1e-3, weight_decay=0.05), _SPARSE)
    return model


class ClassToken(keras.layers.Layer):
    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, x):
        batch = keras.ops.shape(x)[0]
        return keras.ops.concatenate([keras.ops.tile(self.token, (batch, 1, 1)), x], axis=1)


class PositionEmbedding(keras.layers.Layer):
    def build(self, input_shape):
        self.table = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal")

    def call(self, x):
        return x + self.table


def _gelu_tanh(x):
    return keras.activations.gelu(x, approximate=True)


def vit(classes: int = 10, dim: int = 32, heads: int = 4, layers: int = 2) -> keras.Model:
    """A Vision Transformer: patch embedding, class token, pre-norm blocks, tanh GELU."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(dim, 4, strides=4)(inputs)
    h = keras.layers.Reshape((16, dim))(h)
    h = PositionEmbedding()(ClassToken()(h))
    for _ in range(layers):
        x = keras.layers.LayerNormalization(epsilon=1e-6)(h)
        x = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=0.1)(x, x)
        h = keras.layers.Add()([h, x])
        x = keras.layers.LayerNormalization(epsilon=1e-6)(h)
        x = keras.layers.Dense(4 * dim, activation=_gelu_tanh)(x)
        x = keras.layers.Dropout(0.1)(keras.layers.Dense(dim)(x))
        h = keras.layers.Add()([h, x])
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    model = keras.Model(inputs, keras.layers.Dense(classes)(h[:, 0]))
    model.compile(keras.optimizers.AdamW(1e-3), _SPARSE)
    return model


def _time_embedding(t, dim):
    half = dim // 2
    freqs = keras.ops.exp(-np.log(1000.0) * keras.ops.arange(half, dtype="float32") / half)
    angles = t * freqs[None, :]
    return keras.ops.concatenate([keras.ops.sin(angles), keras.ops.cos(angles)], axis=-1)


def diffusion_unet(width: int = 16) -> keras.Model:
    """A denoising U-Net: GroupNorm + swish residual blocks, a sinusoidal time input, skips."""
    keras.utils.set_random_seed(1)
    image = keras.Input((16, 16, 3), name="noisy")
    time = keras.Input((1,), name="time")
    t = keras.layers.Lambda(lambda v: _time_embedding(v, width))(time)
    t = keras.layers.Dense(width, activation="swish")(t)

    def block(x, channels):
        h = keras.layers.GroupNormalization(4)(x)
        h = keras.layers.Activation("swish")(h)
        h = keras.layers.Conv2D(channels, 3, padding="same")(h)
        h = keras.layers.Add()(
            [h, keras.layers.Reshape((1, 1, channels))(keras.layers.Dense(channels)(t))]
        )
        h = keras.layers.GroupNormalization(4)(h)
        h = keras.layers.Activation("swish")(h)
        h = keras.layers.Conv2D(channels, 3, padding="same")(h)
        skip = x if x.shape[-1] == channels else keras.layers.Conv2D(channels, 1)(x)
        return keras.layers.Add()([skip, h])

    h = keras.layers.Conv2D(width, 3, padding="same")(image)
    down1 = block(h, width)
    down2 = block(keras.layers.AveragePooling2D(2)(down1), 2 * width)
    middle = block(down2, 2 * width)
    up = keras.layers.UpSampling2D()(middle)
    up = block(keras.layers.Concatenate()([up, down1]), width)
    out = keras.layers.Conv2D(3, 3, padding="same")(up)
    model = keras.Model([image, time], out)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


def conv_bigru(vocab: int = 50, classes: int = 5) -> keras.Model:
    """A tagger: masked embedding, Conv1D features, a bidirectional GRU, a tag per token."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((12,), dtype="int32")
    h = keras.layers.Embedding(vocab, 16)(tokens)
    h = keras.layers.Conv1D(16, 3, padding="same", activation="relu")(h)
    h = keras.layers.Bidirectional(keras.layers.GRU(16, return_sequences=True))(h)
    model = keras.Model(tokens, keras.layers.Dense(classes)(h))
    model.compile(keras.optimizers.Adam(1e-3), _SPARSE)
    return model


def encoder_decoder(vocab: int = 40, dim: int = 32, heads: int = 4) -> keras.Model:
    """A translation model: masked embeddings, self and cross attention, a causal decoder."""
    keras.utils.set_random_seed(1)
    source = keras.Input((10,), dtype="int32", name="source")
    target = keras.Input((10,), dtype="int32", name="target")
    s = keras.layers.Embedding(vocab, dim, mask_zero=True)(source)
    x = keras.layers.MultiHeadAttention(heads, dim // heads)(s, s)
    s = keras.layers.LayerNormalization()(keras.layers.Add()([s, x]))
    x = keras.layers.Dense(2 * dim, activation="relu")(s)
    s = keras.layers.LayerNormalization()(keras.layers.Add()([s, keras.layers.Dense(dim)(x)]))
    t = keras.layers.Embedding(vocab, dim, mask_zero=True)(target)
    x = keras.layers.MultiHeadAttention(heads, dim // heads)(t, t, use_causal_mask=True)
    t = keras.layers.LayerNormalization()(keras.layers.Add()([t, x]))
    x = keras.layers.MultiHeadAttention(heads, dim // heads)(t, s)
    t = keras.layers.LayerNormalization()(keras.layers.Add()([t, x]))
    x = keras.layers.Dense(2 * dim, activation="relu")(t)
    t = keras.layers.LayerNormalization()(keras.layers.Add()([t, keras.layers.Dense(dim)(x)]))
    model = keras.Model([source, target], keras.layers.Dense(vocab)(t))
    model.compile(keras.optimizers.Adam(1e-3), _SPARSE)
    return model


def mlp_rmsprop(width: int = 64, classes: int = 10) -> keras.Model:
    """An MLP trained with RMSprop (its update divides by a square root)."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(4):
        h = keras.layers.Dense(width, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(classes)(h))
    model.compile(keras.optimizers.RMSprop(1e-3), _SPARSE)
    return model


USERS_MODELS = {
    "mobilenet_v3": mobilenet_v3,
    "convnext": convnext,
    "vit": vit,
    "diffusion_unet": diffusion_unet,
    "conv_bigru": conv_bigru,
    "encoder_decoder": encoder_decoder,
    "mlp_rmsprop": mlp_rmsprop,
}


def users_data(model: keras.Model, n: int, *, seed: int = 0):
    """``(x, y)`` for ``model``: token ids from 1 (0 is padding), with some sequences padded."""
    rng = np.random.default_rng(seed)
    xs = []
    for spec in model.inputs:
        shape = (n, *spec.shape[1:])
        if "int" in str(spec.dtype):
            ids = rng.integers(1, 40, shape).astype("int32")
            ids[::3, -3:] = 0  # padding: mask_zero's masks are not all ones
            xs.append(ids)
        else:
            xs.append(rng.standard_normal(shape).astype("float32"))
    out = model.outputs[0]
    if model.loss == "mse":
        y = rng.standard_normal((n, *out.shape[1:])).astype("float32")
    else:
        y = rng.integers(0, out.shape[-1], (n, *out.shape[1:-1])).astype("int32")
    return (xs[0] if len(xs) == 1 else xs), y
