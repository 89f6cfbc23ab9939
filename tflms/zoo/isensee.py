"""The BraTS 2017 3D U-Net of Isensee et al. ("isensee2017"), its instance norm and Dice loss.

After Isensee et al., "Brain Tumor Segmentation and Radiomics Survival
Prediction: Contribution to the BRATS 2017 Challenge", as Ellis' 3DUnetCNN
trains it (``isensee2017_model``), written here from the architecture, in
channels-last layout:

* encoder, ``depth`` levels with ``base_filters * 2**level`` filters: a
  convolution block (stride 1 at level 0, stride 2 below), then a *context
  module* (convolution block, ``SpatialDropout3D``, convolution block) whose
  output is added to the block's;
* decoder, from level ``depth - 2`` up to 0: an *up-sampling module*
  (``UpSampling3D`` and a convolution block), concatenated with the encoder's
  sum at that level, then a *localization module* (a 3x3x3 and a 1x1x1
  convolution block);
* deep supervision: a 1x1x1 convolution to ``labels`` maps on the
  ``segmentation_levels`` finest decoder levels, summed from the coarsest up
  (each sum up-sampled to the next level), then a sigmoid per label.

A convolution block is ``Conv3D`` (3x3x3 unless said, ``padding="same"``),
a normalization, then ``LeakyReLU`` (negative slope 0.3). Targets are one
{0, 1} map per label (BraTS: whole tumour, tumour core, enhancing tumour);
the loss is :class:`WeightedDiceLoss`.

Example:
    >>> model = isensee2017(16, depth=4, base_filters=2)
    >>> model.output_shape, type(model.loss).__name__, model.loss.sparse_labels
    ((1, 16, 16, 16, 3), 'WeightedDiceLoss', False)
"""

from __future__ import annotations

import keras
from keras import ops

from tflms.errors import ConfigError
from tflms.zoo.compiling import compiled

__all__ = [
    "isensee2017",
    "InstanceNormalization",
    "Keras2LeakyReLU",
    "Keras2UpSampling3D",
    "WeightedDiceLoss",
    "NORMS",
    "ARITHMETICS",
]

NORMS = ("instance", "group")
"""Values of :func:`isensee2017`'s ``norm``."""

ARITHMETICS = ("keras3", "tf1")
"""Values of :func:`isensee2017`'s ``arithmetic``: the ops of Keras 3's layers, or those
TensorFlow 1.8's ``tf.keras`` wrote for the same layers (what the seed paper's GPU ran)."""


