"""The simulator's optional compiled kernels (``tflms/simulation/kernels.c``).

The install builds them when a C compiler is there; without one, every
simulation runs the Python reference of each kernel and gives the same
results, slower. Each kernel's Python entry point
(:func:`tflms.simulation.allocator.replay_region`,
:func:`tflms.simulation.schedule.first_ready`) takes ``compiled``: None uses
the kernel when it was built, False the Python reference (what tests compare).

Example:
    >>> isinstance(COMPILED, bool)
    True
"""

from __future__ import annotations

import importlib
from types import ModuleType

from tflms.errors import ConfigError

__all__ = ["COMPILED", "kernels", "use_compiled"]

try:  # a C extension: imported by name, as it has no Python source to type-check
    kernels: ModuleType | None = importlib.import_module("tflms.simulation.kernels")
except ImportError:  # built without a C compiler: the Python references run
    kernels = None

COMPILED: bool = kernels is not None
"""Whether the kernels were built here."""


def use_compiled(compiled: bool | None) -> bool:
    """Whether to run a kernel compiled: ``compiled``, or whether it was built when None.

    Args:
        compiled: True (the kernel; it must be built), False (Python), None (either).

    Returns:
        True to run the compiled kernel.

    Raises:
        ConfigError: ``compiled=True`` where the kernels were not built.
    """
    if compiled and kernels is None:
        raise ConfigError(
            "tflms.simulation.kernels was not built (no C compiler at install); pass "
            "compiled=None to run in Python, or reinstall with a compiler: pip install -e ."
        )
    return COMPILED if compiled is None else compiled
