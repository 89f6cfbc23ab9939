"""Each package installs and runs alone, in a clean virtual environment.

``pip install '.[lms,cpu]'`` must give a working tflms without mpi4py, and
``pip install '.[ddl,cpu,mpi]'`` a working ddl_tf without networkx and
matplotlib: the two packages share a distribution, not their dependencies.
Both tests start from one fresh venv holding only ``.[cpu]`` (TensorFlow,
Keras, numpy: the shared part, and the minute a TensorFlow install from pip's
wheel cache costs, paid once); each installs its package's extras on top and
uninstalls exactly the distributions that added (a ``pip list`` before and
after), so each test sees what a fresh venv with its extras holds. Each runs
the package's quick start there, from a folder outside the source tree so
that nothing is imported from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.harness import mpi_env

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _pip(python: Path, *args: str) -> str:
    done = subprocess.run(
        [python, "-m", "pip", *args, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (args, done.stdout[-3000:] + done.stderr[-3000:])
    return done.stdout


def _distributions(python: Path) -> set[str]:
    return {d["name"].lower() for d in json.loads(_pip(python, "list", "--format=json"))}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Path]:
    """A new venv with a copy of this checkout installed as ``.[cpu]``: (python, source)."""
    root = tmp_path_factory.mktemp("standalone")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    source = root / "src"  # a copy: the build must not write into the checkout
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".git",
            "site",
            "out",
            "*.egg-info",
            "build",
            "__pycache__",
            "results",
            "peers",
            "notebooks",
        ),
    )
    _pip(python, "install", "-q", f"{source}[cpu]")
    return python, source


@pytest.fixture
def venv_with(base):
    """Install ``.[extras]`` into the base venv; afterwards remove what that added."""
    python, source = base
    before = _distributions(python)

    def install(extras: str) -> Path:
        _pip(python, "install", "-q", f"{source}[{extras}]")
        return python

    yield install
    added = sorted(_distributions(python) - before)
    if added:
        _pip(python, "uninstall", "-y", *added)
    assert _distributions(python) == before


def _installed(python: Path, names: list[str]) -> dict[str, bool]:
    code = "import importlib.util, json, sys; print(json.dumps({n: importlib.util.find_spec(n) is not None for n in sys.argv[1:]}))"
    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_tflms_alone_without_mpi(tmp_path, venv_with):
    python = venv_with("lms,cpu")
    assert _installed(python, ["tflms", "networkx", "mpi4py", "ddl_tf"])["mpi4py"] is False
    # The README's CLI quick start: a training SavedModel, analyzed, simulated, rewritten.
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / "saved_models.py", work / "saved_models.py")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""}
    tflms_cli = python.parent / "tflms"
    steps = [
        [python, "saved_models.py", "tf2", "trainer"],
        [
            tflms_cli,
            "analyze",
            "trainer",
            "--min-tensor-bytes",
            "32KiB",
            "--swapout-threshold",
            "10",
        ],
        [
            tflms_cli,
            "rewrite",
            "trainer",
            "trainer_lms",
            "--budget",
            "4.5MiB",
            "--safety-margin",
            "0",
            "--min-tensor-bytes",
            "32KiB",
        ],
    ]
    for step in steps:
        done = subprocess.run(step, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (step, done.stdout[-2000:], done.stderr[-3000:])
    assert (work / "trainer_lms" / "saved_model.pb").exists()


def test_ddl_tf_alone_without_networkx_or_matplotlib(tmp_path, venv_with):
    python = venv_with("ddl,cpu,mpi")
    found = _installed(python, ["ddl_tf", "mpi4py", "networkx", "matplotlib"])
    assert found == {"ddl_tf": True, "mpi4py": True, "networkx": False, "matplotlib": False}
    # The README's ddl_tf quick start, on 2 ranks under ddlrun.
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / "ddl_tf_keras.py", work / "train.py")
    path = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**mpi_env(), "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": path}
    done = subprocess.run(
        [python.parent / "ddlrun", "-np", "2", "train.py"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert sys.executable != str(python)
