"""Lazy package exports (PEP 562): a name's module is imported on first use.

``import ddl_tf`` must stay cheap and must not start MPI or TensorFlow:
``ddlrun`` and the numpy/MPI core never import TensorFlow. So the packages
(``ddl_tf``, ``ddl_tf.tensorflow``) declare where each public name lives and
import that module when the name is first used. A name whose module is
``<package>.<name>`` (Horovod's ``hvd.elastic``) is that module itself.

tflms has the same mechanism (``tflms.utils.exports``); the two packages
stand alone, so neither imports the other's.

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

__all__ = ["lazy_exports"]

MISSING_TF = (
    "ddl_tf needs TensorFlow 2.21, which could not be imported ({}). Install the extra for "
    "your machine: pip install 'tflms-ddl[ddl,cpu]' (CPU only) or 'tflms-ddl[ddl,gpu]' "
    "(NVIDIA GPU); add the 'mpi' extra if the machine has no MPI of its own."
)
"""The message of the ImportError raised when a name needs TensorFlow or Keras and they
are missing."""


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """Module-level ``__getattr__``, ``__dir__`` and ``__all__`` for lazy exports.

    Args:
        package: the ``__name__`` of the package exporting the names.
        exports: ``{name: module}``: where each exported name is defined
            (``{name: f"{module}.{name}"}`` exports the module itself).

    Returns:
        ``(__getattr__, __dir__, __all__)`` to assign at the package's top level.
    """

    def __getattr__(name: str) -> object:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            if "tensorflow" in str(err) or "keras" in str(err):
                raise ImportError(MISSING_TF.format(err)) from err
            raise
        value = module if module_name.rpartition(".")[2] == name else getattr(module, name)
        owner = sys.modules.get(package)
        if owner is not None:
            setattr(owner, name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        owner = sys.modules.get(package)
        return sorted(set(vars(owner) if owner is not None else ()) | set(exports))

    return __getattr__, __dir__, list(exports)
