"""The shape of the code: one-way dependencies, no reaching into private names, small modules.

Read from the source with ``ast`` (nothing is imported), so a failure names
the file and line to fix. A *unit* is a sub-package (``tflms.plan``) or a
top-level module (``tflms.config``); the package root, a facade of lazy
exports, is not a unit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("tflms", "ddl_tf")
MAX_LINES = 400


def _modules(package: str, root: Path = REPO) -> dict[str, Path]:
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, package: str):
    """``(imported module, names, line)`` for every import of ``package`` in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package:
                    yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] == package:
                yield base, tuple(a.name for a in node.names), node.lineno


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def _resolve(base: str, name: str, modules: dict) -> str:
    """``from base import name``: the module ``name`` if it is one, else ``base``."""
    return f"{base}.{name}" if f"{base}.{name}" in modules else base


def unit_cycles(package: str, root: Path = REPO) -> list[str]:
    """Import cycles between the units of ``package``, each with the import lines closing it."""
    modules = _modules(package, root)
    graph = nx.DiGraph()
    where: dict[tuple[str, str], str] = {}
    for module, path in modules.items():
        source = _unit(module)
        if source is None:
            continue
        graph.add_node(source)
        for base, names, line in _imports(module, path, package):
            for target_module in [_resolve(base, n, modules) for n in names] or [base]:
                target = _unit(target_module)
                if target is None or target == source:
                    continue
                graph.add_edge(source, target)
                where.setdefault((source, target), f"{path.relative_to(root)}:{line}")
    return [
        " -> ".join([*c, c[0]])
        + "  ("
        + ", ".join(where[(a, b)] for a, b in zip(c, [*c[1:], c[0]], strict=True))
        + ")"
        for c in sorted(nx.simple_cycles(graph), key=len)
    ]


@pytest.mark.parametrize("package", ["tflms"])
def test_sub_packages_depend_on_each_other_one_way(package):
    cycles = unit_cycles(package)
    assert not cycles, "import cycles between units:\n" + "\n".join(cycles[:5])


def test_the_cycle_check_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "demo"
    for folder in (pkg, pkg / "low", pkg / "high"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from demo.high import b\n")
    (pkg / "high" / "b.py").write_text("from ..low import a\n")
    (pkg / "util.py").write_text("import demo.low.a\n")
    assert unit_cycles("demo", tmp_path) == [
        "demo.low -> demo.high -> demo.low  (demo/low/a.py:2, demo/high/b.py:1)"
    ]


@pytest.mark.parametrize("package", ["tflms"])
def test_no_module_uses_another_modules_private_names(package):
    modules = _modules(package)
    problems = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bound: dict[str, str] = {}  # local name -> package module it refers to
        for base, names, line in _imports(module, path, package):
            for name in names:
                target = _resolve(base, name, modules)
                if target != base:
                    bound[name] = target
                elif name.startswith("_") and base != module:
                    problems.append(f"{path.relative_to(REPO)}:{line} imports {base}.{name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.asname and alias.name in bound:
                        bound[alias.asname] = bound.pop(alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                problems.append(
                    f"{path.relative_to(REPO)}:{node.lineno} uses {bound[node.value.id]}.{node.attr}"
                )
    assert not problems, "private names used across modules:\n" + "\n".join(problems)


@pytest.mark.parametrize("package", ["tflms"])
def test_no_module_is_over_400_lines(package):
    long = {
        str(path.relative_to(REPO)): n
        for path in _modules(package).values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_the_pipeline_is_visible_in_the_tree():
    entries = {p.name for p in (REPO / "tflms").iterdir() if not p.name.startswith("__")}
    for stage in ("graph", "plan", "apply", "simulation", "tuning", "saved_model", "cli"):
        assert stage in entries and (REPO / "tflms" / stage / "__init__.py").exists()
