"""Provenance of a measured (not simulated) benchmark: the machine and the MPI stack."""

from __future__ import annotations

import os
import platform

__all__ = ["machine_info"]


def machine_info(**extra) -> dict:
    """CPU count, platform, Python, mpi4py and numpy versions, plus ``extra``."""
    import mpi4py
    import numpy

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        **extra,
    }
