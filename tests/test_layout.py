"""The shape of the code, checked from the source with ``ast`` (nothing is imported).

For each package (``tflms``, ``ddl_tf``):

* The import graph between its units has no cycles. A unit is a
  sub-package (``tflms.plan``, ``ddl_tf.core``) or a top-level module
  (``tflms.config``, ``ddl_tf.ddlrun``, ... and the package itself). Imports
  inside functions count as much as module-level ones: a lazy import hides a
  dependency from the import-time graph, not from the design. Nor has the
  graph between modules (inside a unit too).
* No module uses another module's private names: neither
  ``from pkg.x import _y`` nor ``x._y`` on an imported module of the package.
* No module has more than :data:`FAIL_CODE_LINES` lines of code (docstrings,
  comments and blank lines not counted); past :data:`WARN_CODE_LINES` a
  warning asks whether it still holds one concept. Modules are split by
  meaning, not by a line count.

Then what each package's layering promises: tflms' pipeline stages depend
only on earlier stages, on base modules below them, and front ends sit above
them; ddl_tf's layers go core -> tensorflow -> keras, and its launch library
sits apart, below the rehearsal cluster and ``ddlrun``. Neither package
imports the other.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("tflms", "ddl_tf")
WARN_CODE_LINES = 400
FAIL_CODE_LINES = 600


def code_lines(source: str) -> int:
    """Lines holding code: docstrings (any string statement), comments and blanks excluded.

    Example:
        >>> code_lines("'Doc.'\\n\\n# note\\nx = 1  # why\\ndef f():\\n    'Doc.'\\n    return x\\n")
        3
    """
    strings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                strings.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in skip or token.type == tokenize.ENDMARKER:
            continue
        lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in strings)
    return len(lines)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Import:
    """One import of a module of the package: who, where, what."""

    importer: str
    line: int
    target: str
    name: str | None  # the name imported from ``target`` (None: the module itself)
    bound: str | None  # the local name it is bound to when it is a module of the package


class Scan:
    """The modules of one package under ``root`` and what they import."""

    def __init__(self, package: str, root: Path = REPO):
        self.package, self.root = package, root
        self.modules: dict[str, Path] = {}
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self.subpackages = {
            p.name for p in (root / package).iterdir() if (p / "__init__.py").exists()
        }

    def where(self, module: str, line: int) -> str:
        return f"{self.modules[module].relative_to(self.root)}:{line}"

    def unit_of(self, module: str) -> str:
        """``tflms.plan`` for ``tflms.plan.planner``; a top-level module is its own unit."""
        parts = module.split(".")
        if len(parts) > 1 and parts[1] in self.subpackages:
            return ".".join(parts[:2])
        return module

    @cached_property
    def trees(self) -> dict[str, ast.Module]:
        return {m: ast.parse(p.read_text(), str(p)) for m, p in self.modules.items()}

    def _absolute(self, importer: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        is_pkg = self.modules[importer].name == "__init__.py"
        package = importer if is_pkg else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def _longest_module(self, dotted: str) -> str | None:
        while dotted and dotted not in self.modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def imports_of(self, module: str, tree: ast.Module) -> Iterator[Import]:
        """Every import of a module of the package, at any depth, plus literal import_module()."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._longest_module(alias.name)
                    if target is None:
                        continue
                    # `import pkg.a.b` binds `pkg`; `... as e` binds the module itself
                    bound = alias.asname or alias.name.partition(".")[0]
                    yield Import(module, node.lineno, target, None, bound)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, node)
                if base.partition(".")[0] != self.package:
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    local = alias.asname or alias.name
                    if submodule in self.modules:
                        yield Import(module, node.lineno, submodule, None, local)
                    else:
                        target = self._longest_module(base)
                        yield Import(module, node.lineno, target, alias.name, None)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value in self.modules
            ):
                yield Import(module, node.lineno, node.args[0].value, None, None)

    def private_uses(self, module: str, tree: ast.Module) -> Iterator[str]:
        """``from pkg.x import _y`` and ``x._y`` on names bound to modules of the package."""
        found = list(self.imports_of(module, tree))
        for imp in found:
            if imp.name is not None and _is_private(imp.name) and imp.target != module:
                yield f"{self.where(module, imp.line)}: imports {imp.target}.{imp.name}"
        bound: dict[str, str] = {}
        for imp in found:
            if imp.bound is not None:
                # `import pkg.a.b` binds the top package name, `as x` the module itself
                bound[imp.bound] = imp.target if imp.bound != self.package else self.package
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            chain = _dotted(node)
            if not chain or chain[0] not in bound:
                continue
            owner = bound[chain[0]]
            for attr in chain[1:]:
                if f"{owner}.{attr}" in self.modules:
                    owner = f"{owner}.{attr}"
                    continue
                if _is_private(attr) and owner != module:
                    yield f"{self.where(module, node.lineno)}: uses {owner}.{attr}"
                break

    @cached_property
    def unit_graph(self) -> nx.DiGraph:
        """Units as nodes; an edge per unit pair, with the import sites that create it."""
        graph = nx.DiGraph()
        graph.add_nodes_from(sorted({self.unit_of(m) for m in self.modules}))
        for module, tree in self.trees.items():
            for imp in self.imports_of(module, tree):
                a, b = self.unit_of(module), self.unit_of(imp.target)
                if a == b:
                    continue
                if not graph.has_edge(a, b):
                    graph.add_edge(a, b, sites={})
                site = f"{self.where(module, imp.line)} imports {imp.target}"
                graph.edges[a, b]["sites"][site] = None
        return graph

    @cached_property
    def module_graph(self) -> nx.DiGraph:
        """Modules as nodes, an edge per import (``from pkg import mod`` reaches ``pkg.mod``)."""
        graph = nx.DiGraph()
        graph.add_nodes_from(self.modules)
        for module, tree in self.trees.items():
            for imp in self.imports_of(module, tree):
                target = imp.target
                if imp.name is not None and f"{target}.{imp.name}" in self.modules:
                    target = f"{target}.{imp.name}"
                if target != module:
                    graph.add_edge(module, target)
        return graph

    def cycles(self) -> list[str]:
        """Each import cycle between units, with the import sites that close it."""
        graph = self.unit_graph
        report = []
        for found in sorted(nx.simple_cycles(graph), key=len):
            start = found.index(min(found))  # the same rotation every run
            cycle = found[start:] + found[:start]
            report.append(" -> ".join([*cycle, cycle[0]]))
            for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
                report.extend(f"    {site}" for site in graph.edges[a, b]["sites"])
        return report


