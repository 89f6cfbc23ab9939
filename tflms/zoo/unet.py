"""The 3D U-Net of the demo and of the capacity figures, and its segmentation loss.

After Cicek et al. (2016): per level two 3x3x3 convolutions + ReLU, 2x2x2 max
pooling on the way down, a 2x2x2 transposed convolution and a skip
concatenation on the way up, per-voxel logits. ``widen=True`` doubles the
filters of each encoder block's second convolution, as the plain U-Net of
Ellis' 3DUnetCNN does. The seed paper trained another model of that
repository, the BraTS 2017 network of Isensee et al.: that one is
:func:`tflms.zoo.isensee.isensee2017`, and the capacity figures use it.

Example:
    >>> model = unet3d(16, depth=2, base_filters=4)
    >>> model.output_shape, type(model.loss).__name__, model.loss.sparse_labels
    ((None, 16, 16, 16, 4), 'SegmentationLoss', True)
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflms.errors import ConfigError
from tflms.zoo.compiling import compiled

__all__ = ["unet3d", "SegmentationLoss", "CLASS_WEIGHTS"]

CLASS_WEIGHTS = (1.0, 5.0, 10.0, 20.0)
"""Cross-entropy weights per class: roughly the inverse square root of the class
frequencies of BraTS-like data (background ~97 %, necrosis ~0.2 %)."""


class SegmentationLoss(keras.losses.Loss):
    """Class-weighted cross-entropy plus soft Dice over the foreground classes.

    Both terms counter class imbalance: the weights make every rare voxel
    count more, the Dice term scores the overlap of each small compartment
    regardless of its size. Targets are class indices (``sparse_labels``).

    Args:
        class_weights: cross-entropy weight of each class (their number is
            the number of classes).
        dice_weight: weight of the Dice term.
        name: the loss name.
    """

    sparse_labels = True

    def __init__(self, class_weights=CLASS_WEIGHTS, dice_weight: float = 1.0, name="ce_dice"):
        super().__init__(name=name)
        self.class_weights = tuple(float(w) for w in class_weights)
        self.dice_weight = dice_weight

    def call(self, y_true, y_pred):
        """Per-sample loss of logits ``y_pred`` against class indices ``y_true``.

        Args:
            y_true: Integer class index per voxel, shape ``(batch, d, h, w)``.
            y_pred: Logits, shape ``(batch, d, h, w, classes)``.

        Returns:
            Shape ``(batch,)``: the weighted cross-entropy plus ``dice_weight``
            times one minus the mean soft Dice of the foreground classes.
        """
        classes = len(self.class_weights)
        y_true = tf.cast(y_true, tf.int32)
        weights = tf.gather(tf.constant(self.class_weights), y_true)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(y_true, y_pred)
        ce = tf.reduce_sum(ce * weights, axis=[1, 2, 3]) / tf.reduce_sum(weights, axis=[1, 2, 3])
        probs = tf.nn.softmax(y_pred)[..., 1:]
        onehot = tf.one_hot(y_true, classes)[..., 1:]
        inter = tf.reduce_sum(probs * onehot, axis=[1, 2, 3])
        denom = tf.reduce_sum(probs + onehot, axis=[1, 2, 3])
        dice = tf.reduce_mean((2 * inter + 1.0) / (denom + 1.0), axis=-1)
        return ce + self.dice_weight * (1 - dice)

    def get_config(self):
        """The constructor arguments, for saving."""
        return {
            **super().get_config(),
            "class_weights": self.class_weights,
            "dice_weight": self.dice_weight,
        }


def _conv_block(x, filters: int, name: str, widen: bool = False):
    for i in (1, 2):
        n = filters * 2 if (widen and i == 2) else filters
        x = keras.layers.Conv3D(n, 3, padding="same", name=f"{name}_conv{i}")(x)
        x = keras.layers.Activation("relu", name=f"{name}_relu{i}")(x)
    return x


def unet3d(
    size: int,
    *,
    depth: int = 3,
    base_filters: int = 8,
    channels: int = 4,
    classes: int = 4,
    widen: bool = False,
    optimizer: str = "adam",
    seed: int = 7,
) -> keras.Model:
    """A compiled 3D U-Net on ``size``^3 volumes with ``depth`` poolings.

    Args:
        size: edge of the input cube; must be divisible by ``2**depth``.
        depth: number of poolings; filters double at each level.
        base_filters: filters of the first level.
        channels: input channels (MRI modalities).
        classes: output classes (per-voxel logits; class 0 is background).
        widen: double each encoder block's second convolution (Ellis, 2017).
        optimizer: ``"sgd"`` or ``"adam"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The model, compiled with :class:`SegmentationLoss`.

    Raises:
        ConfigError: ``size`` is not divisible by ``2**depth``.
    """
    if size % 2**depth:
        raise ConfigError(
            f"input size {size} must be divisible by 2**depth = {2**depth}; "
            f"e.g. size={2**depth * max(1, size // 2**depth)}"
        )
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((size, size, size, channels), name="mri")
    x, skips = inputs, []
    for level in range(depth):
        x = _conv_block(x, base_filters * 2**level, f"down{level}", widen)
        skips.append(x)
        x = keras.layers.MaxPooling3D(2, name=f"pool{level}")(x)
    x = _conv_block(x, base_filters * 2**depth, "bottom", widen)
    for level in reversed(range(depth)):
        up = keras.layers.Conv3DTranspose(base_filters * 2**level, 2, strides=2, name=f"up{level}")
        x = keras.layers.Concatenate(name=f"skip{level}")([up(x), skips[level]])
        x = _conv_block(x, base_filters * 2**level, f"dec{level}")
    outputs = keras.layers.Conv3D(classes, 1, name="logits")(x)
    model = keras.Model(inputs, outputs, name=f"unet3d_{size}")
    weights = CLASS_WEIGHTS if classes == len(CLASS_WEIGHTS) else (1.0,) * classes
    return compiled(model, SegmentationLoss(weights), optimizer)
