"""The Dice metric of the demo (the 3D U-Net and its loss are :func:`tflms.zoo.unet3d`).

Example:
    >>> dice_per_class(np.array([[0, 1, 1]]), np.array([[0, 1, 2]]), classes=3).round(2).tolist()
    [1.0, 0.67, 0.0]
"""

from __future__ import annotations

import numpy as np

from .data import CLASSES

__all__ = [
    "dice_per_class",
    "confusion_counts",
    "dice_from_counts",
]


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