class Keras2LeakyReLU(keras.layers.Layer):
    """LeakyReLU as Keras 2 / TensorFlow 1.8's ``tf.keras`` computed it: ``relu(x) - a * relu(-x)``.

    Keras 2's ``LeakyReLU`` called ``K.relu(x, alpha)``, whose TensorFlow
    backend wrote the negative part as a second ReLU of the negated input,
    scaled and subtracted: five ops, two of whose outputs (both ReLUs) the
    backward pass keeps, where Keras 3's one ``LeakyRelu`` op keeps its input.

    Args:
        alpha: slope of the negative part.
        **kwargs: ``keras.layers.Layer`` arguments.
    """

    def __init__(self, alpha: float = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.alpha = float(alpha)

    def call(self, inputs):
        """``relu(inputs) - alpha * relu(-inputs)``."""
        return ops.relu(inputs) - self.alpha * ops.relu(-inputs)

    def compute_output_shape(self, input_shape):
        """The input's shape."""
        return input_shape

    def get_config(self):
        """The constructor arguments, for saving."""
        return {**super().get_config(), "alpha": self.alpha}


class Keras2UpSampling3D(keras.layers.Layer):
    """UpSampling3D (factor 2) as Keras 2 / TensorFlow 1.8's ``tf.keras`` computed it.

    Keras 2's ``resize_volumes`` repeated each spatial axis in turn with
    ``repeat_elements``: ``split`` the tensor into one slice per position
    along the axis and ``concatenate`` every slice twice. Each axis makes a
    full-size set of slices and a tensor twice the size, where Keras 3's
    ``UpSampling3D`` writes one ``repeat`` per axis.

    Args:
        **kwargs: ``keras.layers.Layer`` arguments.
    """

    def call(self, inputs):
        """Each spatial axis (1, 2, 3) repeated twice by split and concatenate."""
        x = inputs
        for axis in (1, 2, 3):
            parts = ops.split(x, x.shape[axis], axis=axis)
            x = ops.concatenate([part for part in parts for _ in range(2)], axis=axis)
        return x

    def compute_output_shape(self, input_shape):
        """Every spatial dimension doubled."""
        batch, *spatial, channels = input_shape
        return (batch, *(None if d is None else 2 * d for d in spatial), channels)


class InstanceNormalization(keras.layers.Layer):
    """Instance normalization with keras-contrib's arithmetic (what 3DUnetCNN used).

    Per sample and per channel, over the spatial axes::

        mean = mean(x)
        std = sqrt(mean((x - mean) ** 2)) + epsilon
        y = (x - mean) / std * gamma + beta

    ``epsilon`` is added to the standard deviation, not to the variance as
    in ``keras.layers.GroupNormalization``. The ops are those of the
    original layer, so a traced step holds the same temporaries: the mean,
    the centered tensor, its square, the standard deviation and the
    quotient. keras-contrib wrote the mean and the centered tensor a second
    time inside ``K.std``; TensorFlow's graph optimizer merges identical ops
    (common subexpression elimination, on by default), so the GPU computed
    and kept each once, as here.

    Args:
        epsilon: added to the standard deviation.
        **kwargs: ``keras.layers.Layer`` arguments (``name``, ``dtype``...).
    """

    def __init__(self, epsilon: float = 1e-3, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        """Create ``gamma`` (ones) and ``beta`` (zeros), one per channel (last axis)."""
        channels = (input_shape[-1],)
        self.gamma = self.add_weight(shape=channels, initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=channels, initializer="zeros", name="beta")

    def call(self, inputs):
        """Normalize ``inputs`` (``(batch, *spatial, channels)``) per sample and channel."""
        axes = tuple(range(1, len(inputs.shape) - 1))
        mean = ops.mean(inputs, axis=axes, keepdims=True)
        centered = inputs - mean
        std = ops.sqrt(ops.mean(ops.square(centered), axis=axes, keepdims=True)) + self.epsilon
        return centered / std * self.gamma + self.beta

    def compute_output_shape(self, input_shape):
        """The input's shape."""
        return input_shape

    def get_config(self):
        """The constructor arguments, for saving."""
        return {**super().get_config(), "epsilon": self.epsilon}


class WeightedDiceLoss(keras.losses.Loss):
    """Minus the soft Dice coefficient averaged over labels (3DUnetCNN's weighted Dice loss).

    For each sample and label, over the spatial axes::

        dice = (2 * sum(y_true * y_pred) + smooth) / (sum(y_true) + sum(y_pred) + smooth)

    (3DUnetCNN writes the numerator ``2 * (sum(y_true * y_pred) + smooth / 2)``).
    The loss of a sample is ``-mean(dice)`` over labels, so it lies in
    ``[-1, 0]``: -1 for a perfect prediction, about 0 for a disjoint one.
    "Weighted" because every label counts the same whatever its size, which
    weights the small compartments (enhancing tumour) up. Targets are one
    {0, 1} float map per label, of the output's shape (``binary_labels``),
    not class indices (``sparse_labels`` is False).

    Args:
        smooth: keeps empty labels finite (an empty label predicted empty
            scores 1).
        name: the loss name.
    """

    sparse_labels = False
    binary_labels = True

    def __init__(self, smooth: float = 1e-5, name: str = "weighted_dice"):
        super().__init__(name=name)
        self.smooth = float(smooth)

    def call(self, y_true, y_pred):
        """Per-sample loss of probabilities ``y_pred`` against {0, 1} maps ``y_true``.

        Args:
            y_true: Shape ``(batch, *spatial, labels)``.
            y_pred: Sigmoid outputs, same shape.

        Returns:
            Shape ``(batch,)``: minus the mean over labels of the soft Dice.
        """
        y_true = ops.cast(y_true, y_pred.dtype)
        axes = tuple(range(1, len(y_pred.shape) - 1))
        inter = ops.sum(y_true * y_pred, axis=axes)
        denom = ops.sum(y_true, axis=axes) + ops.sum(y_pred, axis=axes)
        dice = (2.0 * inter + self.smooth) / (denom + self.smooth)
        return -ops.mean(dice, axis=-1)

    def get_config(self):
        """The constructor arguments, for saving."""
        return {**super().get_config(), "smooth": self.smooth}


def _normalization(norm: str, name: str):
    if norm == "instance":
        return InstanceNormalization(name=name)
    # groups=-1: one group per channel, Keras 3's instance normalization
    return keras.layers.GroupNormalization(groups=-1, name=name)


def _conv_block(
    x, filters: int, name: str, norm: str, arithmetic: str, kernel: int = 3, strides: int = 1
):
    x = keras.layers.Conv3D(filters, kernel, strides=strides, padding="same", name=f"{name}_conv")(
        x
    )
    x = _normalization(norm, f"{name}_norm")(x)
    if arithmetic == "tf1":
        return Keras2LeakyReLU(0.3, name=f"{name}_act")(x)
    return keras.layers.LeakyReLU(negative_slope=0.3, name=f"{name}_act")(x)


def _upsampling(arithmetic: str, name: str):
    if arithmetic == "tf1":
        return Keras2UpSampling3D(name=name)
    return keras.layers.UpSampling3D(2, name=name)


def _check(edge, depth, segmentation_levels, norm, base_filters, labels, dropout, arithmetic):
    if arithmetic not in ARITHMETICS:
        raise ConfigError(
            f"arithmetic must be one of {ARITHMETICS}. Received arithmetic={arithmetic!r}."
        )
    if depth < 2:
        raise ConfigError(f"depth must be at least 2 (one down-sampling). Received depth={depth}.")
    step = 2 ** (depth - 1)
    if edge < step or edge % step:
        raise ConfigError(
            f"edge {edge} must be a positive multiple of 2**(depth-1) = {step}; "
            f"e.g. edge={step * max(1, round(edge / step))}, or a smaller depth."
        )
    if norm not in NORMS:
        raise ConfigError(f"norm must be one of {NORMS}. Received norm={norm!r}.")
    if not 1 <= segmentation_levels <= depth - 1:
        raise ConfigError(
            f"segmentation_levels must be between 1 and depth-1 = {depth - 1} (the decoder "
            f"has depth-1 levels). Received segmentation_levels={segmentation_levels}; "
            f"use segmentation_levels={max(1, min(segmentation_levels, depth - 1))} or a larger depth."
        )
    if base_filters < 1 or labels < 1:
        raise ConfigError(
            f"base_filters and labels must be at least 1. "
            f"Received base_filters={base_filters}, labels={labels}."
        )
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1). Received dropout={dropout}.")


def isensee2017(
    edge: int = 128,
    *,
    channels: int = 4,
    base_filters: int = 16,
    depth: int = 5,
    labels: int = 3,
    segmentation_levels: int = 3,
    dropout: float = 0.3,
    norm: str = "instance",
    arithmetic: str = "keras3",
    batch_size: int | None = 1,
    learning_rate: float = 5e-4,
    seed: int = 0,
) -> keras.Model:
    """The compiled isensee2017 3D U-Net on ``edge``^3 volumes (see the module docstring).

    The defaults are 3DUnetCNN's BraTS configuration (four modalities,
    16 base filters, five levels, three labels, three segmentation levels,
    dropout 0.3, Adam at 5e-4) at a 128^3 crop, one volume per batch.

    Args:
        edge: edge of the input cube; a multiple of ``2**(depth-1)``.
        channels: input channels (MRI modalities).
        base_filters: filters of level 0; they double at each level.
        depth: number of encoder levels (``depth - 1`` strided convolutions).
        labels: output maps, each with its own sigmoid.
        segmentation_levels: decoder levels (finest first) whose 1x1x1
            segmentation maps are summed into the output (deep supervision).
        dropout: ``SpatialDropout3D`` rate in each context module (0: none).
        norm: ``"instance"``: :class:`InstanceNormalization`, keras-contrib's
            arithmetic as the original; ``"group"``:
            ``keras.layers.GroupNormalization(groups=-1)``, Keras 3's instance
            norm (epsilon inside the square root): fewer temporaries, a
            simulated training peak about 35% lower (``tflms.simulate``,
            128^3 to 192^3), but not the paper's arithmetic.
        arithmetic: ``"keras3"``: Keras 3's ``LeakyReLU`` and ``UpSampling3D``;
            ``"tf1"``: the ops TensorFlow 1.8's ``tf.keras`` wrote for them
            (:class:`Keras2LeakyReLU`, :class:`Keras2UpSampling3D`), which is
            what the seed paper's V100 ran and held; the real-GPU anchors use it.
        batch_size: the input's fixed batch dimension (``None``: open).
        learning_rate: Adam's learning rate.
        seed: Keras' random seed for the initial weights and the dropout.

    Returns:
        The model, compiled with :class:`WeightedDiceLoss` and Adam.

    Raises:
        ConfigError: ``edge`` is not a multiple of ``2**(depth-1)``, ``norm``
            is unknown, ``segmentation_levels`` is not in ``[1, depth-1]``,
            or another size is out of range.
    """
    _check(edge, depth, segmentation_levels, norm, base_filters, labels, dropout, arithmetic)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((edge, edge, edge, channels), batch_size=batch_size, name="mri")
    x, sums = inputs, []
    for level in range(depth):
        filters = base_filters * 2**level
        x = _conv_block(
            x, filters, f"enc{level}_in", norm, arithmetic, strides=1 if level == 0 else 2
        )
        context = _conv_block(x, filters, f"enc{level}_ctx1", norm, arithmetic)
        if dropout:
            context = keras.layers.SpatialDropout3D(dropout, name=f"enc{level}_drop")(context)
        context = _conv_block(context, filters, f"enc{level}_ctx2", norm, arithmetic)
        x = keras.layers.Add(name=f"enc{level}_sum")([x, context])
        sums.append(x)
    segmentations = {}
    for level in reversed(range(depth - 1)):
        filters = base_filters * 2**level
        x = _upsampling(arithmetic, f"dec{level}_upsample")(x)
        x = _conv_block(x, filters, f"dec{level}_up", norm, arithmetic)
        x = keras.layers.Concatenate(name=f"dec{level}_concat")([sums[level], x])
        x = _conv_block(x, filters, f"dec{level}_loc1", norm, arithmetic)
        x = _conv_block(x, filters, f"dec{level}_loc2", norm, arithmetic, kernel=1)
        if level < segmentation_levels:
            segmentations[level] = keras.layers.Conv3D(labels, 1, name=f"dec{level}_seg")(x)
    out = None
    for level in reversed(range(segmentation_levels)):
        seg = segmentations[level]
        out = seg if out is None else keras.layers.Add(name=f"dec{level}_seg_sum")([out, seg])
        if level > 0:
            out = _upsampling(arithmetic, f"dec{level}_seg_upsample")(out)
    outputs = keras.layers.Activation("sigmoid", name="sigmoid")(out)
    model = keras.Model(inputs, outputs, name=f"isensee2017_{edge}")
    model = compiled(model, WeightedDiceLoss(), "adam")
    model.optimizer.learning_rate = learning_rate
    return model
