"""Language models of the zoo with their published configurations: BERT-base, GPT-2 small, an LSTM LM.

Both are built from ``keras.layers`` as a user would (``Embedding``,
``MultiHeadAttention``, ``LayerNormalization``, ``Dropout``, GELU MLPs) and
train a token-level loss over the whole vocabulary, the op that caps the batch
of such models. The defaults are the published sizes; every size is a
parameter, so a test trains the same architecture at a few thousand weights.

=========  ========================================================================
``bert``   BERT-base (Devlin et al., NAACL 2019): 12 post-LayerNorm blocks, width
           768, 12 heads, MLP 3072, vocabulary 30522, 512 positions, dropout 0.1,
           LayerNorm epsilon 1e-12; trained as a masked LM over every position
           (the token-level loss of its pre-training, without the [MASK] sampling)
``gpt2``   GPT-2 small (Radford et al., 2019; medium, large and XL: ``gpt2(**GPT2_SIZES["xl"])``):
           12 pre-LayerNorm blocks, width 768,
           12 heads, MLP 3072, vocabulary 50257, 1024 positions, dropout 0.1,
           LayerNorm epsilon 1e-5, causal attention, a final LayerNorm; trained as
           a causal LM. Its output projection is a separate ``Dense`` (GPT-2 ties
           it to the token embedding: 38.6M fewer weights, the same activations)
``lstm_lm`` the medium LSTM language model of Zaremba, Sutskever and Vinyals
           ("Recurrent Neural Network Regularization", 2014): 2 LSTM layers of
           650 units, 650-wide embeddings, vocabulary 10000 (Penn Treebank), 35
           unrolled steps, dropout 0.5 on the non-recurrent connections, SGD; its
           time loops are ``While`` ops (on a GPU Keras runs cuDNN's fused LSTM)
=========  ========================================================================

Example:
    >>> model = gpt2(vocab=50, seq=8, dim=16, heads=2, layers=1)
    >>> model.output_shape
    (None, 8, 50)
"""

from __future__ import annotations

import keras

from tflms.zoo.compiling import compiled

__all__ = ["bert", "gpt2", "lstm_lm", "GPT2_SIZES", "PositionEmbedding"]

GPT2_SIZES = {
    "small": dict(layers=12, dim=768, heads=12),
    "medium": dict(layers=24, dim=1024, heads=16),
    "large": dict(layers=36, dim=1280, heads=20),
    "xl": dict(layers=48, dim=1600, heads=25),
}
"""GPT-2's four published sizes (Radford et al., 2019, table 2), as :func:`gpt2` keywords:
117M parameters (with this zoo's untied head: 163M), 345M (406M), 762M (838M) and 1542M (1.64B)."""


