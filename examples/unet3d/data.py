"""BraTS-like data: a synthetic volume generator and a loader for real volumes.

Synthetic volumes (the default, no download) mimic multimodal brain MRI with
a glioma: four channels (T1, T1c, T2, FLAIR) over an ellipsoidal "brain", and
a tumor of three nested, irregular compartments - edema (label 1), an
enhancing rim (label 2) and a necrotic core (label 3) - on background
(label 0). Each compartment has its own intensity signature per modality, as
in real scans (FLAIR bright in edema, T1c bright in the enhancing rim, T1 dark
in necrosis), plus noise and a smooth bias field, so a 3D U-Net can learn the
segmentation while the classes are as imbalanced as in BraTS (tumor labels
are a few percent of the voxels). Volume ``i`` depends only on ``(seed, i)``,
so every rank generates its own shard without communication.

Real data: :func:`load_volumes` reads a folder with one sub-folder per case::

    DATA/
      case_001/image.npy   # float, shape (D, H, W, C) or (C, D, H, W)
      case_001/label.npy   # int, shape (D, H, W), values 0..classes-1
      case_002/...

``.npz`` (keys ``image`` and ``label``) and NIfTI (``image.nii.gz`` with a
4th dimension for channels, ``label.nii.gz``; needs ``nibabel``) work too.
Volumes are center-cropped or zero-padded to the requested cube and each
channel is z-scored inside the nonzero region.

Example:
    >>> x, y = synthetic_volume(0, size=24)
    >>> x.shape, y.shape, x.dtype, sorted(set(y.ravel().tolist()))
    ((24, 24, 24, 4), (24, 24, 24), dtype('float32'), [0, 1, 2, 3])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "CHANNELS",
    "CLASSES",
    "CLASS_NAMES",
    "synthetic_volume",
    "synthetic_dataset",
    "load_volumes",
    "DataError",
]

CHANNELS = ("T1", "T1c", "T2", "FLAIR")
CLASS_NAMES = ("background", "edema", "enhancing", "necrosis")
CLASSES = len(CLASS_NAMES)

# Mean intensity per (class, modality): background-brain, edema, enhancing, necrosis.
_MEANS = np.array(
    [
        [1.00, 1.00, 1.00, 1.00],  # healthy brain
        [0.85, 0.95, 1.60, 1.90],  # edema: bright T2/FLAIR
        [0.95, 2.20, 1.30, 1.40],  # enhancing: bright T1c
        [0.55, 0.70, 1.80, 1.00],  # necrosis: dark T1, bright T2
    ],
    dtype=np.float32,
)


class DataError(ValueError):
    """A data folder or volume file is missing or malformed."""


def _smooth_noise(rng: np.random.Generator, size: int, scale: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1]: a coarse random grid upsampled to ``size``."""
    coarse = rng.uniform(-1, 1, (scale, scale, scale)).astype(np.float32)
    idx = np.linspace(0, scale - 1, size)
    lo = np.floor(idx).astype(int)
    hi = np.minimum(lo + 1, scale - 1)
    w = (idx - lo).astype(np.float32)
    for axis in range(3):
        a = np.take(coarse, lo, axis=axis)
        b = np.take(coarse, hi, axis=axis)
        shape = [1, 1, 1]
        shape[axis] = size
        coarse = a * (1 - w.reshape(shape)) + b * w.reshape(shape)
    return coarse