def _dotted(node: ast.expr) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


@pytest.fixture(scope="module", params=PACKAGES)
def scan(request) -> Scan:
    return Scan(request.param)


def test_units_import_each_other_one_way_only(scan):
    cycles = scan.cycles()
    assert not cycles, (
        f"import cycle(s) between {scan.package} units (a sub-package or a top-level module); "
        "move the shared code down a layer or the caller up one:\n" + "\n".join(cycles[:40])
    )


def test_modules_import_each_other_one_way_only_lazy_imports_included(scan):
    cycles = sorted(nx.simple_cycles(scan.module_graph), key=len)
    assert not cycles, (
        f"import cycle(s) between {scan.package} modules (an import inside a function counts): "
        + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:20])
    )


def test_no_module_uses_another_modules_private_names(scan):
    bad = [use for module, tree in scan.trees.items() for use in scan.private_uses(module, tree)]
    assert not bad, (
        f"private names used across {scan.package} modules; make them public (no underscore, "
        "in __all__) or move the code that needs them:\n" + "\n".join(bad)
    )


def test_no_module_is_over_the_code_line_budget(scan):
    sizes = {str(p.relative_to(REPO)): code_lines(p.read_text()) for p in scan.modules.values()}
    large = {path: n for path, n in sizes.items() if WARN_CODE_LINES < n <= FAIL_CODE_LINES}
    if large:
        warnings.warn(
            f"modules over {WARN_CODE_LINES} lines of code: {large}; do they still hold one "
            "concept? (docs/contributing.md, 'Layers, and the tests that enforce them')",
            stacklevel=1,
        )
    too_long = {path: n for path, n in sizes.items() if n > FAIL_CODE_LINES}
    assert not too_long, (
        f"modules over {FAIL_CODE_LINES} lines of code: {too_long}; split each into modules "
        "of one concept (see docs/contributing.md, 'Layers, and the tests that enforce them')."
    )


