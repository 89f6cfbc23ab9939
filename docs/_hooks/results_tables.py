"""Benchmark numbers for the docs: Markdown made from ``benchmarks/results/*.json`` at build time.

A page asks for a table or a single value with a directive on its own (for a
table) or inline (for a value)::

    {{ table capacity.json capacity }}
    {{ table allreduce.json allreduce_sizes layout="2 ranks, 1 node" }}
    ResNet-50 reaches {{ value capacity.json summary.resnet50.ratio_ours .2f }}x the batch.

A table is a function registered with :func:`table`; it receives the file as a
:class:`Results` and returns Markdown. Adding a table for a new results file
(``horovod_compare.json``, new keys of ``capacity.json``...) is one decorated
function in ``tables_tflms.py`` or ``tables_ddl.py``.

Strictness: a directive naming a results file that does not exist, a table
that is not registered, or a table used with a file it does not read, raises
:class:`DocsBuildError` (the build fails). A key missing *inside* a file is
not fatal: the cell reads "missing" and a note under the table names the keys
and the command that writes the file. Every table of a file marked
``"simulated": true`` says so, with the simulator the file names.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DocsBuildError",
    "Missing",
    "MISSING",
    "Results",
    "Table",
    "TABLES",
    "table",
    "expand",
    "render_table",
    "render_value",
    "writer_of",
    "fmt_seconds",
    "fmt_bytes",
    "fmt_size",
    "fmt_pct",
    "fmt_ratio",
    "markdown_table",
]


class DocsBuildError(Exception):
    """A page asks for something that does not exist; the docs build must stop."""


class Missing:
    """Stands for a key a results file does not have; formats as ``missing``."""

    def __format__(self, spec: str) -> str:
        return "missing"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISSING"


MISSING = Missing()

# Which command writes each results file (shell-style patterns, first match wins).
WRITERS = {
    "allreduce.json": "python benchmarks/bench_allreduce.py",
    "auto_policy.json": "python benchmarks/bench_allreduce.py",
    "capacity.json": "python benchmarks/bench_capacity.py",
    "capacity_transformers.json": "python benchmarks/bench_capacity_transformers.py",
    "cluster_allreduce*.json": "python benchmarks/bench_cluster_allreduce.py (as root)",
    "cluster_auto_policy.json": "python benchmarks/bench_cluster_allreduce.py (as root)",
    "cluster_training.json": "python benchmarks/bench_cluster_training.py (as root)",
    "defaults_sweep.json": "python benchmarks/bench_defaults.py",
    "demo_summary.json": "make demo (a copy of out/demo/summary.json)",
    "elastic.json": "python benchmarks/bench_elastic.py",
    "real_anchors.json": "python benchmarks/bench_real_anchors.py",
    "refit.json": "python benchmarks/bench_refit.py",
    "resnet50_equivalence.json": "python benchmarks/bench_resnet50_equivalence.py",
    "simulator_fidelity.json": "python benchmarks/bench_fidelity.py",
    "tflms_rewrite.json": "python benchmarks/bench_tflms_rewrite.py",
}


def writer_of(name: str) -> str | None:
    """The command that writes results file ``name``, or ``None`` if unknown."""
    for pattern, command in WRITERS.items():
        if fnmatch.fnmatch(name, pattern):
            return command
    return None


@dataclass
class Results:
    """One results file, with look-ups that remember what was missing.

    Args:
        name: The file name (``capacity.json``).
        data: Its parsed JSON.
    """

    name: str
    data: Any
    missing: list[str] = field(default_factory=list)

    def get(self, path: str | list, node: Any = None, *, record: bool = True) -> Any:
        """The value at a dotted ``path`` (list indices as integers), or :data:`MISSING`.

        Args:
            path: ``"models.resnet50.without_lms.ours"``, or a list of keys
                (for keys that contain dots).
            node: Where to start (default: the whole file).
            record: Whether a miss is listed in the note under the table.

        Returns:
            The value, or ``MISSING`` (then recorded in :attr:`missing`).
        """
        keys = path if isinstance(path, list) else path.split(".")
        value = self.data if node is None else node
        for key in keys:
            if isinstance(value, list) and isinstance(key, int | str) and str(key).isdigit():
                index = int(key)
                value = value[index] if index < len(value) else MISSING
            elif isinstance(value, dict) and key in value:
                value = value[key]
            else:
                value = MISSING
            if value is MISSING:
                if record:
                    label = ".".join(str(k) for k in keys)
                    if label not in self.missing:
                        self.missing.append(label)
                return MISSING
        return value


@dataclass(frozen=True)
class Table:
    """A registered table: its function and the results files it reads."""

    name: str
    files: tuple[str, ...]
    render: Callable[..., str]


TABLES: dict[str, Table] = {}


def table(name: str, *files: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register ``fn(results, **options) -> Markdown`` as table ``name`` for ``files`` (patterns)."""

    def register(fn: Callable[..., str]) -> Callable[..., str]:
        if name in TABLES:
            raise ValueError(f"table {name!r} is registered twice")
        TABLES[name] = Table(name, files, fn)
        return fn

    return register