def _token_loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@keras.saving.register_keras_serializable(package="tflms.zoo")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to its input (GPT-2's and BERT's).

    A weight of ``(seq, width)`` trained with the rest, initialized as
    ``keras.layers.Embedding``'s table is. (Calling an ``Embedding`` on
    ``keras.ops.arange(seq)`` while building a functional model would bake
    its lookup into the model as a constant: an untrained position signal.)

    Example:
        >>> layer = PositionEmbedding(8)
        >>> y = layer(keras.ops.zeros((2, 8, 4)))
        >>> tuple(y.shape), [tuple(w.shape) for w in layer.weights]
        ((2, 8, 4), [(8, 4)])
    """

    def __init__(self, seq: int, **kwargs):
        super().__init__(**kwargs)
        self.seq = seq

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            shape=(self.seq, input_shape[-1]), initializer="uniform", name="embeddings"
        )

    def call(self, x):
        return x + keras.ops.cast(self.embeddings, x.dtype)

    def get_config(self):
        return {**super().get_config(), "seq": self.seq}


def _embedded(tokens, vocab: int, seq: int, dim: int):
    x = keras.layers.Embedding(vocab, dim, name="token_embedding")(tokens)
    return PositionEmbedding(seq, name="position_embedding")(x)


def bert(
    vocab: int = 30522,
    seq: int = 512,
    dim: int = 768,
    *,
    heads: int = 12,
    layers: int = 12,
    mlp_dim: int | None = None,
    dropout: float = 0.1,
    optimizer: str = "adamw",
    seed: int = 7,
) -> keras.Model:
    """BERT-base's encoder with a masked-LM head over every position (see above).

    Args:
        vocab: vocabulary size (30522).
        seq: tokens per sample (512).
        dim: hidden width (768).
        heads: attention heads (12).
        layers: encoder blocks (12).
        mlp_dim: MLP width (default ``4 * dim``: 3072).
        dropout: dropout rate on embeddings, attention probabilities and block outputs (0.1).
        optimizer: a name of :data:`~tflms.zoo.compiling.OPTIMIZERS` (AdamW).
        seed: Keras' random seed for the initial weights and dropout.

    Returns:
        The compiled model: int32 token ids ``(batch, seq)`` in, logits
        ``(batch, seq, vocab)`` out, sparse token targets.
    """
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = keras.layers.LayerNormalization(epsilon=1e-12)(_embedded(tokens, vocab, seq, dim))
    x = keras.layers.Dropout(dropout)(x)
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=dropout)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(
            x + keras.layers.Dropout(dropout)(attention)
        )
        h = keras.layers.Dense(mlp_dim or 4 * dim, activation="gelu")(x)
        h = keras.layers.Dropout(dropout)(keras.layers.Dense(dim)(h))
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + h)
    h = keras.layers.Dense(dim, activation="gelu")(x)  # the MLM head's transform
    h = keras.layers.LayerNormalization(epsilon=1e-12)(h)
    logits = keras.layers.Dense(vocab, name="mlm_logits")(h)
    return compiled(keras.Model(tokens, logits, name="bert"), _token_loss(), optimizer)


def gpt2(
    vocab: int = 50257,
    seq: int = 1024,
    dim: int = 768,
    *,
    heads: int = 12,
    layers: int = 12,
    mlp_dim: int | None = None,
    dropout: float = 0.1,
    optimizer: str = "adamw",
    seed: int = 7,
) -> keras.Model:
    """GPT-2 small, a causal LM (see above).

    Args:
        vocab: vocabulary size (50257).
        seq: context length (1024).
        dim: hidden width (768).
        heads: attention heads (12).
        layers: decoder blocks (12).
        mlp_dim: MLP width (default ``4 * dim``: 3072).
        dropout: dropout rate on embeddings, attention probabilities and block outputs (0.1).
        optimizer: a name of :data:`~tflms.zoo.compiling.OPTIMIZERS` (AdamW).
        seed: Keras' random seed for the initial weights and dropout.

    Returns:
        The compiled model: int32 token ids ``(batch, seq)`` in, next-token
        logits ``(batch, seq, vocab)`` out, sparse token targets.
    """
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = keras.layers.Dropout(dropout)(_embedded(tokens, vocab, seq, dim))
    for _ in range(layers):
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=dropout)(
            h, h, use_causal_mask=True
        )
        x = x + keras.layers.Dropout(dropout)(h)
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.Dense(mlp_dim or 4 * dim, activation="gelu")(h)
        x = x + keras.layers.Dropout(dropout)(keras.layers.Dense(dim)(h))
    x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    logits = keras.layers.Dense(vocab, name="lm_logits")(x)
    return compiled(keras.Model(tokens, logits, name="gpt2"), _token_loss(), optimizer)


def lstm_lm(
    vocab: int = 10000,
    seq: int = 35,
    units: int = 650,
    *,
    layers: int = 2,
    dropout: float = 0.5,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """The medium LSTM language model of Zaremba et al. (see above).

    Args:
        vocab: vocabulary size (10000).
        seq: unrolled time steps (35).
        units: LSTM units and embedding width (650).
        layers: stacked LSTM layers (2).
        dropout: dropout rate between layers, not on the recurrent state (0.5).
        optimizer: a name of :data:`~tflms.zoo.compiling.OPTIMIZERS` (SGD).
        seed: Keras' random seed for the initial weights and dropout.

    Returns:
        The compiled model: int32 token ids ``(batch, seq)`` in, next-token
        logits ``(batch, seq, vocab)`` out, sparse token targets.
    """
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = keras.layers.Dropout(dropout)(keras.layers.Embedding(vocab, units)(tokens))
    for _ in range(layers):
        x = keras.layers.Dropout(dropout)(keras.layers.LSTM(units, return_sequences=True)(x))
    logits = keras.layers.Dense(vocab, name="lm_logits")(x)
    return compiled(keras.Model(tokens, logits, name="lstm_lm"), _token_loss(), optimizer)