def test_the_packages_stand_alone(scan):
    other = ({"tflms", "ddl_tf"} - {scan.package}).pop()
    found = []
    for module, tree in scan.trees.items():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [scan.where(module, node.lineno) for n in names if n.split(".")[0] == other]
    assert not found, f"{scan.package} imports {other} (each must install alone): {found}"


TFLMS_STAGES = (
    "graph",
    "plan",
    "apply",
    "simulation",
    "compose",
    "tuning",
    "pipeline",
    "saved_model",
    "cli",
)
"""tflms' pipeline, in order: a stage may use earlier stages, never later ones
(``tflms.pipeline`` joins the stages before it; the SavedModel path and the
front ends run it)."""


def test_the_tflms_pipeline_is_visible_and_flows_one_way():
    scan = Scan("tflms")
    units = scan.subpackages | {m.split(".")[1] for m in scan.modules if m.count(".") == 1}
    assert set(TFLMS_STAGES) <= units, "ls tflms shows the pipeline"
    graph = scan.unit_graph
    for i, early in enumerate(TFLMS_STAGES):
        for late in TFLMS_STAGES[i + 1 :]:
            assert not nx.has_path(graph, f"tflms.{early}", f"tflms.{late}"), (early, late)
    above = ("tflms.frontends", "tflms.keras")
    for base in ("tflms.config", "tflms.errors", "tflms.utils", "tflms.cost"):
        for later in (*(f"tflms.{stage}" for stage in TFLMS_STAGES), *above):
            assert not nx.has_path(graph, base, later), (
                f"{base} is a base module; it must not depend on {later}"
            )
    for stage in TFLMS_STAGES:
        for front in above:
            assert not nx.has_path(graph, f"tflms.{stage}", front), (
                f"the pipeline stage tflms.{stage} must not depend on the front end {front}"
            )
    assert not nx.has_path(graph, "tflms.frontends", "tflms.keras"), "keras builds on frontends"


DDL_TF_LAYERS = ("core", "tensorflow", "keras")
"""ddl_tf's training layers, in order: a layer may use earlier ones, never later ones."""


def test_the_ddl_tf_layers_are_visible_and_flow_one_way():
    scan = Scan("ddl_tf")
    assert {*DDL_TF_LAYERS, "launch", "cluster"} <= scan.subpackages, "ls ddl_tf shows the layers"
    graph = scan.unit_graph
    launching = ("ddl_tf.launch", "ddl_tf.cluster", "ddl_tf.ddlrun")
    for i, early in enumerate(DDL_TF_LAYERS):
        for late in (*(f"ddl_tf.{layer}" for layer in DDL_TF_LAYERS[i + 1 :]), *launching):
            assert not nx.has_path(graph, f"ddl_tf.{early}", late), (early, late)
    for layer in DDL_TF_LAYERS[1:]:
        assert not nx.has_path(graph, "ddl_tf.launch", f"ddl_tf.{layer}"), (
            f"the launch library must not need TensorFlow (ddl_tf.{layer})"
        )
    loose = {m for m in scan.modules if m.count(".") == 1} - {
        f"ddl_tf.{p}" for p in scan.subpackages
    }
    assert loose <= {
        "ddl_tf.config",
        "ddl_tf.env",
        "ddl_tf.errors",
        "ddl_tf.exports",
        "ddl_tf.ddlrun",
    }


