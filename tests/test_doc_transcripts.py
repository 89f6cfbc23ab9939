"""The transcripts the docs show are what the examples print today.

Each checked page holds a ```text block that starts with ``$ <command>``; the
test reruns the command and compares every line of the block that does not
depend on the machine (Keras's progress line with its timings and ``ddlrun:``
lines with paths are left out). A transcript that drifts from the code fails
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


def _stable(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not any(p.match(line) for p in _VOLATILE)]


def _check(page: str, command: str, argv: list[str], env=None) -> None:
    run = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False
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
