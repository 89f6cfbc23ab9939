"""Horovod's two TF2 elastic recipes, with the edits the migration page lists, survive a ``kill -9``.

Each example runs under ``ddlrun --min-np 1 --max-np 2`` on two hosts of this
machine (``localhost`` and ``127.0.0.1``, one slot each, as in Horovod's own
elastic tests). Once training is under way the test sends ``SIGKILL`` to the
rank on ``127.0.0.1`` from outside, as a scheduler or a dying node would; the
other rank must restore the last commit, go on alone and end the job cleanly.
The edits themselves are counted in the sources (``# ddl_tf:`` marks), so an
example that drifts from Horovod's recipe fails here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness import mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DDLRUN = Path(sys.executable).parent / "ddlrun"
HOSTS = ["--min-np", "1", "--max-np", "2", "-H", "localhost:1,127.0.0.1:1", "-np", "2"]

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def _job_ranks(marker: str, host: str) -> list[int]:
    """Pids of this test's ranks (their environment holds ``marker``) on ``host``."""
    wanted = {f"EXAMPLE_RUN={marker}".encode(), f"HOROVOD_HOSTNAME={host}".encode()}
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if wanted <= set((proc / "environ").read_bytes().split(b"\0")):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _edit_marks(source: str) -> list[str]:
    """The lines of ``source`` marked as an edit of Horovod's recipe (not the docstring's mention)."""
    return [line for line in source.splitlines() if "# ddl_tf:" in line and "``" not in line]


def _run_and_kill(tmp_path: Path, example: str, *options: str, ready: re.Pattern) -> str:
    """Run ``example`` elastic on two hosts, SIGKILL 127.0.0.1's rank once ``ready`` is printed."""
    mpirun_executable()  # skips without an MPI
    marker = str(tmp_path)
    job = subprocess.Popen(
        [str(DDLRUN), *HOSTS, str(EXAMPLES / example), *options],
        cwd=tmp_path,
        env=mpi_env({"EXAMPLE_RUN": marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    killed = []
    try:
        deadline = time.monotonic() + 3 * HANG_SECONDS
        while not killed and time.monotonic() < deadline and job.poll() is None:
            if any(ready.search(line) for line in list(lines)):
                for pid in _job_ranks(marker, "127.0.0.1"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.1)
        assert killed, "training never reached the kill:\n" + "".join(lines)[-3000:]
        job.wait(timeout=3 * HANG_SECONDS + PROCESS_MARGIN_SECONDS)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    reader.join(timeout=PROCESS_MARGIN_SECONDS)
    out = "".join(lines)
    assert job.returncode == 0, out[-4000:]
    assert not _job_ranks(marker, "localhost"), "a rank outlived ddlrun"
    return out


def test_horovod_elastic_keras_recipe_trains_on_after_a_rank_is_killed(tmp_path):
    out = _run_and_kill(
        tmp_path,
        "horovod_tf2_keras_mnist_elastic.py",
        "--epochs", "3", "--steps", "16", "--batch-size", "32",
        ready=re.compile(r"Epoch 2/"),
    )  # fmt: skip
    assert "without rank(s) [1] (host(s) 127.0.0.1 blacklisted)" in out, out[-4000:]
    assert "elastic training finished: size 1, epoch 3" in out, out[-4000:]
    assert (tmp_path / "checkpoint-1.keras").exists(), "rank 0's ModelCheckpoint wrote nothing"
    source = (EXAMPLES / "horovod_tf2_keras_mnist_elastic.py").read_text()
    marks = _edit_marks(source)
    assert len(marks) == 6, marks  # import, compile, learning_rate, .keras, data, last line


def test_horovod_elastic_gradient_tape_recipe_trains_on_after_a_rank_is_killed(tmp_path):
    out = _run_and_kill(
        tmp_path,
        "horovod_tf2_mnist_elastic.py",
        "--batches", "40", "--batch-size", "32",
        ready=re.compile(r"Step #10\b"),
    )  # fmt: skip
    assert "without rank(s) [1] (host(s) 127.0.0.1 blacklisted)" in out, out[-4000:]
    finished = re.search(r"elastic training finished: size 1, batch (\d+)", out)
    assert finished, out[-4000:]
    assert int(finished.group(1)) >= 10 + 39, (
        "restarted at the commit (>= 10): 40 more batches alone"
    )
    assert list(tmp_path.glob("checkpoints-1.index")), "rank 0 wrote no checkpoint"
    source = (EXAMPLES / "horovod_tf2_mnist_elastic.py").read_text()
    marks = _edit_marks(source)
    assert len(marks) == 5, marks  # two imports, data, learning_rate, last line
