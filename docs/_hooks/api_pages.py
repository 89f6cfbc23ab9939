"""The API reference pages, made at build time from each package's ``__all__``.

``tflms`` and ``ddl_tf`` export their names lazily (PEP 562), which static
tools such as griffe cannot follow. So the pages are written here, after
importing each package for real: for every name in ``__all__`` the module
that *defines* it is found, and the page gets a mkdocstrings block for that
module's object under the public name (``tflms.LMSCallback`` documented
from ``tflms.keras.callback.LMSCallback``). A name added to ``__all__``
appears in the reference at the next build; a name that cannot be located
fails the build.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from results_tables import DocsBuildError

__all__ = ["PACKAGES", "ApiName", "public_names", "reference_page"]

PACKAGES = {
    "tflms": "reference/tflms.md",
    "ddl_tf": "reference/ddl_tf.md",
    "ddl_tf.keras": "reference/ddl_tf.keras.md",
    "tflms.simulation": "reference/tflms.simulation.md",
    "tflms.simulation.crosscheck": "reference/tflms.simulation.crosscheck.md",
    "tflms.compose": "reference/tflms.compose.md",
    "tflms.tuning": "reference/tflms.tuning.md",
    "tflms.zoo": "reference/tflms.zoo.md",
    "ddl_tf.config": "reference/ddl_tf.config.md",
    "ddl_tf.cluster": "reference/ddl_tf.cluster.md",
}
"""The packages (and modules) whose ``__all__`` the reference documents, and their pages."""

INTRO = {
    "tflms": "Large Model Support: the front ends (`LMSCallback`, `function`, `LMS`), the "
    "pipeline stages (analysis, plan, apply, simulation, compose, tuning) and the errors.",
    "ddl_tf": "Horovod's TensorFlow API over MPI (`import ddl_tf as hvd`): initialization, rank "
    "queries, collectives, the gradient tape and the reduce operations.",
    "ddl_tf.keras": "Horovod's Keras API for Keras 3 (`import ddl_tf.keras as hvd`): the "
    "`DistributedOptimizer`, the callbacks and `load_model`, with the collectives taking "
    "and returning tensors.",
    "tflms.simulation": "Predicted peak memory and step time of a training step, without a GPU "
    "(see [the simulator](../simulator.md)).",
    "tflms.simulation.crosscheck": "The simulator side by side with Grappler's own estimate.",
    "tflms.compose": "One plan from the levers (recompute, swap, order), and the choices "
    "made by simulation (order edges, swap-in triggers timed).",
    "tflms.tuning": "The swap plan that fits a memory budget at the lowest predicted cost.",
    "tflms.zoo": "The compiled Keras models the tests, benchmarks, examples and demo train.",
    "ddl_tf.config": "`DDLConfig`, the one configuration value of ddl_tf "
    "(see [settings](../settings.md)).",
    "ddl_tf.cluster": "Rehearsal clusters: virtual nodes on one machine "
    "(see [cluster rehearsal](../cluster-rehearsal.md)).",
}


@dataclass(frozen=True)
class ApiName:
    """One public name: ``public`` (``tflms.LMSCallback``), where it is defined, and its kind."""

    public: str
    defined: str | None
    kind: str


def _defines(module: types.ModuleType, name: str) -> bool:
    """Whether ``module``'s source binds ``name`` at top level (def, class or assignment)."""
    try:
        tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
    except (TypeError, OSError):
        return False
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == name
        ):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for sub in ast.walk(target) if target is not None else ():
                if isinstance(sub, ast.Name) and sub.id == name:
                    return True
    return False


def _locate(package: str, name: str, value: object) -> ApiName:
    public = f"{package}.{name}"
    if isinstance(value, types.ModuleType):
        return ApiName(public, value.__name__, "module")
    if isinstance(value, str) and name == "__version__":
        return ApiName(public, None, "version")
    owner = (
        getattr(value, "__module__", None) if inspect.isclass(value) or callable(value) else None
    )
    candidates = [owner] if owner else []
    root = package.split(".")[0]
    candidates += sorted(m for m in sys.modules if m == root or m.startswith(root + "."))
    for module_name in candidates:
        module = sys.modules.get(module_name)
        if module is not None and vars(module).get(name) is value and _defines(module, name):
            kind = (
                "class"
                if inspect.isclass(value)
                else "function"
                if callable(value)
                else "attribute"
            )
            return ApiName(public, f"{module_name}.{name}", kind)
    raise DocsBuildError(
        f"{public} is in {package}.__all__, but no module of {root} defines it; the reference "
        "cannot document it. Define it in a module (not only by assignment from another name)."
    )


def public_names(package: str) -> list[ApiName]:
    """Every name of ``package.__all__`` with the module that defines it (imports the package)."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if not names:
        raise DocsBuildError(f"{package} has no __all__; the reference lists public names from it.")
    return [_locate(package, name, getattr(module, name)) for name in names]


def reference_page(package: str, seen: dict[str, str] | None = None) -> str:
    """The Markdown of ``package``'s reference page.

    Args:
        package: A key of :data:`PACKAGES`.
        seen: ``{defining path: public name}`` of objects earlier pages
            documented; those get a link here instead of a second copy (an
            object has one place in the reference). Updated in place.
    """
    seen = {} if seen is None else seen
    lines = [
        f"# `{package}`",
        "",
        INTRO.get(package, ""),
        "",
        f"Every name in `{package}.__all__`, in that order, documented from the module that "
        "defines it. This page is generated when the site is built (`docs/_hooks/api_pages.py`).",
        "",
    ]
    for item in public_names(package):
        lines.append(f"## `{item.public}`")
        lines.append("")
        if item.kind == "version":
            lines.append(
                "The installed distribution's version (`tflms-ddl`), from its metadata; "
                "`0+unknown` when running from a source tree that is not installed."
            )
        elif item.defined in seen:
            lines.append(f"The same object as [`{seen[item.defined]}`][{item.defined}].")
        else:
            seen[item.defined] = item.public
            if item.defined != item.public:
                where = item.defined if item.kind == "module" else item.defined.rsplit(".", 1)[0]
                lines.append(f"Defined in `{where}`.")
                lines.append("")
            lines.append(f"::: {item.defined}")
            lines.append("    options:")
            lines.append("      show_root_heading: false")
            lines.append("      heading_level: 3")
            if item.kind == "module":
                lines.append("      show_submodules: false")
                lines.append("      members_order: source")
        lines.append("")
    return "\n".join(lines)
