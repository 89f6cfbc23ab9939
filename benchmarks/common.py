"""Helpers shared by the benchmark scripts: paths, provenance, JSON output."""

from __future__ import annotations

import logging
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import tensorflow as tf  # noqa: E402

from tflms.simulation.grappler import SIMULATOR as GRAPPLER  # noqa: E402
from tflms.simulation.simulator import SIMULATOR as TFLMS  # noqa: E402
from tflms.utils.cpu import cpu_state  # noqa: E402
from tflms.utils.files import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
GIB = 1 << 30

__all__ = ["REPO", "RESULTS", "GIB", "provenance", "write_result", "setup_logging"]


def provenance(note: str) -> dict:
    """Who computed the numbers: every figure is simulated, never measured."""
    return {
        "simulated": True,
        "note": note,
        "simulators": {"tflms": TFLMS, "grappler": GRAPPLER},
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "cpu": cpu_state(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(name: str, data: dict) -> Path:
    """Write ``data`` to ``benchmarks/results/<name>`` atomically; returns the path."""
    path = RESULTS / name
    write_json(path, data)
    return path


def setup_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
