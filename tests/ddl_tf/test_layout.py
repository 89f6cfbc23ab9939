"""The shape of ddl_tf, checked from its source with ``ast`` (nothing is imported).

* The import graph between ddl_tf's units has no cycles. A unit is a
  sub-package (``ddl_tf.core``, ``ddl_tf.keras``, ``ddl_tf.launch``,
  ``ddl_tf.cluster``) or a top-level module (``ddl_tf.env``,
  ``ddl_tf.ddlrun``, ... and the package ``ddl_tf`` itself). Imports inside
  functions count as much as module-level ones: a lazy import hides a
  dependency from the import-time graph, not from the design.
* No module uses another module's private names: neither
  ``from ddl_tf.x import _y`` nor ``x._y`` on an imported ddl_tf module.
* No module is longer than :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "ddl_tf"
SUBPACKAGES = ("core", "keras", "launch", "cluster")
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def unit_of(module: str) -> str:
    """``ddl_tf.core`` for ``ddl_tf.core.engine``; a top-level module is its own unit."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return ".".join(parts[:2])
    return module


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Import:
    """One import of a ddl_tf module: who, where, what."""

    importer: str
    line: int
    target: str
    name: str | None  # the name imported from ``target`` (None: the module itself)
    bound: str | None  # the local name it is bound to when it is a ddl_tf module

    @property
    def where(self) -> str:
        return f"{MODULES[self.importer].relative_to(PACKAGE_DIR.parent)}:{self.line}"


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _longest_module(dotted: str) -> str | None:
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imports_of(module: str, tree: ast.Module) -> Iterator[Import]:
    """Every import of a ddl_tf module in ``tree``, at any depth, plus literal import_module()."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_module(alias.name)
                if target is None:
                    continue
                # `import ddl_tf.core.engine` binds `ddl_tf`; `... as e` binds the module itself
                bound = alias.asname or alias.name.partition(".")[0]
                yield Import(module, node.lineno, target, None, bound)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            if base.partition(".")[0] != "ddl_tf":
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                local = alias.asname or alias.name
                if submodule in MODULES:
                    yield Import(module, node.lineno, submodule, None, local)
                else:
                    yield Import(module, node.lineno, _longest_module(base), alias.name, None)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value in MODULES
        ):
            yield Import(module, node.lineno, node.args[0].value, None, None)


def _dotted(node: ast.expr) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


def private_uses(module: str, tree: ast.Module, found: list[Import]) -> Iterator[str]:
    """``from ddl_tf.x import _y`` and ``x._y`` on names bound to ddl_tf modules."""
    for imp in found:
        if imp.name is not None and _is_private(imp.name) and imp.target != module:
            yield f"{imp.where}: imports {imp.target}.{imp.name}"
    bound: dict[str, str] = {}
    for imp in found:
        if imp.bound is None:
            continue
        # `import ddl_tf.core.engine` binds the top package name, `as x` the module itself
        bound[imp.bound] = imp.target if imp.bound != "ddl_tf" else "ddl_tf"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        chain = _dotted(node)
        if not chain or chain[0] not in bound:
            continue
        owner = bound[chain[0]]
        for attr in chain[1:]:
            if f"{owner}.{attr}" in MODULES:
                owner = f"{owner}.{attr}"
                continue
            if _is_private(attr) and owner != module:
                yield f"{MODULES[module].relative_to(PACKAGE_DIR.parent)}:{node.lineno}: uses {owner}.{attr}"
            break


@pytest.fixture(scope="module")
def trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def unit_graph(trees: dict[str, ast.Module]) -> nx.DiGraph:
    """Units as nodes; an edge per unit pair, with the import sites that create it."""
    graph = nx.DiGraph()
    graph.add_nodes_from({unit_of(m) for m in MODULES})
    for module, tree in trees.items():
        for imp in imports_of(module, tree):
            a, b = unit_of(module), unit_of(imp.target)
            if a == b:
                continue
            if not graph.has_edge(a, b):
                graph.add_edge(a, b, sites={})
            graph.edges[a, b]["sites"][f"{imp.where} imports {imp.target}"] = None
    return graph


def test_the_scan_sees_the_package():
    assert {"ddl_tf", "ddl_tf.env", "ddl_tf.core.engine", "ddl_tf.launch.command"} <= set(MODULES)
    assert {"ddl_tf.core", "ddl_tf.keras", "ddl_tf.launch", "ddl_tf.cluster"} <= {
        unit_of(m) for m in MODULES
    }


def test_units_import_each_other_one_way_only(trees):
    graph = unit_graph(trees)
    cycles = sorted(nx.simple_cycles(graph), key=len)
    report = []
    for cycle in cycles[:5]:
        report.append(" -> ".join([*cycle, cycle[0]]))
        for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
            report.extend(f"    {site}" for site in graph.edges[a, b]["sites"])
    assert not cycles, (
        f"{len(cycles)} import cycle(s) between ddl_tf units (a sub-package or a top-level "
        "module); move the shared code down a layer or the caller up one:\n" + "\n".join(report)
    )


def test_the_launch_library_sits_below_the_cluster_and_ddlrun(trees):
    graph = unit_graph(trees)
    assert not nx.has_path(graph, "ddl_tf.launch", "ddl_tf.cluster")
    assert not nx.has_path(graph, "ddl_tf.core", "ddl_tf.launch")
    assert graph.has_edge("ddl_tf.ddlrun", "ddl_tf.launch")
    assert graph.has_edge("ddl_tf.ddlrun", "ddl_tf.cluster")
    assert graph.in_degree("ddl_tf.ddlrun") == 0, "nothing builds on the command-line front end"


def test_no_module_uses_another_modules_private_names(trees):
    bad = []
    for module, tree in trees.items():
        bad.extend(private_uses(module, tree, list(imports_of(module, tree))))
    assert not bad, (
        "private names used across ddl_tf modules; make them public (no underscore, in "
        "__all__) or move the code that needs them:\n" + "\n".join(bad)
    )


def test_the_private_name_check_catches_both_forms():
    source = (
        "from ddl_tf.core.topology import _canonical\n"
        "from ddl_tf.core import topology\n"
        "import ddl_tf.core.selection as sel\n"
        "import ddl_tf.env\n"
        "def f():\n"
        "    return topology._ranges, sel._ALGOS, ddl_tf.env._environ, topology.Topology\n"
    )
    tree = ast.parse(source)
    found = list(imports_of("ddl_tf.launch.command", tree))
    bad = list(private_uses("ddl_tf.launch.command", tree, found))
    assert [b.split(": ", 1)[1] for b in bad] == [
        "imports ddl_tf.core.topology._canonical",
        "uses ddl_tf.core.topology._ranges",
        "uses ddl_tf.core.selection._ALGOS",
        "uses ddl_tf.env._environ",
    ]


def test_no_module_is_over_the_line_budget():
    long = {
        str(path.relative_to(PACKAGE_DIR.parent)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, (
        f"ddl_tf modules over {MAX_LINES} lines: {long}; split each into modules of one "
        "concept (see /work/shared/CONVENTIONS.md, rule 1)."
    )
