"""The transcripts the docs show are what the examples print today.

Each checked page holds a ```text block that starts with ``$ <command>``; the
test reruns the command (for the first-results page, on the scripts the page
itself holds, saved to an empty folder) and compares every line of the block
that does not depend on the machine (Keras's progress line with its timings
and ``ddlrun:`` lines with paths are left out). A transcript that drifts from the code fails
here, with the fresh output to paste.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import mpi_env

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
_VOLATILE = (re.compile(r"^\d+/\d+ - "), re.compile(r"^ddlrun: "))


def _block(page: str, command: str) -> list[str]:
    text = (REPO / "docs" / page).read_text()
    match = re.search(rf"```text\n\$ {re.escape(command)}\n(.*?)```", text, re.S)
    assert match, f"docs/{page} has no ```text block starting with '$ {command}'"
    return match.group(1).splitlines()


def _save_scripts(page: str, folder: Path) -> None:
    """Write each ```python block of ``page`` whose first line is ``# name.py`` to ``folder``."""
    text = (REPO / "docs" / page).read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            (folder / first[2:]).write_text(block)


def _stable(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not any(p.match(line) for p in _VOLATILE)]


def _check(page: str, command: str, argv: list[str], env=None, cwd: Path = REPO) -> None:
    run = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    printed, shown = _stable(run.stdout.splitlines()), _stable(_block(page, command))
    assert printed == shown, (
        f"docs/{page}: the transcript of '{command}' is stale; it prints now:\n" + run.stdout
    )


@pytest.mark.slow  # about 10 s
def test_keras_page_shows_what_the_keras_example_prints():
    command = "python examples/lms_keras.py"
    _check("keras.md", command, [sys.executable, "examples/lms_keras.py"], env=mpi_env({}))


@pytest.mark.slow
@pytest.mark.parallel  # two ranks under ddlrun, about 15 s
def test_custom_loops_page_shows_what_the_custom_loop_example_prints():
    command = "ddlrun -np 2 examples/custom_loop.py"
    argv = [str(BIN / "ddlrun"), "-np", "2", sys.executable, "examples/custom_loop.py"]
    _check("custom-loops.md", command, argv, env=mpi_env({}))


@pytest.mark.slow  # about 20 s
def test_first_results_page_shows_what_its_tflms_script_prints(tmp_path):
    _save_scripts("getting-started.md", tmp_path)
    command = "python first_lms.py"
    _check("getting-started.md", command, [sys.executable, "first_lms.py"], mpi_env({}), tmp_path)


@pytest.mark.slow
@pytest.mark.parallel  # two ranks under ddlrun, about 15 s
def test_first_results_page_shows_what_its_ddl_tf_script_prints(tmp_path):
    _save_scripts("getting-started.md", tmp_path)
    command = "ddlrun -np 2 train.py"
    argv = [str(BIN / "ddlrun"), "-np", "2", sys.executable, "train.py"]
    _check("getting-started.md", command, argv, mpi_env({}), tmp_path)
