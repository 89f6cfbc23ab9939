"""A Horovod Keras script runs unchanged except for its import, under ddlrun and under mpirun."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, mpi_env, mpirun_executable

WORKERS = Path(__file__).parent / "workers"
HOROVOD_IMPORT = "import horovod.tensorflow.keras as hvd\n"
DDL_IMPORT = "import ddl_tf.keras as hvd\n"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def migrate(tmp_path: Path) -> Path:
    original = (WORKERS / "horovod_keras_recipe.py").read_text().splitlines(keepends=True)
    migrated = [DDL_IMPORT if line == HOROVOD_IMPORT else line for line in original]
    changed = [i for i, (a, b) in enumerate(zip(original, migrated, strict=True)) if a != b]
    assert len(changed) == 1, "the migration must change exactly the import line"
    script = tmp_path / "train.py"
    script.write_text("".join(migrated))
    return script


def summaries(folder: Path, size: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(size)]


def test_horovod_recipe_under_ddlrun_then_resumes_under_mpirun(tmp_path):
    script = migrate(tmp_path)
    ckpt, timeline = tmp_path / "ckpt", tmp_path / "timeline.json"
    ddlrun = Path(sys.executable).parent / "ddlrun"
    env = mpi_env()
    cmd = [
        str(ddlrun),
        "-np",
        "2",
        "--timeline",
        str(timeline),
        str(script),
        "--epochs",
        "3",
        "--checkpoint-dir",
        str(ckpt),
        "--summary",
        str(tmp_path / "first"),
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "ddlrun: running: " in first.stdout and "-np 2" in first.stdout
    ranks = summaries(tmp_path / "first", 2)
    # metric averaging: every rank logged the same (global) history
    assert ranks[0]["history"] == ranks[1]["history"]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert ranks[0]["score"] == ranks[1]["score"]
    # warmup: from base_lr * size / size towards base_lr * size
    lrs = ranks[0]["history"]["learning_rate"]
    assert lrs[0] < lrs[1] == pytest.approx(0.02) and lrs[2] == pytest.approx(0.02)
    # checkpoints from rank 0 only
    assert [r["checkpointing"] for r in ranks] == [True, False]
    assert sorted(p.name for p in ckpt.iterdir()) == [f"checkpoint-{e}.keras" for e in (1, 2, 3)]
    events = json.loads(timeline.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    # resume with plain mpirun: picks up epoch 3 on rank 0 and broadcasts it
    cmd = [
        mpirun_executable(),
        "-np",
        "2",
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        str(script),
        "--epochs",
        "4",
        "--checkpoint-dir",
        str(ckpt),
        "--summary",
        str(tmp_path / "second"),
    ]
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = summaries(tmp_path / "second", 2)
    assert [r["resumed_from"] for r in resumed] == [3, 3]
    assert len(resumed[0]["history"]["loss"]) == 1
    assert resumed[0]["weights"] == resumed[1]["weights"]
    assert resumed[0]["history"]["loss"][0] < ranks[0]["history"]["loss"][0]
    assert (ckpt / "checkpoint-4.keras").exists()


@pytest.mark.skipif(shutil.which("horovodrun") is None, reason="horovodrun is not installed")
def test_horovod_recipe_under_horovodrun_mpi(tmp_path):
    script = migrate(tmp_path)
    cmd = [
        "horovodrun",
        "--mpi",
        "-np",
        "2",
        sys.executable,
        str(script),
        "--epochs",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--summary",
        str(tmp_path / "out"),
    ]
    env = {
        **mpi_env(),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = summaries(tmp_path / "out", 2)
    assert ranks[0]["weights"] == ranks[1]["weights"]
