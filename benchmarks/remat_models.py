"""Models for the recomputation side-by-side (``bench_remat.py``): block stacks whose blocks
can be wrapped whole by Keras's ``RematScope(mode="full")``.

Each model is a stack of :class:`Block` layers. A block's sublayers are made in
``build``, at its first call, so a block created inside a ``RematScope`` is
rematerialized as one piece (``tf.recompute_grad`` of its ``call``, one
positional tensor in and out) while its sublayers are not - which is how
Keras's scope is usable in a TensorFlow step at all: created inside the scope,
``Dense``, ``BatchNormalization`` and ``MultiHeadAttention`` themselves fail
in ``tf.function`` (they take keyword arguments, which ``tf.recompute_grad``
refuses). :func:`remat_layer_failures` records those failures.

Families (``MODELS``):

* ``gpt``: a GPT-style decoder, 4 blocks, width 256, sequence 256, vocabulary
  8192 (causal attention + GELU MLP, pre-LayerNorm, residual stream);
* ``cnn``: 6 Conv + BatchNorm + ReLU blocks at 64x64 (BatchNorm in training
  mode: its statistics are part of the forward pass);
* ``mlp``: a residual MLP, 8 blocks of width 1024 (tabular / recommender
  towers);
* ``tcn``: a temporal convolution network, 6 dilated Conv1D blocks with
  residual connections (audio / time series).
"""

from __future__ import annotations

import re

import keras
import numpy as np

__all__ = ["MODELS", "Block", "build", "batch", "remat_layer_failures"]


class Block(keras.layers.Layer):
    """One residual block of a family; its sublayers are built at the first call."""

    def __init__(self, family: str, width: int, index: int, **kwargs):
        super().__init__(**kwargs)
        self.family, self.width, self.index = family, width, index

    def build(self, input_shape):
        w = self.width
        if self.family == "gpt":
            self.norm1 = keras.layers.LayerNormalization(epsilon=1e-5)
            self.attention = keras.layers.MultiHeadAttention(4, w // 4)
            self.norm2 = keras.layers.LayerNormalization(epsilon=1e-5)
            self.up = keras.layers.Dense(4 * w, activation="gelu")
            self.down = keras.layers.Dense(w)
        elif self.family == "cnn":
            self.conv = keras.layers.Conv2D(w, 3, padding="same", use_bias=False)
            self.norm = keras.layers.BatchNormalization()
        elif self.family == "mlp":
            self.norm = keras.layers.LayerNormalization(epsilon=1e-5)
            self.up = keras.layers.Dense(2 * w, activation="relu")
            self.down = keras.layers.Dense(w)
        else:  # tcn
            self.conv1 = keras.layers.Conv1D(
                w, 3, padding="causal", dilation_rate=2 ** (self.index % 4), activation="relu"
            )
            self.conv2 = keras.layers.Conv1D(w, 1)
        super().build(input_shape)

    def call(self, x):
        if self.family == "gpt":
            h = self.norm1(x)
            x = x + self.attention(h, h, use_causal_mask=True)
            return x + self.down(self.up(self.norm2(x)))
        if self.family == "cnn":
            return keras.ops.relu(self.norm(self.conv(x), training=True))
        if self.family == "mlp":
            return x + self.down(self.up(self.norm(x)))
        return x + self.conv2(self.conv1(x))


MODELS = {
    # family: (blocks, width, input shape, classes or vocabulary)
    "gpt": (4, 256, (256,), 8192),
    "cnn": (6, 32, (64, 64, 3), 10),
    "mlp": (8, 1024, (1024,), 100),
    "tcn": (6, 128, (1024, 16), 10),
}
BATCH = {"gpt": 8, "cnn": 16, "mlp": 512, "tcn": 16}


def build(family: str, remat: bool, seed: int = 0, *, blocks: int | None = None) -> keras.Model:
    """The family's model; ``remat``: each block created inside ``RematScope(mode="full")``;
    ``blocks`` overrides the family's block count (the tests' smaller stacks)."""
    default_blocks, width, shape, classes = MODELS[family]
    blocks = blocks or default_blocks
    keras.utils.set_random_seed(seed)
    if family == "gpt":
        inputs = keras.Input(shape, dtype="int32")
        x = keras.layers.Embedding(classes, width)(inputs)
    else:
        inputs = keras.Input(shape)
        x = keras.layers.Dense(width)(inputs) if family != "cnn" else inputs
        if family == "cnn":
            x = keras.layers.Conv2D(width, 3, padding="same")(x)
    for i in range(blocks):
        if remat:
            with keras.RematScope(mode="full"):
                block = Block(family, width, i)
        else:
            block = Block(family, width, i)
        x = block(x)
    if family == "gpt":
        x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    elif family == "cnn":
        x = keras.layers.GlobalAveragePooling2D()(x)
    elif family == "tcn":
        x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name=family)


def batch(family: str, seed: int = 1):
    """One batch ``(x, y)`` of the family's inputs and sparse targets, as numpy arrays."""
    _, _, shape, classes = MODELS[family]
    rng = np.random.default_rng(seed)
    n = BATCH[family]
    if family == "gpt":
        x = rng.integers(0, classes, (n, *shape), dtype=np.int32)
        y = rng.integers(0, classes, (n, *shape), dtype=np.int32)
    else:
        x = rng.standard_normal((n, *shape)).astype(np.float32)
        y = rng.integers(0, classes, (n,), dtype=np.int32)
    return x, y


def remat_layer_failures() -> dict[str, str]:
    """What Keras's scope does to single layers in a TensorFlow step: ``{layer: error}``."""
    import tensorflow as tf

    found = {}
    makers = {
        "Dense": lambda: keras.layers.Dense(8),
        "BatchNormalization": lambda: keras.layers.BatchNormalization(),
        "MultiHeadAttention": lambda: keras.layers.MultiHeadAttention(2, 4),
    }
    for name, make in makers.items():
        with keras.RematScope(mode="full"):
            layer = make()
        x = tf.ones((2, 4, 8))

        @tf.function
        def step(x, layer=layer, name=name):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, x) if name == "MultiHeadAttention" else layer(x, training=True)
                loss = tf.reduce_sum(y)
            return tape.gradient(loss, x)

        try:
            step(x)
            found[name] = "ran"
        except Exception as err:  # noqa: BLE001 - the error is the finding
            found[name] = f"{type(err).__name__}: {_cause(str(err))}"
    return found


def _cause(message: str) -> str:
    """The line of a Keras error that says what went wrong (before "Arguments received")."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in message.splitlines()]
    lines = [line for line in lines if line]
    for i, line in enumerate(lines):
        if line.startswith("Arguments received by") and i:
            return lines[i - 1][:200]
    return lines[-1][:200] if lines else ""
