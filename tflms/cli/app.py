"""The ``tflms`` command: analyse, simulate and rewrite saved models.

The subcommands mirror the pipeline::

    tflms analyze  SRC [--json] [LMS options]
    tflms simulate SRC [--budget 16GiB] [--link pcie3] [--hardware V100-16GB]
                       [--plot out.png] [--json] [LMS options]
    tflms rewrite  SRC DST [LMS options | --config file.json | --budget 16GiB]
                       [--plan plans.json] [--dry-run] [--force] [--json]

``SRC`` is a SavedModel directory (TF1 ``Builder`` or TF2
``tf.saved_model.save``) or a GraphDef file (``.pb``, ``.pbtxt``). Only the
graphs and functions that compute gradients are rewritten; ``SRC`` is only
read, and analysis never runs the model (protobufs are parsed and shape
inference runs, nothing else). ``DST`` is written beside itself in a
temporary directory and renamed into place when complete.

Exit codes (:class:`ExitCode`):

===  =====================================================================
0    success (``analyze`` of an inference-only model included)
1    internal error: a bug in tflms (rerun with ``--traceback``, report it)
2    usage error: unknown option, bad option value, bad config or plan file
3    SRC (or another input path) is missing or unreadable
4    SRC is not a SavedModel or GraphDef file, or it is corrupt
5    a graph cannot be analysed or rewritten: op types TensorFlow does not
     register (custom ops), an inconsistent graph, a model tflms already
     rewrote
6    nothing to swap: no graph computes gradients (inference-only model) or
     no tensor is worth swapping; ``rewrite`` writes nothing
7    no swap plan fits the memory budget (``--budget``)
8    DST refused or not written: it exists (without ``--force``), it is or
     lies inside SRC, or a write failed (disk full...); nothing partial is left
130  interrupted (Ctrl-C)
===  =====================================================================

Example:
    >>> main(["analyze", "/no/such/model"])
    3
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

import tflms
from tflms.cli.commands import COMMANDS, EXAMPLES, ExitCode
from tflms.cli.options import add_config_options
from tflms.cli.progress import Progress
from tflms.cost.target import DEFAULT_DEVICE
from tflms.errors import (
    AlreadyRewrittenError,
    ConfigError,
    ModelFormatError,
    ModelNotFoundError,
    OutputError,
    PlanInfeasibleError,
    TFLMSError,
    UnsupportedGraphError,
)

__all__ = ["main", "ExitCode", "build_parser", "EXAMPLES"]

_ERRORS = (  # most specific first
    (ConfigError, ExitCode.USAGE),
    (ModelNotFoundError, ExitCode.NOT_FOUND),
    (ModelFormatError, ExitCode.BAD_FORMAT),
    (UnsupportedGraphError, ExitCode.UNSUPPORTED_GRAPH),
    (AlreadyRewrittenError, ExitCode.UNSUPPORTED_GRAPH),
    (PlanInfeasibleError, ExitCode.INFEASIBLE),
    (OutputError, ExitCode.OUTPUT),
)


class _UsageError(Exception):
    def __init__(self, command, message):
        super().__init__(message)
        self.command = command


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that reports errors to :func:`main` instead of exiting."""

    command: str | None = None

    def error(self, message):
        raise _UsageError(self.command, message)


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The ``tflms`` argument parser with its three subcommands."""
    exit_codes = "\n".join(
        f"  {code.value:>3}  {code.name.lower().replace('_', ' ')}" for code in ExitCode
    )
    parser = _Parser(
        prog="tflms",
        description="TensorFlow Large Model Support: rewrite the training graphs of saved "
        "models so that long-lived activations are swapped to host memory.",
        epilog=f"example:\n  {EXAMPLES[None]}\n\nexit codes (details: python -m pydoc tflms.cli.app):\n"
        f"{exit_codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tflms {tflms.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    analyze = _subcommand(
        commands,
        "analyze",
        "what the model holds: graphs, functions with gradients, devices, candidate swaps, "
        "the predicted peak",
    )
    _add_common(analyze, json_help="print the analysis as JSON")

    simulate = _subcommand(
        commands,
        "simulate",
        "simulated peak memory and step time with and without swaps; with --budget, the "
        "auto-tuned plan for that budget",
    )
    _add_common(simulate, json_help="print the simulation as JSON")
    simulate.add_argument(
        "--hardware",
        metavar="PRESET",
        help="device model for the time model, e.g. V100-16GB, A100-80GB (default: the "
        f"budget's preset, else {DEFAULT_DEVICE})",
    )
    simulate.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write the memory timeline as a PNG (one file per training graph: OUT-2.png, ...)",
    )

    rewrite = _subcommand(
        commands,
        "rewrite",
        "write a copy of the model whose training graphs swap to host memory",
        dst=True,
    )
    _add_common(rewrite, json_help="print a JSON summary of what was written")
    rewrite.add_argument(
        "--plan",
        metavar="PLANS.json",
        help="apply these plans (from `tflms rewrite SRC DST --dry-run`) instead of planning",
    )
    rewrite.add_argument(
        "--dry-run", action="store_true", help="print the plans as JSON and write nothing"
    )
    rewrite.add_argument("--force", action="store_true", help="replace DST if it exists")
    return parser


def _subcommand(commands, name: str, summary: str, *, dst: bool = False) -> argparse.ArgumentParser:
    sub = commands.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=f"example:\n  {EXAMPLES[name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.command = name
    sub.add_argument(
        "src", metavar="SRC", help="a SavedModel directory or a GraphDef .pb/.pbtxt file"
    )
    if dst:
        sub.add_argument(
            "dst", metavar="DST", help="where to write the rewritten model (must not exist)"
        )
    return sub


def _add_common(sub: argparse.ArgumentParser, *, json_help: str) -> None:
    sub.add_argument("--json", action="store_true", help=json_help)
    sub.add_argument(
        "--op-library",
        metavar="LIB.so",
        action="append",
        default=[],
        help="load a TensorFlow custom-op library first (repeatable)",
    )
    sub.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    sub.add_argument(
        "--traceback", action="store_true", help="print Python tracebacks of errors (debugging)"
    )
    add_config_options(sub)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the ``tflms`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Args:
        argv: Command-line arguments without the program name; None reads
            ``sys.argv[1:]``.

    Returns:
        The exit code (see the table in the module docstring): 0 on success;
        errors are reported on stderr rather than raised.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        return _fail(err.command, str(err), ExitCode.USAGE, usage=True, parser=parser)
    except SystemExit as exit_:  # --help, --version
        return int(exit_.code or 0)
    handler, level = _configure_logging(args.verbose)
    try:
        with Progress(sys.stderr) as progress:
            return int(COMMANDS[args.command](args, progress))
    except KeyboardInterrupt:
        print("tflms: interrupted; nothing was written.", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except TFLMSError as err:
        code = next((code for kind, code in _ERRORS if isinstance(err, kind)), ExitCode.INTERNAL)
        if args.traceback:
            traceback.print_exc()
        return _fail(args.command, str(err), code)
    except Exception as err:  # a bug: say so, briefly
        if args.traceback:
            traceback.print_exc()
        return _fail(
            args.command,
            f"internal error: {type(err).__name__}: {err}. This is a bug in tflms; rerun with "
            "--traceback and report the output.",
            ExitCode.INTERNAL,
        )
    finally:
        logging.getLogger("tflms").removeHandler(handler)
        logging.getLogger("tflms").setLevel(level)


def _fail(command, message: str, code: int, *, usage: bool = False, parser=None) -> int:
    prefix = f"tflms {command}" if command else "tflms"
    if usage and parser is not None:
        sub = _subparser(parser, command)
        print(sub.format_usage().rstrip(), file=sys.stderr)
    print(f"{prefix}: error: {message}", file=sys.stderr)
    print(f"  example: {EXAMPLES.get(command, EXAMPLES[None])}", file=sys.stderr)
    return int(code)


def _subparser(parser, command):
    if command is None:
        return parser
    for action in parser._actions:  # noqa: SLF001 - argparse exposes subparsers no other way
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices.get(command, parser)
    return parser


def _configure_logging(verbose: int) -> tuple[logging.Handler, int]:
    """Send tflms logs to stderr for this run; returns the handler and the old level."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("tflms")
    old = root.level
    root.addHandler(handler)
    root.setLevel(level)
    return handler, old


if __name__ == "__main__":  # python -m tflms.cli
    sys.exit(main())
