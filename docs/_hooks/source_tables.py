"""Docs text made from the source at build time: settings tables, exit codes, ``--help`` output.

A page asks for one with ``{{ source NAME [ARG ...] }}`` on a line of its own:

* ``env_table``: every ``DDL_*`` variable of :mod:`ddl_tf.env` with its
  docstring, its ``ddlrun`` option, its Horovod fallback and its default
  (read from ``ddl_tf/ddlrun.py`` and ``DDLConfig.from_env`` with :mod:`ast`);
* ``lms_config_table``: every field of :class:`tflms.LMSConfig` with its
  command-line option, default and docstring;
* ``hardware_table``: the simulator's device and link presets
  (:mod:`tflms.cost.hardware`);
* ``module_tree PACKAGE``: every module of a package with the first line
  of its docstring;
* ``constant MODULE NAME [FORMAT]``: a constant of the code, inline (the
  only ``source`` directive that may stand inside a sentence);
* ``tflms_exit_codes``: the ``tflms`` exit codes (the table in the
  :mod:`tflms.cli.app` docstring, checked against ``ExitCode``);
* ``help PROG [SUBCOMMAND]``: what ``PROG [SUBCOMMAND] --help`` prints
  (``tflms``, ``ddlrun``, or a script such as ``examples/unet3d_demo.py``,
  run in a subprocess), in a text block.

None of them imports TensorFlow. An unknown name raises ``DocsBuildError``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import shlex
from pathlib import Path

from results_tables import DocsBuildError, markdown_table

__all__ = ["SOURCES", "render_source", "expand", "env_rows", "exit_code_rows"]


def _module_ast(module) -> ast.Module:
    return ast.parse(Path(inspect.getsourcefile(module)).read_text())


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise DocsBuildError(f"the docs read function {name}() from the source, and it is gone.")


def _env_names(node: ast.AST) -> list[str]:
    """``env.X`` attribute names inside ``node``, in source order."""
    return [
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "env"
        and n.attr.isupper()
    ]


def _ddlrun_options() -> dict[str, str]:
    """``{DDL_VAR: "--option"}`` from ``ddl_tf.ddlrun._settings`` (``if args.x: values[env.Y] = ...``)."""
    from ddl_tf import ddlrun

    options = {
        action.dest: "/".join(action.option_strings)
        for action in ddlrun.build_parser()._actions
        if action.option_strings
    }
    found = {}
    for node in ast.walk(_function(_module_ast(ddlrun), "_settings")):
        if not isinstance(node, ast.If):
            continue
        dests = [
            n.attr
            for n in ast.walk(node.test)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "args"
        ]
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Subscript):
                for var in _env_names(stmt.targets[0]):
                    if dests and dests[0] in options:
                        found[var] = options[dests[0]]
    return found


def _config_sources() -> dict[str, tuple[str, list[str]]]:
    """``{DDL_VAR: (DDLConfig field, [fallback variables])}`` from ``ddl_tf.config.ENV_FIELDS``."""
    from ddl_tf import config

    return {
        names[0]: (field, list(names[1:]))
        for field, names, _ in config.ENV_FIELDS
        if names[0].startswith("DDL_")
    }


def env_rows() -> list[list[str]]:
    """One row per ``DDL_*`` constant of :mod:`ddl_tf.env`: name, option, fallback, default, meaning."""
    from ddl_tf import env
    from ddl_tf.config import DDLConfig

    defaults = {f.name: f.default for f in dataclasses.fields(DDLConfig)}
    options, sources = _ddlrun_options(), _config_sources()
    tree, rows = _module_ast(env), []
    for stmt, following in zip(tree.body, [*tree.body[1:], None], strict=True):
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        if not name.startswith("DDL_"):
            continue
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = " ".join(str(following.value.value).split())
        field, fallbacks = sources.get(name, (None, []))
        default = defaults.get(field, "") if field else ""
        rows.append(
            [
                f"`{name}`",
                f"`{options[name]}`" if name in options else "",
                ", ".join(f"`{v}`" for v in fallbacks),
                f"`{field}` = `{default!r}`" if field else "not a DDLConfig field",
                doc or "*(no docstring in ddl_tf/env.py)*",
            ]
        )
    if not rows:
        raise DocsBuildError(
            "ddl_tf/env.py defines no DDL_* constant; the settings table is empty."
        )
    return rows


def _env_table() -> str:
    from ddl_tf import env

    header = [
        "variable",
        "ddlrun option",
        "Horovod fallback",
        "DDLConfig field = default",
        "meaning",
    ]
    rows = env_rows()
    shown = {name.strip("`") for row in rows for name in [row[0], *row[2].split(", ")] if name}
    others = [
        name
        for name, value in vars(env).items()
        if name.isupper() and isinstance(value, str) and name not in shown
    ]
    return markdown_table(header, rows) + (
        "\n\nddl_tf/env.py names these other variables too (the rank layout launchers export, "
        "which `init()` cross-checks against MPI; what `ddlrun` sets for its ranks; other "
        "Horovod names): " + ", ".join(f"`{name}`" for name in others) + "."
    )


def _lms_config_table() -> str:
    from tflms.cli.options import config_fields

    rows = [
        [
            f"`{f.name}`",
            f"`{f.option}`",
            f"`{f.annotation.replace(' | ', ' or ')}`",  # a | would split the table cell
            f"`{f.default!r}`",
            " ".join(f.doc.split()),
        ]
        for f in config_fields()
    ]
    return markdown_table(["field", "tflms option", "type", "default", "meaning"], rows)


def _hardware_table() -> str:
    from tflms.cost.hardware import DEVICES, LINKS

    devices = [
        [
            f"`{d.name}`",
            f"{d.memory_bytes / 2**30:g} GiB",
            f"{d.dense_flops / 1e12:g}",
            f"{d.half_dense_flops / 1e12:g}",
            f"{d.vector_flops / 1e12:g}",
            f"{d.memory_bandwidth / 1e9:g} GB/s",
            d.description,
        ]
        for d in DEVICES.values()
    ]
    links = [
        [
            f"`{link.name}`",
            "unlimited" if link.bandwidth == float("inf") else f"{link.bandwidth / 1e9:g} GB/s",
            f"{link.latency_s * 1e6:g} us",
            link.description,
        ]
        for link in LINKS.values()
    ]
    header = [
        "device preset",
        "memory",
        "dense TFLOP/s",
        "16-bit dense",
        "vector",
        "bandwidth",
        "what it is",
    ]
    return (
        markdown_table(header, devices, "lrrrrrl")
        + "\n\n"
        + markdown_table(["link", "per direction", "per copy", "what it is"], links, "lrrl")
    )


def _module_tree(package: str) -> str:
    """Every module of ``package`` with the first line of its docstring (read with ast)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DocsBuildError(f"{{{{ source module_tree {package} }}}}: {package} is not a package.")
    root = Path(next(iter(spec.submodule_search_locations)))
    rows = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if "__pycache__" in rel.parts or path.name == "__main__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"
        name = str(rel.parent) + "/" if path.name == "__init__.py" else str(rel)
        summary = re.sub(r":\w+:`~?([^`]+)`", r"\1", summary).replace("``", "")
        rows.append((name, summary))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {summary}" for name, summary in rows]
    return "```text\n" + "\n".join(lines) + "\n```"