def synthetic_volume(index: int, size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One BraTS-like volume: image ``(size, size, size, 4)`` float32, labels int32."""
    rng = np.random.default_rng([seed, index])
    grid = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5
    z, y, x = np.meshgrid(grid, grid, grid, indexing="ij")

    radii = rng.uniform(0.36, 0.46, 3)
    brain = (z / radii[0]) ** 2 + (y / radii[1]) ** 2 + (x / radii[2]) ** 2 <= 1.0

    center = rng.uniform(-0.15, 0.15, 3)
    dist = np.sqrt((z - center[0]) ** 2 + (y - center[1]) ** 2 + (x - center[2]) ** 2)
    dist = dist * (1 + 0.25 * _smooth_noise(rng, size, 4))  # irregular outline
    r_edema = rng.uniform(0.14, 0.22)
    label = np.zeros((size,) * 3, np.int32)
    label[(dist < r_edema) & brain] = 1
    label[(dist < 0.62 * r_edema) & brain] = 2
    label[(dist < 0.36 * r_edema) & brain] = 3

    tissue = np.where(brain, 0, -1)  # -1 outside the head
    cls = np.where(label > 0, label, tissue)
    bias = 1 + 0.15 * _smooth_noise(rng, size, 3)
    image = np.zeros((size,) * 3 + (len(CHANNELS),), np.float32)
    for m in range(len(CHANNELS)):
        mean = np.where(cls < 0, 0.0, _MEANS[np.clip(cls, 0, None), m])
        texture = 0.08 * _smooth_noise(rng, size, 6)
        channel = (mean + texture) * bias + rng.normal(0, 0.12, (size,) * 3)
        image[..., m] = np.where(brain, channel, rng.normal(0, 0.03, (size,) * 3))
    return _zscore(image), label


def synthetic_dataset(
    count: int, size: int = 32, seed: int = 0, *, rank: int = 0, ranks: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Volumes ``rank, rank + ranks, ...`` of ``count`` - this rank's shard, stacked."""
    pairs = [synthetic_volume(i, size, seed) for i in range(rank, count, ranks)]
    if not pairs:
        raise DataError(f"no volumes for rank {rank} of {ranks}: use at least {ranks} volumes")
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def _zscore(image: np.ndarray) -> np.ndarray:
    mask = np.abs(image).sum(-1) > 0.2
    out = np.zeros_like(image)
    for m in range(image.shape[-1]):
        values = image[..., m][mask]
        mean, std = (values.mean(), values.std() + 1e-6) if values.size else (0.0, 1.0)
        out[..., m] = np.where(mask, (image[..., m] - mean) / std, 0.0)
    return out.astype(np.float32)


def _fit(volume: np.ndarray, size: int) -> np.ndarray:
    """Center-crop or zero-pad the three spatial dims to ``size``."""
    out = volume
    for axis in range(3):
        n = out.shape[axis]
        if n > size:
            start = (n - size) // 2
            out = np.take(out, range(start, start + size), axis=axis)
        elif n < size:
            pad = [(0, 0)] * out.ndim
            pad[axis] = ((size - n) // 2, size - n - (size - n) // 2)
            out = np.pad(out, pad)
    return out


def _read(path: Path) -> np.ndarray:
    if path.name.endswith((".nii", ".nii.gz")):
        try:
            import nibabel
        except ImportError as err:
            raise DataError(
                f"{path} is NIfTI; install nibabel to read it (pip install nibabel)"
            ) from err
        return np.asarray(nibabel.load(str(path)).dataobj)
    return np.load(path)


def _case_files(case: Path) -> tuple[np.ndarray, np.ndarray]:
    if (case / "volume.npz").exists():
        with np.load(case / "volume.npz") as data:
            if "image" not in data or "label" not in data:
                raise DataError(f"{case / 'volume.npz'} needs arrays 'image' and 'label'")
            return data["image"], data["label"]
    for suffix in (".npy", ".nii.gz", ".nii"):
        image, label = case / f"image{suffix}", case / f"label{suffix}"
        if image.exists() and label.exists():
            return _read(image), _read(label)
    raise DataError(
        f"{case} has no image/label pair: expected image.npy + label.npy, volume.npz, "
        "or image.nii.gz + label.nii.gz"
    )


def load_volumes(
    folder: str | Path, size: int, *, classes: int = CLASSES, rank: int = 0, ranks: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Load this rank's shard of the cases in ``folder`` (layout in the module docstring).

    Raises:
        DataError: the folder is missing or empty, or a case is malformed
            (wrong rank, shapes that do not match, labels out of range).
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist (expected one sub-folder per case)")
    cases = sorted(p for p in root.iterdir() if p.is_dir())
    if not cases:
        raise DataError(f"data folder {root} has no case sub-folders")
    images, labels = [], []
    for case in cases[rank::ranks]:
        image, label = _case_files(case)
        if image.ndim != 4:
            raise DataError(
                f"{case}: image must have 4 dims (D, H, W, C) or (C, D, H, W), got {image.shape}"
            )
        if image.shape[0] < image.shape[-1]:  # (C, D, H, W) -> (D, H, W, C)
            image = np.moveaxis(image, 0, -1)
        if label.shape != image.shape[:3]:
            raise DataError(
                f"{case}: label shape {label.shape} does not match image {image.shape[:3]}"
            )
        if label.min() < 0 or label.max() >= classes:
            raise DataError(
                f"{case}: labels must lie in 0..{classes - 1}, found {label.min()}..{label.max()}"
            )
        images.append(_zscore(_fit(image.astype(np.float32), size)))
        labels.append(_fit(label.astype(np.int32), size))
    if not images:
        raise DataError(f"{root} has {len(cases)} cases, fewer than the {ranks} ranks")
    return np.stack(images), np.stack(labels)