def test_elastic_membership_sits_between_the_core_and_the_framework_layers():
    graph = Scan("ddl_tf").unit_graph
    assert graph.has_edge("ddl_tf.membership", "ddl_tf.core"), "membership re-forms core jobs"
    assert not nx.has_path(graph, "ddl_tf.core", "ddl_tf.membership")
    for late in ("ddl_tf.tensorflow", "ddl_tf.keras", "ddl_tf.cluster", "ddl_tf.ddlrun"):
        assert not nx.has_path(graph, "ddl_tf.membership", late), late


DDL_TF_CORE_LAYERS = ("numerics", "topology", "algorithms", "collectives")
"""``ddl_tf.core``'s sub-packages, lowest first; the job modules (``core.basics``, ``core.job``,
...) sit above them all, and ``core.timeline`` below them all."""


def test_the_ddl_tf_core_sub_packages_flow_one_way():
    scan = Scan("ddl_tf")
    core = scan.root / "ddl_tf" / "core"
    assert {p.parent.name for p in core.glob("*/__init__.py")} == set(DDL_TF_CORE_LAYERS)
    graph = nx.DiGraph()
    for module, tree in scan.trees.items():
        for imp in scan.imports_of(module, tree):
            a, b = _core_part(module), _core_part(imp.target)
            if a and b and a != b:
                graph.add_edge(a, b)
    top = [n for n in graph if n not in DDL_TF_CORE_LAYERS and n != "timeline"]
    for i, early in enumerate(DDL_TF_CORE_LAYERS):
        for late in (*DDL_TF_CORE_LAYERS[i + 1 :], *top):
            assert not graph.has_edge(early, late), f"ddl_tf.core.{early} imports {late}"
    assert not any(graph.has_edge("timeline", n) for n in graph), "the timeline is a leaf"


