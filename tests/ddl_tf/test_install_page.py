"""docs/install.md's ddl_tf commands run as the page shows them (the page is read, not copied)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

from ddl_tf.core.numerics import halfconv

PAGE = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def _commands() -> list[tuple[str, str]]:
    """``(command, the line the page shows after it)`` for its ddl_tf-only ``$ python -c`` lines."""
    lines = PAGE.read_text().splitlines()
    return [
        (line[2:], lines[i + 1])
        for i, line in enumerate(lines)
        if re.match(r"\$ python -c ", line) and "ddl_tf" in line and "tflms" not in line
    ]


def test_the_extension_check_runs_and_prints_what_the_page_shows_here():
    commands = _commands()
    assert [c for c, _ in commands] == [
        'python -c "from ddl_tf.core.numerics import halfconv; print(halfconv.COMPILED)"'
    ]
    command, shown = commands[0]
    argv = [sys.executable, *shlex.split(command)[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr(halfconv.COMPILED)
    assert shown == repr(("float16", "bfloat16"))  # the page shows a compiled install
