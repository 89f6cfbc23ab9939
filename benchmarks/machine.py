"""Provenance of a measured (not simulated) benchmark: the machine, the MPI stack, how busy it was."""

from __future__ import annotations

import os
import platform
import time

__all__ = ["machine_info", "cpu_busy", "wait_for_quiet"]


def machine_info(**extra) -> dict:
    """CPU count, model and TensorFlow's oneDNN/allocator state there, versions, plus ``extra``."""
    import mpi4py
    import numpy

    from tflms.utils.cpu import cpu_state

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu_state(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        **extra,
    }


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy(seconds: float = 3.0) -> float:
    """Fraction of all CPUs busy over the next ``seconds`` (0 = idle, 1 = every core busy)."""
    busy0, total0 = _cpu_times()
    time.sleep(seconds)
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_quiet(max_busy: float = 0.25, max_wait: float = 180.0, step: float = 15.0) -> dict:
    """Wait (bounded) until other jobs leave the CPUs mostly idle; what was seen, for the report.

    Load averages lag by minutes (and include our own just-finished jobs), so
    the test is the busy fraction of the CPUs over a few seconds. Gives up
    after ``max_wait`` seconds and says so (``quiet: false``): the caller
    measures anyway, interleaved, and the report carries the figure.
    """
    started = time.monotonic()
    busy = cpu_busy()
    while busy > max_busy and time.monotonic() - started < max_wait:
        time.sleep(step)
        busy = cpu_busy()
    return {
        "cpu_busy": round(busy, 3),
        "quiet": busy <= max_busy,
        "waited_seconds": round(time.monotonic() - started, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