def _constant(module: str, name: str, spec: str = "") -> str:
    """The value of ``module.name`` (imported), formatted with ``spec``."""
    import importlib

    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise DocsBuildError(f"{{{{ source constant {module} {name} }}}}: {err}.") from err
    return format(value, spec)


def exit_code_rows() -> list[list[str]]:
    """``[code, name, meaning]`` from the table in the ``tflms.cli.app`` docstring."""
    from tflms.cli import app
    from tflms.cli.commands import ExitCode

    meanings: dict[int, str] = {}
    code = None
    for line in (app.__doc__ or "").splitlines():
        match = re.match(r"^(\d+)\s+(.*)$", line)
        if match:
            code = int(match.group(1))
            meanings[code] = match.group(2).strip()
        elif code is not None and line.startswith("     ") and line.strip():
            meanings[code] += " " + line.strip()
        elif line.startswith("==="):
            continue
        else:
            code = None
    rows = []
    for member in ExitCode:
        meaning = meanings.get(member.value, "*(not described in tflms/cli/app.py)*")
        rows.append([str(member.value), f"`{member.name}`", meaning.replace("``", "`")])
    return rows


def _tflms_exit_codes() -> str:
    return markdown_table(["code", "ExitCode", "meaning"], exit_code_rows(), "rll")


def _script_help(script: str) -> str:
    """``python SCRIPT --help`` (a script of this repository), run in a subprocess."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    if not (repo / script).is_file():
        raise DocsBuildError(f"{{{{ source help {script} }}}}: no such script in the repository.")
    proc = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if proc.returncode != 0:
        raise DocsBuildError(
            f"python {script} --help failed ({proc.returncode}): {proc.stderr[-500:]}"
        )
    return f"```text\n$ python {script} --help\n{proc.stdout.rstrip()}\n```"


def _help(prog: str, *subcommand: str) -> str:
    if prog.endswith(".py"):
        return _script_help(prog)
    if prog == "tflms":
        from tflms.cli.app import build_parser
    elif prog == "ddlrun":
        from ddl_tf.ddlrun import build_parser
    else:
        raise DocsBuildError(f"{{{{ source help {prog} }}}}: tflms, ddlrun or a script path.")
    parser = build_parser()
    for name in subcommand:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers or name not in subparsers[0].choices:
            raise DocsBuildError(f"{prog} has no subcommand {name!r}.")
        parser = subparsers[0].choices[name]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal width
    try:
        text = parser.format_help()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    command = " ".join([prog, *subcommand, "--help"])
    return f"```text\n$ {command}\n{text.rstrip()}\n```"


SOURCES = {
    "env_table": _env_table,
    "lms_config_table": _lms_config_table,
    "tflms_exit_codes": _tflms_exit_codes,
    "hardware_table": _hardware_table,
    "module_tree": _module_tree,
    "constant": _constant,
    "help": _help,
}

_SOURCE = re.compile(r"^[ \t]*\{\{\s*source\s+(?P<args>[^}]*?)\s*\}\}[ \t]*$", re.MULTILINE)
_INLINE = re.compile(r"\{\{\s*source\s+(?P<args>constant\s[^}]*?)\s*\}\}")


def render_source(args: str, where: str = "a page") -> str:
    """The Markdown for ``{{ source NAME [ARG ...] }}`` (``args`` is the inside)."""
    words = shlex.split(args)
    if not words or words[0] not in SOURCES:
        raise DocsBuildError(
            f"{where} asks for source {args!r}; known: {', '.join(sorted(SOURCES))}."
        )
    return SOURCES[words[0]](*words[1:])


def expand(markdown: str, where: str = "a page") -> str:
    """Replace every ``{{ source ... }}`` directive in ``markdown``."""
    markdown = _INLINE.sub(lambda m: render_source(m.group("args"), where), markdown)
    return _SOURCE.sub(lambda m: render_source(m.group("args"), where), markdown)
