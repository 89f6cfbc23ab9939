"""Helpers for worker scripts that run under mpirun (imported by each rank)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def report(rank: int, payload: dict) -> None:
    """Write this rank's result where the test harness collects it (atomically)."""
    outdir = Path(os.environ["DDL_TEST_OUTDIR"])
    tmp = outdir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(payload))
    tmp.replace(outdir / f"rank{rank}.json")
