"""Command-line options generated from :class:`tflms.LMSConfig` (one source of truth).

Every field of ``LMSConfig`` becomes one option: ``swapout_threshold`` ->
``--swapout-threshold``. The help text is the field's attribute docstring,
read from the source of :mod:`tflms.config` with :mod:`ast` (so it is the
text the API reference shows); the value type comes from the field's
annotation; the default shown is the dataclass default. Values are only
converted here - ``"20"`` to ``20``, ``"a,b"`` to ``["a", "b"]`` - and
validated by ``LMSConfig`` itself, so the command line and the Python API
reject the same values with the same message.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="demo")
    >>> add_config_options(parser)
    >>> args = parser.parse_args(["--swapout-threshold", "20", "--excl-types", "Conv2D,MatMul"])
    >>> config = config_from_args(args)
    >>> config.swapout_threshold, config.excl_types
    (20, ('Conv2D', 'MatMul'))
    >>> config_from_args(parser.parse_args(["--sync-mode", "9"]))
    Traceback (most recent call last):
    ...
    tflms.errors.ConfigError: LMSConfig.sync_mode must be 0, 1, 2 or 3. Received sync_mode=9. ...
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path

from tflms import config as config_module
from tflms.config import LMSConfig
from tflms.errors import ConfigError

__all__ = ["ConfigField", "config_fields", "add_config_options", "config_from_args", "ALIASES"]

ALIASES = {"memory_budget": ("--budget",)}
"""Extra spellings of some options (added only when the field exists)."""


@dataclass(frozen=True)
class ConfigField:
    """One ``LMSConfig`` field as the command line sees it.

    Attributes:
        name: the field name; option: ``--name-with-dashes``.
        annotation: the annotation as written (``"int | None"``), with a
            ``Literal`` alias of :mod:`tflms.config` read as the type of its
            values (``SyncMode``: ``"int"``).
        kinds: the types of the annotation's union members
            (``{"int", "None"}``; ``"list"`` for tuples).
        default: the dataclass default.
        doc: the attribute docstring, reflowed to one paragraph per blank line.
    """

    name: str
    annotation: str
    kinds: frozenset
    default: object
    doc: str

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def metavar(self) -> str:
        if "list" in self.kinds:
            return "A,B,..."
        if ("int" in self.kinds and "str" in self.kinds) or self.name.endswith("_bytes"):
            return "SIZE"
        for kind, metavar in (("int", "N"), ("float", "X"), ("str", "STR")):
            if kind in self.kinds:
                return "DEVICE" if "device" in self.name else metavar
        return "VALUE"

    def convert(self, text: str):
        """The Python value for ``text``; LMSConfig validates it afterwards.

        Args:
            text: The option's command-line value.

        Returns:
            None for ``"none"`` (optional fields), a list of the comma-separated
            items (list fields), an int or float when the text parses as the
            field's kind, else ``text`` unchanged.
        """
        if "None" in self.kinds and text.strip().lower() == "none":
            return None
        if "list" in self.kinds:
            return [item.strip() for item in text.split(",") if item.strip()]
        if "int" in self.kinds:
            with contextlib.suppress(ValueError):
                return int(text)
        if "float" in self.kinds:
            with contextlib.suppress(ValueError):
                return float(text)
        return text  # strings, and values LMSConfig reports clearly ("64KiB", "abc")


@functools.lru_cache(maxsize=1)
def config_fields() -> tuple[ConfigField, ...]:
    """The fields of ``LMSConfig`` with their docstrings and annotations, in order."""
    source_file = inspect.getsourcefile(config_module)
    assert source_file is not None  # tflms.config is a .py file
    source = Path(source_file).read_text()
    class_def = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == LMSConfig.__name__
    )
    docs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    body = class_def.body
    for stmt, following in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotations[stmt.target.id] = _plain(ast.unparse(stmt.annotation))
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.target.id] = _with_tables(_reflow(following.value.value))
    fields = []
    for f in dataclasses.fields(LMSConfig):
        annotation = annotations.get(f.name, str(f.type))
        default: object = f.default
        if default is dataclasses.MISSING:
            assert f.default_factory is not dataclasses.MISSING  # every field has a default
            default = f.default_factory()
        fields.append(
            ConfigField(f.name, annotation, _kinds(annotation), default, docs.get(f.name, ""))
        )
    return tuple(fields)


def _plain(annotation: str) -> str:
    """``annotation`` with each ``Literal`` alias of :mod:`tflms.config` read as its values' type.

    ``"SyncMode"`` (``Literal[0, 1, 2, 3]``) reads as ``"int"``: the command line
    converts and shows the value as that type, and ``LMSConfig`` checks it.
    """
    members = []
    for member in (m.strip() for m in annotation.split("|")):
        alias = getattr(config_module, member, None)
        if typing.get_origin(alias) is typing.Literal:
            member = type(typing.get_args(alias)[0]).__name__
        members.append(member)
    return " | ".join(members)


def _kinds(annotation: str) -> frozenset:
    kinds = set()
    for member in annotation.split("|"):
        member = member.strip()
        kinds.add("list" if member.startswith(("tuple", "list")) else member)
    return frozenset(kinds)


def _reflow(doc: str) -> str:
    text = inspect.cleandoc(doc)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return "\n".join(p for p in paragraphs if p)


def _with_tables(doc: str) -> str:
    """Inline the module-level tables a docstring points to (``see SYNC_MODES``)."""
    for name in re.findall(r"\bsee ([A-Z][A-Z_]+)\b", doc):
        table = getattr(config_module, name, None)
        if isinstance(table, dict):
            doc += " " + "; ".join(f"{key}: {value}" for key, value in table.items()) + "."
    return doc


def _help(field: ConfigField) -> str:
    default = field.default
    if isinstance(default, tuple):
        default = ",".join(map(str, default)) or "none"
    return f"{field.doc.replace('%', '%%')} (default: {default})"


def add_config_options(parser: argparse.ArgumentParser, *, title: str = "LMS options") -> None:
    """Add one option per ``LMSConfig`` field, plus ``--config FILE.json``.

    Options left out of the command line are absent from the parsed
    namespace, so they never override a value from ``--config``.

    Args:
        parser: The (sub)command parser; changed in place.
        title: Title of the argument group in ``--help``.
    """
    group = parser.add_argument_group(
        title,
        "Planner options, generated from tflms.LMSConfig. Lists are comma-separated; "
        "'none' resets an optional value. Precedence: defaults < --config file < flags.",
    )
    group.add_argument(
        "--config",
        metavar="FILE.json",
        dest="config_file",
        help="read options from a JSON object of LMSConfig fields, e.g. "
        '{"swapout_threshold": 20, "excl_types": ["Conv2D"]}',
    )
    for field in config_fields():
        names = [field.option, *ALIASES.get(field.name, ())]
        if "bool" in field.kinds:
            group.add_argument(
                *names,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=_help(field),
            )
            continue
        group.add_argument(
            *names,
            dest=field.name,
            metavar=field.metavar,
            type=field.convert,
            default=argparse.SUPPRESS,
            help=_help(field),
        )


def config_from_args(args: argparse.Namespace) -> LMSConfig:
    """The ``LMSConfig`` of parsed arguments: defaults, then ``--config``, then flags.

    Args:
        args: The namespace ``parse_args`` returned for a parser set up with
            :func:`add_config_options`.

    Returns:
        The validated config.

    Raises:
        ConfigError: an option value is invalid, or the config file is
            unreadable, not JSON, or names unknown options.
    """
    data: dict = {}
    path = getattr(args, "config_file", None)
    if path:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as err:
            raise ConfigError(
                f"Cannot read the config file '{path}': {err.strerror or err}."
            ) from err
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"The config file '{path}' is not JSON ({err}). It must hold one object of "
                'LMSConfig fields, e.g. {"swapout_threshold": 20}.'
            ) from err
        if not isinstance(data, dict):
            raise ConfigError(
                f"The config file '{path}' must hold a JSON object of LMSConfig fields, "
                f"not a {type(data).__name__}."
            )
    for field in config_fields():
        if hasattr(args, field.name):
            data[field.name] = getattr(args, field.name)
    try:
        return LMSConfig.from_dict(data)
    except TypeError as err:  # e.g. a JSON value of a type LMSConfig cannot take
        raise ConfigError(f"Invalid LMS options {data}: {err}.") from err
