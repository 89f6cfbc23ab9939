"""The demo's data: synthetic BraTS-like volumes and the loader for real ones."""

import numpy as np
import pytest

from examples.unet3d.data import (
    CLASSES,
    DataError,
    load_volumes,
    synthetic_dataset,
    synthetic_volume,
)
from examples.unet3d.metrics import dice_per_class


def test_synthetic_volumes_are_deterministic_and_imbalanced_like_brats():
    x1, y1 = synthetic_volume(5, size=32, seed=3)
    x2, y2 = synthetic_volume(5, size=32, seed=3)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    _, labels = synthetic_dataset(6, size=32)
    share = np.bincount(labels.ravel(), minlength=CLASSES) / labels.size
    assert share[0] > 0.9 and all(0 < s < 0.05 for s in share[1:])


def test_classes_have_distinct_intensity_signatures():
    x, y = synthetic_dataset(4, size=32)
    means = np.stack([x[y == c].mean(0) for c in range(CLASSES)])
    assert means[1, 3] > means[0, 3] + 1  # edema bright on FLAIR
    assert means[2, 1] > means[0, 1] + 1  # enhancing bright on T1c
    assert means[3, 0] < means[0, 0] - 1  # necrosis dark on T1


def test_shards_partition_the_dataset():
    _, full = synthetic_dataset(5, size=16)
    _, a = synthetic_dataset(5, size=16, rank=0, ranks=2)
    _, b = synthetic_dataset(5, size=16, rank=1, ranks=2)
    assert len(a) == 3 and len(b) == 2
    np.testing.assert_array_equal(np.concatenate([a[::1][:1], b[:1], a[1:2]]), full[:3])


def _write_cases(root, fmt, n=3, shape=(20, 18, 22), channels_first=False):
    rng = np.random.default_rng(0)
    for i in range(n):
        case = root / f"case_{i:03d}"
        case.mkdir(parents=True)
        image = rng.standard_normal((*shape, 4)).astype("float32")
        if channels_first:
            image = np.moveaxis(image, -1, 0)
        label = rng.integers(0, CLASSES, shape).astype("int16")
        if fmt == "npy":
            np.save(case / "image.npy", image)
            np.save(case / "label.npy", label)
        elif fmt == "npz":
            np.savez(case / "volume.npz", image=image, label=label)
        else:
            nibabel = pytest.importorskip("nibabel")
            nibabel.save(nibabel.Nifti1Image(image, np.eye(4)), case / "image.nii.gz")
            nibabel.save(nibabel.Nifti1Image(label, np.eye(4)), case / "label.nii.gz")


@pytest.mark.parametrize(
    "fmt, channels_first", [("npy", False), ("npy", True), ("npz", False), ("nifti", False)]
)
def test_loader_reads_crops_pads_and_shards(tmp_path, fmt, channels_first):
    _write_cases(tmp_path, fmt, channels_first=channels_first)
    x, y = load_volumes(tmp_path, size=16)
    assert x.shape == (3, 16, 16, 16, 4) and y.shape == (3, 16, 16, 16)
    assert x.dtype == np.float32 and y.max() < CLASSES
    x0, _ = load_volumes(tmp_path, size=16, rank=1, ranks=2)
    assert len(x0) == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: None, "does not exist"),
        (lambda root: root.mkdir(), "has no case sub-folders"),
        (lambda root: (root / "case").mkdir(parents=True), "has no image/label pair"),
        (
            lambda root: (
                (root / "c").mkdir(parents=True),
                np.save(root / "c" / "image.npy", np.zeros((4, 4, 4, 2))),
                np.save(root / "c" / "label.npy", np.zeros((4, 4, 5))),
            ),
            "does not match image",
        ),
        (
            lambda root: (
                (root / "c").mkdir(parents=True),
                np.save(root / "c" / "image.npy", np.zeros((4, 4, 4, 2))),
                np.save(root / "c" / "label.npy", np.full((4, 4, 4), 9)),
            ),
            "labels must lie in 0..3",
        ),
    ],
)
def test_loader_errors_name_the_problem(tmp_path, make, message):
    root = tmp_path / "data"
    make(root)
    with pytest.raises(DataError, match=message):
        load_volumes(root, size=8)


def test_dice_is_one_for_perfect_and_low_for_chance_predictions():
    _, y = synthetic_dataset(2, size=24)
    assert np.allclose(dice_per_class(y, y), 1.0)  # integer counts: 2 tp / 2 tp is exactly 1
    rng = np.random.default_rng(0)
    share = np.bincount(y.ravel(), minlength=CLASSES) / y.size
    chance = rng.choice(CLASSES, size=y.shape, p=share)
    assert (dice_per_class(chance, y)[1:] < 0.1).all()
