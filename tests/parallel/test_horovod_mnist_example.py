"""examples/horovod_keras_mnist.py: Horovod's Keras MNIST recipe (a Sequential without Input,
built in its first step) on 2 ranks under mpirun ends with identical weights on every rank."""

import sys
from pathlib import Path

import pytest

from tests.harness import REPO, mpi_env, mpirun_executable

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def test_mnist_example_on_two_ranks_ends_with_identical_weights(tmp_path):
    import subprocess

    cmd = [
        mpirun_executable(),
        "-np",
        "2",
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        str(REPO / "examples" / "horovod_keras_mnist.py"),
        "--epochs",
        "2",
        "--steps-per-epoch",
        "12",
        "--batch-size",
        "32",
        "--images",
        "512",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    job = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "ranks: 2" in job.stdout
    assert "weights identical on all ranks: True" in job.stdout, job.stdout[-3000:]
    saved = sorted(p.name for p in Path(tmp_path / "ckpt").iterdir())
    assert saved == ["checkpoint-1.keras", "checkpoint-2.keras"]