# --------------------------------------------------------------------------- formatting


def fmt_seconds(seconds: Any) -> str:
    """``1.8 us``, ``2.42 ms``, ``1.37 s``: three significant-ish digits."""
    if not isinstance(seconds, int | float):
        return "missing"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: Any) -> str:
    """``16.00 GiB``-style sizes (binary units), as tflms prints them."""
    if not isinstance(n, int | float):
        return "missing"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_size(n: Any) -> str:
    """A message size as benchmarks name it: ``1 KiB``, ``64 MiB`` (exact powers of two)."""
    if not isinstance(n, int):
        return "missing"
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_pct(value: Any, spec: str = "+.0%") -> str:
    """A fraction as a percentage (``+26%``); ``n/a`` for ``None``."""
    if value is None:
        return "n/a"
    if not isinstance(value, int | float):
        return "missing"
    return format(value, spec)


def fmt_ratio(value: Any, digits: int = 2) -> str:
    """``1.23``, or ``missing``."""
    if not isinstance(value, int | float):
        return "missing"
    return f"{value:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column (``l``, ``r``)."""
    align = align or "l" * len(header)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- directives

_TABLE = re.compile(r"^[ \t]*\{\{\s*table\s+(?P<args>[^}]*?)\s*\}\}[ \t]*$", re.MULTILINE)
_VALUE = re.compile(r"\{\{\s*value\s+(?P<args>[^}]*?)\s*\}\}")


