"""What each ``tflms`` subcommand does (the parser and error handling live in :mod:`tflms.cli`).

Each command takes the parsed arguments and a :class:`tflms.cli.progress.Progress`,
prints its report on stdout and returns an :class:`ExitCode`; errors are
raised as :class:`tflms.errors.TFLMSError` subclasses, which
:func:`tflms.cli.main` turns into messages and exit codes.

Example:
    >>> int(ExitCode.NOTHING_TO_SWAP), sorted(COMMANDS)
    (6, ['analyze', 'rewrite', 'simulate'])
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from pathlib import Path

from tflms import saved_model  # lazy: TensorFlow loads when a command runs, not for --help
from tflms.cli.options import config_from_args
from tflms.cli.report import (
    analysis_dict,
    analysis_text,
    plans_dict,
    read_plans,
    simulation_text,
)
from tflms.errors import ConfigError, ModelNotFoundError, OutputError, TFLMSError
from tflms.utils.units import format_bytes

__all__ = ["ExitCode", "EXAMPLES", "COMMANDS"]

logger = logging.getLogger("tflms.cli")


class ExitCode(enum.IntEnum):
    """Exit codes of the ``tflms`` command; the table in :mod:`tflms.cli` says when each is used."""

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


def _prepare(args, progress) -> tuple:
    """Load op libraries, read the config and the model (the model is only parsed)."""
    for library in args.op_library:
        _load_op_library(library)
    config = config_from_args(args)
    progress.stage(f"reading {args.src}")
    return config, saved_model.read_model(args.src)


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
    analysis = saved_model.analyze_model(model, config, progress=progress)
    peaks = _predicted_peaks(analysis, progress)
    _emit(args, analysis_dict(analysis, peaks), analysis_text(analysis, peaks))
    return ExitCode.OK


def _predicted_peaks(analysis, progress) -> dict:
    """Simulated peaks per training graph, if the simulator is installed."""
    try:
        from tflms.simulation.simulator import simulate
    except ImportError:
        return {}
    peaks = {}
    for done in analysis.training:
        progress.stage(f"simulating {done.name}")
        if done.tuning is not None:
            peaks[done.name] = done.tuning.result
            continue
        try:
            peaks[done.name] = simulate(done.view, None if done.plan.empty else done.plan)
        except TFLMSError as err:  # the analysis stands without its prediction
            logger.warning("tflms: no predicted peak for %s: %s", done.name, err)
    return peaks


def _cmd_simulate(args, progress) -> int:
    try:
        from tflms.cost.gpu_memory import configured_stack
        from tflms.cost.target import Target
        from tflms.simulation.simulator import simulate
    except ImportError as err:
        raise ConfigError(
            "`tflms simulate` needs the simulator (tflms.simulation.simulator, tflms.tuning.autotuner), which this "
            "tflms build does not include. `tflms analyze` and `tflms rewrite` work without it."
        ) from err
    config, model = _prepare(args, progress)
    analysis = saved_model.analyze_model(model, config, progress=progress)
    if not analysis.training:
        return _nothing_to_swap(args, analysis, "simulate")
    hardware = args.hardware
    # --hardware (default: the default device) over the config's link, once for every graph
    target = Target.for_device(
        hardware, config.link, stack=configured_stack("tf2", config.tensor_factor)
    )
    plain = Target.for_device(hardware, config.link)  # no budget: the sourced stack
    results, texts = {}, []
    for done in analysis.training:
        progress.stage(f"simulating {done.name}")
        if done.tuning is not None:
            result = done.tuning.result
            if hardware is not None and hardware.lower() != result.device.lower():
                result = simulate(done.view, done.plan, target=target)
        else:
            result = simulate(done.view, None if done.plan.empty else done.plan, target=plain)
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
        saved_model.check_destination(args.src, args.dst, force=args.force)
    config, model = _prepare(args, progress)
    analysis = saved_model.analyze_model(model, config, progress=progress, plan=not args.plan)
    if args.plan:
        analysis = analysis.with_plans(read_plans(args.plan))
    if args.dry_run:
        _out(json.dumps(plans_dict(analysis), indent=1))
        return ExitCode.OK if analysis.changed else ExitCode.NOTHING_TO_SWAP
    if not analysis.changed:
        return _nothing_to_swap(args, analysis, "rewrite")
    rewritten = saved_model.rewrite_model(analysis, progress=progress)
    progress.stage(f"writing {args.dst}")
    saved_model.write_model(rewritten, args.dst, force=args.force)
    changed = analysis.changed
    lines = [
        f"{t.target.kind} {t.name}: {len(t.plan.swaps)} tensors swapped "
        f"({format_bytes(t.plan.bytes_swapped)} each way), {len(t.plan.recomputes)} recompute "
        f"groups, {len(t.plan.op_names())} ops inserted"
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
            t.name: {
                "swaps": len(t.plan.swaps),
                "bytes_swapped": t.plan.bytes_swapped,
                "recomputes": len(t.plan.recomputes),
            }
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
    elif all(t.tuning is not None and not t.tuning.lms_needed for t in analysis.training):
        peaks = ", ".join(
            f"{t.name} peaks at {format_bytes(t.tuning.baseline.device_peak_bytes)}"
            for t in analysis.training
        )
        reason = (
            f"nothing to swap in '{analysis.model.path}': it fits the memory budget without "
            f"swapping ({peaks}; usable {format_bytes(analysis.training[0].tuning.usable_bytes)}), "
            "so LMS is not needed."
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
    _out(f"tflms {command}: {reason}", sys.stderr)
    if args.json:
        data = {"nothing_to_swap": True, "reason": reason, **analysis_dict(analysis)}
        _out(json.dumps(data, indent=1))
    return ExitCode.NOTHING_TO_SWAP


def _emit(args, data: dict, text: str) -> None:
    _out(json.dumps(data, indent=1, default=str) if args.json else text)


def _out(text: str, stream=None) -> None:
    """One line of the command's output: stdout (looked up now), or ``stream``."""
    (stream or sys.stdout).write(text + "\n")


COMMANDS = {"analyze": _cmd_analyze, "simulate": _cmd_simulate, "rewrite": _cmd_rewrite}
