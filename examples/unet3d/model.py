"""The 3D U-Net (Cicek et al., 2016) and its loss and Dice metric.

Example:
    >>> model = build_unet3d(size=16, depth=2, base_filters=4)
    >>> model.output_shape
    (None, 16, 16, 16, 4)
    >>> dice_per_class(np.array([[0, 1, 1]]), np.array([[0, 1, 2]]), classes=3).round(2).tolist()
    [1.0, 0.67, 0.0]
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from .data import CHANNELS, CLASSES

__all__ = [
    "build_unet3d",
    "SegmentationLoss",
    "dice_per_class",
    "confusion_counts",
    "dice_from_counts",
]


def _conv_block(x, filters: int, name: str, widen: bool = False):
    for i in (1, 2):
        n = filters * 2 if (widen and i == 2) else filters
        x = keras.layers.Conv3D(n, 3, padding="same", name=f"{name}_conv{i}")(x)
        x = keras.layers.Activation("relu", name=f"{name}_relu{i}")(x)
    return x


def build_unet3d(
    size: int,
    *,
    depth: int = 3,
    base_filters: int = 8,
    channels: int = len(CHANNELS),
    classes: int = CLASSES,
    widen: bool = False,
) -> keras.Model:
    """A 3D U-Net with ``depth`` poolings; filters double at each level.

    ``size`` must be divisible by ``2**depth``. Outputs per-voxel logits.
    ``widen=True`` doubles the filters of each encoder block's second
    convolution, as in the 3DUnetCNN model (Ellis, 2017) the seed paper
    trained at 144^3 and 192^3 (with ``depth=4, base_filters=32``).
    """
    if size % 2**depth:
        raise ValueError(
            f"input size {size} must be divisible by 2**depth = {2**depth}; e.g. --size {2**depth * max(1, size // 2**depth)}"
        )
    inputs = keras.Input((size, size, size, channels), name="mri")
    x, skips = inputs, []
    for level in range(depth):
        x = _conv_block(x, base_filters * 2**level, f"down{level}", widen)
        skips.append(x)
        x = keras.layers.MaxPooling3D(2, name=f"pool{level}")(x)
    x = _conv_block(x, base_filters * 2**depth, "bottom", widen)
    for level in reversed(range(depth)):
        x = keras.layers.Conv3DTranspose(base_filters * 2**level, 2, strides=2, name=f"up{level}")(
            x
        )
        x = keras.layers.Concatenate(name=f"skip{level}")([x, skips[level]])
        x = _conv_block(x, base_filters * 2**level, f"dec{level}")
    outputs = keras.layers.Conv3D(classes, 1, name="logits")(x)
    return keras.Model(inputs, outputs, name=f"unet3d_{size}")


CLASS_WEIGHTS = (1.0, 5.0, 10.0, 20.0)
"""Cross-entropy weights per class: roughly the inverse square root of the class
frequencies of BraTS-like data (background ~97 %, necrosis ~0.2 %)."""


class SegmentationLoss(keras.losses.Loss):
    """Class-weighted cross-entropy plus soft Dice over the tumor classes.

    Both terms counter the class imbalance: the weights make every tumor
    voxel count more, the Dice term scores the overlap of each small tumor
    compartment regardless of its size.
    """

    def __init__(self, class_weights=CLASS_WEIGHTS, dice_weight: float = 1.0, name="ce_dice"):
        super().__init__(name=name)
        self.class_weights = tuple(float(w) for w in class_weights)
        self.dice_weight = dice_weight

    def call(self, y_true, y_pred):
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
        return {
            **super().get_config(),
            "class_weights": self.class_weights,
            "dice_weight": self.dice_weight,
        }


def confusion_counts(pred: np.ndarray, label: np.ndarray, classes: int = CLASSES) -> np.ndarray:
    """Per class: [true positives, predicted voxels, labelled voxels] (sum across ranks)."""
    counts = np.zeros((classes, 3), np.float64)
    for c in range(classes):
        p, g = pred == c, label == c
        counts[c] = (np.logical_and(p, g).sum(), p.sum(), g.sum())
    return counts


def dice_from_counts(counts: np.ndarray) -> np.ndarray:
    """Dice per class from :func:`confusion_counts` (1.0 when a class is absent from both)."""
    tp, predicted, labelled = counts[:, 0], counts[:, 1], counts[:, 2]
    denom = predicted + labelled
    return np.where(denom == 0, 1.0, 2.0 * tp / np.maximum(denom, 1))


def dice_per_class(pred: np.ndarray, label: np.ndarray, classes: int = CLASSES) -> np.ndarray:
    """Dice coefficient per class over all voxels (1.0 when a class is absent from both)."""
    return dice_from_counts(confusion_counts(pred, label, classes))
