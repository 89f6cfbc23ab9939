"""The main job (examples/unet3d_demo.py) in a reduced setting, under a real ddlrun."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import mpi_env

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "unet3d_demo.py"
DDLRUN = Path(sys.executable).parent / "ddlrun"
SMALL = [
    "--size", "24", "--volumes", "16", "--val-volumes", "4", "--epochs", "12", "--lr", "4e-3",
    "--simulate-sizes", "32", "--sim-depth", "2", "--sim-base-filters", "4",
    "--lms-config", '{"min_tensor_bytes": 0}',
]  # fmt: skip


def run(args, timeout=420, env=None):
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=mpi_env(env or {})
    )


@pytest.mark.slow
@pytest.mark.parallel
def test_demo_trains_on_two_ranks_and_reports(tmp_path):
    out = tmp_path / "demo"
    job = run([str(DDLRUN), "-np", "2", str(DEMO), *SMALL, "--out", str(out)])
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    history = summary["history"]
    assert summary["ranks"] == 2 and len(history) == 12
    assert history[-1]["loss"] < history[0]["loss"]
    # chance: a voxel-wise guess with the class priors scores about the class share (< 5 %)
    assert max(history[-1]["dice"][1:]) > 0.3, history[-1]
    assert summary["lms"]["swaps"] > 0 and summary["lms"]["bytes_swapped"] > 0
    assert summary["weights_identical"] is True
    assert summary["memory"]["demo"]["simulated"] is True
    assert all(row["simulated"] for row in summary["memory"]["seed_sizes"])
    for key in ("training_curve", "memory_timeline"):
        assert Path(summary["files"][key]).stat().st_size > 10_000
    report = job.stdout
    assert "Weights identical on all ranks: True" in report and "Simulated GPU peak" in report
    assert report.count("Dice") >= 12


def test_bad_flags_exit_2_with_the_reason():
    job = run([sys.executable, str(DEMO), "--size", "30", "--depth", "2"], timeout=120)
    assert job.returncode == 2 and "--size 30 must be divisible by 2**depth = 4" in job.stderr
    job = run([sys.executable, str(DEMO), "--lms-config", '{"swapin_ahead": 0}'], timeout=120)
    assert job.returncode == 2 and "LMSConfig.swapin_ahead" in job.stderr


def test_a_missing_data_folder_exits_2(tmp_path):
    job = run([sys.executable, str(DEMO), "--data", str(tmp_path / "nope")], timeout=180)
    assert job.returncode == 2 and "does not exist" in job.stderr


def test_without_mpi_it_says_what_to_install(tmp_path):
    fake = tmp_path / "fake" / "mpi4py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named mpi4py (simulated)')\n")
    job = run([sys.executable, str(DEMO)], timeout=180, env={"PYTHONPATH": str(fake.parent)})
    assert job.returncode == 3 and "tflms-ddl[mpi]" in job.stderr
