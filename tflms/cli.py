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
import enum
import json
import logging
import sys
import traceback
from pathlib import Path

import tflms
from tflms.cli_options import add_config_options, config_from_args
from tflms.cli_report import (
    analysis_dict,
    analysis_text,
    plans_dict,
    read_plans,
    simulation_text,
)
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
from tflms.model_io import read_model
from tflms.model_rewrite import analyze_model, rewrite_model
from tflms.model_write import check_destination, write_model
from tflms.progress import Progress

__all__ = ["main", "ExitCode", "build_parser", "EXAMPLES"]

logger = logging.getLogger(__name__)


class ExitCode(enum.IntEnum):
    """Exit codes of the ``tflms`` command (see the module docstring)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    NOT_FOUND = 3
    BAD_FORMAT = 4
    UNSUPPORTED_GRAPH = 5
    NOTHING_TO_SWAP = 6
    INFEASIBLE = 7
    OUTPUT = 8
    INTERRUPTED = 130


EXAMPLES = {
    "analyze": "tflms analyze ./exported/train_model --swapout-threshold 20",
    "simulate": "tflms simulate ./exported/train_model --budget 16GiB --link nvlink2 --plot peak.png",
    "rewrite": "tflms rewrite ./exported/train_model ./exported/train_model_lms --budget 16GiB",
    None: "tflms analyze ./exported/train_model",
}

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
        epilog=f"example:\n  {EXAMPLES[None]}\n\nexit codes (details: python -m pydoc tflms.cli):\n"
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
        "budget's preset, else V100-16GB)",
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


# --------------------------------------------------------------------------- commands


def _prepare(args, progress) -> tuple:
    """Load op libraries, read the config and the model (the model is only parsed)."""
    for library in args.op_library:
        _load_op_library(library)
    config = config_from_args(args)
    progress.stage(f"reading {args.src}")
    return config, read_model(args.src)


def _load_op_library(path: str) -> None:
    import tensorflow as tf

    if not Path(path).is_file():
        raise ModelNotFoundError(
            f"No such op library: '{path}'. Pass the .so file that defines the op."
        )
    try:
        tf.load_op_library(path)
    except (tf.errors.OpError, OSError) as err:
        raise ConfigError(f"TensorFlow cannot load the op library '{path}': {err}.") from err


def _cmd_analyze(args, progress) -> int:
    config, model = _prepare(args, progress)
    analysis = analyze_model(model, config, progress=progress)
    peaks = _predicted_peaks(analysis, progress)
    _emit(args, analysis_dict(analysis, peaks), analysis_text(analysis, peaks))
    return ExitCode.OK


def _predicted_peaks(analysis, progress) -> dict:
    """Simulated peaks per training graph, if the simulator is installed."""
    try:
        from tflms.simulator import simulate
    except ImportError:
        return {}
    peaks = {}
    for done in analysis.training:
        progress.stage(f"simulating {done.name}")
        if done.tuning is not None:
            peaks[done.name] = done.tuning.result
            continue
        try:
            peaks[done.name] = simulate(done.view, done.plan if done.plan.swaps else None)
        except TFLMSError as err:  # the analysis stands without its prediction
            logger.warning("tflms: no predicted peak for %s: %s", done.name, err)
    return peaks


def _cmd_simulate(args, progress) -> int:
    try:
        from tflms.simulator import simulate
    except ImportError as err:
        raise ConfigError(
            "`tflms simulate` needs the simulator (tflms.simulator, tflms.autotuner), which this "
            "tflms build does not include. `tflms analyze` and `tflms rewrite` work without it."
        ) from err
    config, model = _prepare(args, progress)
    analysis = analyze_model(model, config, progress=progress)
    if not analysis.training:
        return _nothing_to_swap(args, analysis, "simulate")
    link = getattr(config, "link", "pcie3")
    hardware = args.hardware
    results, texts = {}, []
    for done in analysis.training:
        progress.stage(f"simulating {done.name}")
        if done.tuning is not None:
            result = done.tuning.result
            if hardware is not None and hardware.lower() != result.device.lower():
                result = simulate(done.view, done.plan, device=hardware, link=link)
        else:
            result = simulate(
                done.view,
                done.plan if done.plan.swaps else None,
                device=hardware or "V100-16GB",
                link=link,
            )
        results[done.name] = (result, done.tuning)
        texts.append(simulation_text(done.name, result, done.tuning))
    if args.plot:
        _plots(args.plot, results, getattr(config, "memory_budget", None))
    data = {
        "source": str(model.path),
        "format": model.format,
        "simulated": True,
        "graphs": {
            name: {
                "simulation": result.to_dict(timeline=False),
                **({"autotune": tuning.to_dict()} if tuning is not None else {}),
            }
            for name, (result, tuning) in results.items()
        },
    }
    _emit(args, data, "\n\n".join(texts))
    return ExitCode.OK


def _plots(path: str, results: dict, budget) -> None:
    base = Path(path)
    for k, (name, (result, tuning)) in enumerate(results.items(), 1):
        target = base if k == 1 else base.with_name(f"{base.stem}-{k}{base.suffix}")
        budget_bytes = tuning.budget_bytes if tuning is not None else None
        try:
            result.plot(target, budget_bytes=budget_bytes, title=f"{name} ({result.device})")
        except OSError as err:
            raise OutputError(f"Cannot write the plot '{target}': {err.strerror or err}.") from err
        logger.info("tflms: wrote %s", target)


def _cmd_rewrite(args, progress) -> int:
    if not args.dry_run:
        check_destination(args.src, args.dst, force=args.force)
    config, model = _prepare(args, progress)
    analysis = analyze_model(model, config, progress=progress)
    if args.plan:
        analysis = analysis.with_plans(read_plans(args.plan))
    if args.dry_run:
        print(json.dumps(plans_dict(analysis), indent=1))
        return ExitCode.OK if analysis.swaps else ExitCode.NOTHING_TO_SWAP
    if not analysis.swaps:
        return _nothing_to_swap(args, analysis, "rewrite")
    rewritten = rewrite_model(analysis, progress=progress)
    progress.stage(f"writing {args.dst}")
    write_model(rewritten, args.dst, force=args.force)
    changed = [t for t in analysis.training if t.plan.swaps]
    lines = [
        f"{t.target.kind} {t.name}: {len(t.plan.swaps)} tensors swapped "
        f"({_bytes(t.plan.bytes_swapped)} each way), {len(t.plan.swaps) + t.plan.num_swap_ins} "
        "swap ops inserted"
        for t in changed
    ]
    unchanged = len(analysis.targets) - len(changed)
    lines.append(
        f"wrote {args.dst} ({model.describe()}); {unchanged} other graphs/functions unchanged"
    )
    data = {
        "source": str(model.path),
        "destination": str(args.dst),
        "format": model.format,
        "rewritten": {
            t.name: {"swaps": len(t.plan.swaps), "bytes_swapped": t.plan.bytes_swapped}
            for t in changed
        },
        "unchanged": unchanged,
    }
    _emit(args, data, "\n".join(lines))
    return ExitCode.OK


def _nothing_to_swap(args, analysis, command: str) -> int:
    if not analysis.training:
        reason = (
            f"nothing to swap in '{analysis.model.path}': no graph or function computes gradients "
            "(an inference-only model). tflms rewrites training graphs: export the model together "
            "with its training step (a tf.function that computes and applies gradients)."
        )
    else:
        reason = (
            f"nothing to swap in '{analysis.model.path}': no tensor of "
            f"{', '.join(t.name for t in analysis.training)} lives long enough under these options "
            "(see `tflms analyze` for why). Lower --swapout-threshold or --min-tensor-bytes, "
            "e.g. `--swapout-threshold 10`."
        )
    if command == "rewrite":
        reason += " Nothing was written."
    print(f"tflms {command}: {reason}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {"nothing_to_swap": True, "reason": reason, **analysis_dict(analysis)}, indent=1
            )
        )
    return ExitCode.NOTHING_TO_SWAP


def _bytes(n: int) -> str:
    from tflms.units import format_bytes

    return format_bytes(n)


def _emit(args, data: dict, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        print(text)


_COMMANDS = {"analyze": _cmd_analyze, "simulate": _cmd_simulate, "rewrite": _cmd_rewrite}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the ``tflms`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
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
            return int(_COMMANDS[args.command](args, progress))
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
