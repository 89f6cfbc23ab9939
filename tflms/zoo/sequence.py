"""Dense and sequence models of the zoo: an MLP, a Transformer encoder, an LSTM.

Example:
    >>> mlp(features=8, widths=(16,)).output_shape
    (None, 10)
"""

from __future__ import annotations

import keras

from tflms.zoo.compiling import compiled

__all__ = ["mlp", "transformer", "lstm"]


def _sparse_logits():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(
    features: int = 64,
    widths: tuple[int, ...] = (256, 256, 256, 128),
    *,
    classes: int = 10,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """Dense ReLU layers of the given widths, then a classifier.

    Args:
        features: input features.
        widths: units of each hidden layer.
        classes: output classes (logits, sparse labels).
        optimizer: ``"sgd"`` or ``"adam"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    inp = keras.Input((features,))
    x = inp
    for width in widths:
        x = keras.layers.Dense(width, activation="relu")(x)
    out = keras.layers.Dense(classes)(x)
    return compiled(keras.Model(inp, out, name="mlp"), _sparse_logits(), optimizer)


def transformer(
    seq: int = 32,
    dim: int = 32,
    *,
    heads: int = 4,
    blocks: int = 1,
    mlp_dim: int | None = None,
    classes: int = 10,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """A Transformer encoder (post-LayerNorm, as BERT) with a pooled classifier.

    Args:
        seq: tokens per sample.
        dim: token width.
        heads: attention heads.
        blocks: encoder blocks.
        mlp_dim: hidden width of each block's GELU MLP (default ``4 * dim``).
        classes: output classes (logits, sparse labels).
        optimizer: ``"sgd"`` or ``"adam"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    inp = keras.Input((seq, dim))
    x = inp
    for _ in range(blocks):
        attn = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + attn)
        ff = keras.layers.Dense(mlp_dim or 4 * dim, activation="gelu")(x)
        ff = keras.layers.Dense(dim)(ff)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + ff)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(classes)(x)
    return compiled(keras.Model(inp, out, name="transformer"), _sparse_logits(), optimizer)


def lstm(
    seq: int = 12,
    dim: int = 16,
    *,
    units: int = 32,
    classes: int = 10,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """Dense + LSTM + classifier; the LSTM's time loop is a ``While`` op LMS leaves alone.

    Args:
        seq: time steps per sample.
        dim: features per step.
        units: LSTM units.
        classes: output classes (logits, sparse labels).
        optimizer: ``"sgd"`` or ``"adam"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    inp = keras.Input((seq, dim))
    x = keras.layers.Dense(64, activation="relu")(inp)
    x = keras.layers.LSTM(units)(x)
    out = keras.layers.Dense(classes)(x)
    return compiled(keras.Model(inp, out, name="lstm"), _sparse_logits(), optimizer)