def _load(results_dir: Path, name: str, where: str) -> Results:
    path = results_dir / name
    if "/" in name or not path.is_file():
        raise DocsBuildError(
            f"{where} asks for benchmarks/results/{name}, which does not exist. Fix the file "
            f"name, or run the benchmark that writes it ({writer_of(name) or 'make bench'})."
        )
    try:
        return Results(name, json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise DocsBuildError(
            f"{where}: benchmarks/results/{name} is not valid JSON ({err})."
        ) from err


def _simulated_note(results: Results) -> str:
    data = results.data
    if not isinstance(data, dict) or not data.get("simulated"):
        return ""
    simulators = data.get("simulators") or data.get("simulator")
    if isinstance(simulators, dict):
        by = "; ".join(f"{key}: {value}" for key, value in simulators.items())
    elif isinstance(simulators, str):
        by = simulators
    else:
        by = "the file does not name the simulator"
    return f"**Simulated** (no GPU was used), by {by}."


def _source_note(results: Results) -> str:
    data = results.data if isinstance(results.data, dict) else {}
    when = data.get("created") or data.get("generated")
    parts = [f"Source: [`{results.name}`](results/{results.name})"]
    command = writer_of(results.name)
    if command:
        parts.append(f"written by `{command}`")
    if when:
        parts.append(f"on {when}")
    return ", ".join(parts) + "."


def _missing_note(results: Results) -> str:
    if not results.missing:
        return ""
    keys = ", ".join(f"`{key}`" for key in results.missing)
    command = writer_of(results.name) or "the benchmark that writes it"
    return (
        f'*`{results.name}` has no {keys}: those cells read "missing". '
        f"Rerun `{command}` to fill them in.*"
    )


def render_table(results_dir: Path, args: str, where: str = "a page") -> str:
    """The Markdown for ``{{ table FILE NAME [key=value ...] }}`` (``args`` is the inside).

    Raises:
        DocsBuildError: unknown table, missing file, or a table used with a file it does not read.
    """
    words = shlex.split(args)
    if len(words) < 2:
        raise DocsBuildError(
            f"{where}: write {{{{ table FILE NAME [key=value ...] }}}}, not {args!r}."
        )
    name, kind, options = words[0], words[1], {}
    for word in words[2:]:
        key, sep, value = word.partition("=")
        if not sep:
            raise DocsBuildError(f"{where}: table option {word!r} must be key=value.")
        options[key] = value
    results = _load(results_dir, name, where)
    spec = TABLES.get(kind)
    if spec is None:
        raise DocsBuildError(
            f"{where} asks for table {kind!r}, which is not registered; known: {', '.join(sorted(TABLES))}."
        )
    if not any(fnmatch.fnmatch(name, pattern) for pattern in spec.files):
        raise DocsBuildError(f"{where}: table {kind!r} reads {', '.join(spec.files)}, not {name}.")
    try:
        body = spec.render(results, **options)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        body = (
            f"*The `{kind}` table could not be made from `{name}` "
            f"({type(err).__name__}: {err}); the file's layout has changed. "
            f"Update the table in docs/_hooks, or rerun `{writer_of(name) or 'make bench'}`.*"
        )
    notes = [_simulated_note(results), _missing_note(results), _source_note(results)]
    return "\n\n".join([body, *[note for note in notes if note]])


_NAMED_FORMATS = {
    "bytes": lambda v: fmt_bytes(v),
    "seconds": lambda v: fmt_seconds(v),
    "size": lambda v: fmt_size(v),
}


def render_value(results_dir: Path, args: str, where: str = "a page") -> str:
    """The text for ``{{ value FILE PATH [FORMAT] }}``: one number from a results file.

    ``FORMAT`` is a Python format spec (``.2f``, ``+.1%``) or one of
    ``bytes`` (``25.06 GiB``), ``seconds`` (``2.42 ms``) and ``size``
    (``64 MiB``); a missing key renders as ``(missing: FILE has no PATH)``.
    """
    words = shlex.split(args)
    if len(words) not in (2, 3):
        raise DocsBuildError(f"{where}: write {{{{ value FILE PATH [FORMAT] }}}}, not {args!r}.")
    results = _load(results_dir, words[0], where)
    value = results.get(words[1])
    if value is MISSING:
        return f"(missing: `{words[0]}` has no `{words[1]}`)"
    spec = words[2] if len(words) == 3 else ""
    if spec in _NAMED_FORMATS:
        return _NAMED_FORMATS[spec](value)
    try:
        return format(value, spec)
    except (TypeError, ValueError) as err:
        raise DocsBuildError(
            f"{where}: cannot format {words[1]}={value!r} with {spec!r} ({err})."
        ) from err


def expand(markdown: str, results_dir: Path, where: str = "a page") -> str:
    """Replace every ``{{ table ... }}`` and ``{{ value ... }}`` directive in ``markdown``."""
    markdown = _TABLE.sub(lambda m: render_table(results_dir, m.group("args"), where), markdown)
    return _VALUE.sub(lambda m: render_value(results_dir, m.group("args"), where), markdown)
