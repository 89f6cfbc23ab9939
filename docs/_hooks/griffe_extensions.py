"""Griffe extensions for the API reference: starred ``__all__`` items, ``Example:`` sections.

:class:`LiteralNameExports`: ``__all__ = [*NAMES, ...]`` where ``NAMES`` is a
tuple of strings. ddl_tf keeps the Horovod names a module defines in one
place (``ddl_tf/tensorflow/__init__.py``: ``BASICS = ("init", "shutdown", ...)``)
and builds ``__all__`` from them; the packages build it from the lazy-export
list (``*_exported``). Griffe reads ``__all__`` statically and only knows how
to expand ``*module.__all__``; it warns about any other starred name, and the
strict docs build stops. This extension replaces such an item, as soon as the
module is visited, by the strings the name holds at run time, when it is a
tuple or list of strings (the modules named import neither TensorFlow nor
MPI, so importing them is cheap) - which is what Python itself computes for ``__all__``.

:class:`SingularExampleSection`: the project's docstrings (Google style, see
CONVENTIONS) head their doctests ``Example:``; griffe's Google parser knows
only ``Examples:`` and would render the doctest as Markdown prose (``>>>``
as a quote). The heading is read as ``Examples:``.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import griffe

__all__ = ["LiteralNameExports", "SingularExampleSection"]


class LiteralNameExports(griffe.Extension):
    """Expand ``*NAMES`` items of ``__all__`` that name a tuple or list of strings."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        """Rewrite ``mod``'s exports right after its members are visited."""
        if not mod.exports:
            return
        expanded: list = []
        for export in mod.exports:
            names = _names(export) if isinstance(export, griffe.ExprName) else None
            expanded.extend(names if names is not None else [export])
        mod.exports = expanded


def _names(export: griffe.ExprName) -> list[str] | None:
    module_path, _, name = export.canonical_path.rpartition(".")
    if not module_path or name == "__all__":
        return None  # griffe expands *module.__all__ itself
    try:
        value = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError):
        return None
    if isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class SingularExampleSection(griffe.Extension):
    """Read a docstring's ``Example:`` heading as the ``Examples:`` section."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Fix the docstrings of every object of ``pkg`` once it is loaded."""
        _fix(pkg, set())


def _fix(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _fix(member, seen)