def _core_part(module: str) -> str | None:
    """``numerics`` for ``ddl_tf.core.numerics.mpi``, ``basics`` for ``ddl_tf.core.basics``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ddl_tf", "core"] else None


def test_the_ddl_tf_launch_library_sits_below_the_cluster_and_ddlrun():
    graph = Scan("ddl_tf").unit_graph
    assert not nx.has_path(graph, "ddl_tf.launch", "ddl_tf.cluster")
    assert not nx.has_path(graph, "ddl_tf.core", "ddl_tf.launch")
    assert graph.has_edge("ddl_tf.ddlrun", "ddl_tf.launch")
    assert graph.has_edge("ddl_tf.ddlrun", "ddl_tf.cluster")
    assert graph.in_degree("ddl_tf.ddlrun") == 0, "nothing builds on the command-line front end"


def test_the_checks_see_function_level_relative_and_private_uses(tmp_path):
    pkg = tmp_path / "demo"
    for folder in (pkg, pkg / "low", pkg / "high"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from demo.high import b\n")
    (pkg / "high" / "b.py").write_text(
        "from ..low import a\nfrom demo.low.a import _hidden\nimport demo.util as u\n"
        "import demo.low.a\nx = u._secret, demo.low.a._other, u.public\n"
    )
    (pkg / "util.py").write_text("")
    scan = Scan("demo", tmp_path)
    assert scan.cycles()[0] == "demo.high -> demo.low -> demo.high"
    tree = scan.trees["demo.high.b"]
    assert [u.split(": ", 1)[1] for u in scan.private_uses("demo.high.b", tree)] == [
        "imports demo.low.a._hidden",
        "uses demo.util._secret",
        "uses demo.low.a._other",
    ]


def test_no_exported_name_is_also_a_submodule_name(scan):
    """``pkg.name`` must mean one thing: importing a submodule ``pkg/name.py`` would
    replace the exported function ``pkg.name`` with the module (a lazy export
    then breaks depending on import order)."""
    clashes = []
    for module, path in scan.modules.items():
        if path.name != "__init__.py":
            continue
        package = importlib.import_module(module)
        exported = set(getattr(package, "__all__", ()))
        children = {m.rpartition(".")[2] for m in scan.modules if m.rpartition(".")[0] == module}
        for name in sorted(exported & children):
            value = getattr(package, name)
            if getattr(value, "__name__", None) != f"{module}.{name}":  # not the module itself
                clashes.append(f"{module}.{name}")
    assert not clashes, f"exported names that are also submodules (rename the module): {clashes}"


def test_keras_internals_are_read_in_one_compatibility_module():
    # Stack frames and private Keras attributes break first when Keras moves; only
    # tflms/keras/compat.py (tested against the pinned Keras) may read them.
    allowed = REPO / "tflms" / "keras" / "compat.py"
    pattern = re.compile(r"_getframe|\bf_locals\b|_first_batches|\bf_back\b")
    offenders = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path != allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, "move these into tflms/keras/compat.py:\n" + "\n".join(offenders)


PLANNING_STAGES = ("graph", "plan", "apply", "compose", "tuning")
"""The stages the pipeline hands its resolved :class:`~tflms.cost.target.Target` to."""
TARGET_ARGUMENTS = ("device", "link", "accounting", "target", "budget", "stack")
OWN_TARGET = {"tflms.tuning.autotuner.autotune"}
"""Public entry points that, called on a view by a user, resolve a target of their own
(the pipeline passes its own, so they resolve nothing then)."""


def test_the_pipeline_resolves_the_target_once_and_no_planning_stage_defaults_it():
    """Below :mod:`tflms.pipeline` a target is an argument: no planning stage defaults
    a device, link, accounting or budget, or builds a target from a config."""
    scan = Scan("tflms")
    defaults, builds = [], []
    for module, tree in scan.trees.items():
        if scan.unit_of(module).split(".")[-1] not in PLANNING_STAGES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and f"{module}.{node.name}" not in OWN_TARGET:
                args = node.args
                positional = args.posonlyargs + args.args
                padded = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
                pairs = [
                    *zip(positional, padded, strict=True),
                    *zip(args.kwonlyargs, args.kw_defaults, strict=True),
                ]
                defaults += [
                    f"{scan.where(module, node.lineno)} {node.name}({arg.arg}=...)"
                    for arg, default in pairs
                    if arg.arg in TARGET_ARGUMENTS and default is not None
                ]
            elif isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called.endswith(".target") or called.startswith("Target.for_"):
                    builds.append(f"{scan.where(module, node.lineno)} {called}()")
    assert not defaults, "planning stages default what the target names:\n" + "\n".join(defaults)
    allowed = [b for b in builds if "tflms/tuning/autotuner.py" in b]
    assert builds == allowed, "planning stages resolve a target themselves:\n" + "\n".join(builds)


def test_the_ddl_tf_engine_takes_a_reduce_spec_not_loose_reduction_arguments():
    # A reduction's op, compression and scale factors are parsed once, into a ReduceSpec,
    # where the public API takes Horovod's keywords; the engine takes that spec and parses
    # nothing again (docs/how-it-works.md, "Keras 3").
    tree = ast.parse((REPO / "ddl_tf" / "core" / "collectives" / "engine.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    methods = {n.name: n for n in engine.body if isinstance(n, ast.FunctionDef)}
    loose = {"op", "average", "compression", "prescale_factor", "postscale_factor"}
    for name in ("allreduce", "reducescatter", "grouped_reducescatter"):
        args = methods[name].args
        params = {a.arg: a for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        assert not loose & set(params) and args.kwarg is None, (
            f"Engine.{name} takes loose reduction arguments {sorted(loose & set(params))}; "
            "take a ReduceSpec (ddl_tf/core/collectives/reduce_spec.py) instead"
        )
        spec = params.get("spec")
        assert spec is not None and spec.annotation is not None, f"Engine.{name} has no spec"
        assert ast.unparse(spec.annotation) == "ReduceSpec", ast.unparse(spec.annotation)
    called = {
        n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
        for n in ast.walk(engine)
        if isinstance(n, ast.Call)
    }
    assert "parse_op" not in called, "the engine parses an op again: it comes parsed in the spec"
