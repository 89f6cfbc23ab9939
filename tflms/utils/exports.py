"""Lazy package exports (PEP 562): a name's module is imported on first use.

``import tflms`` and ``import tflms.<stage>`` stay cheap: TensorFlow, keras
and networkx load only when a name that needs them is used, so the ``tflms``
command answers ``--help`` at once and light modules (``tflms.utils.units``,
``tflms.plan.swap_plan``) import without TensorFlow.

Example:
    >>> import sys, types
    >>> pkg = types.ModuleType("demo_pkg")
    >>> pkg.__getattr__, pkg.__dir__, names = lazy_exports("demo_pkg", {"dumps": "json"})
    >>> names, pkg.dumps([1])
    (['dumps'], '[1]')
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Module-level ``__getattr__``, ``__dir__`` and ``__all__`` for lazy exports.

    Args:
        package: the ``__name__`` of the package exporting the names.
        exports: ``{name: module}``: where each exported name is defined
            (``{name: f"{module}.{name}"}`` exports the module itself).

    Returns:
        ``(__getattr__, __dir__, __all__)`` to assign at the package's top level.
    """

    def __getattr__(name: str) -> Any:  # the exported value: any object
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name.rpartition(".")[2] == name else getattr(module, name)
        owner = sys.modules.get(package)
        if owner is not None:
            setattr(owner, name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        owner = sys.modules.get(package)
        return sorted(set(vars(owner) if owner is not None else ()) | set(exports))

    return __getattr__, __dir__, list(exports)
