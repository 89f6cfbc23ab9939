"""What the ``tflms`` command prints: readable reports and their JSON twins.

Pure formatting of :class:`tflms.saved_model.rewrite.ModelAnalysis` (and of
simulation results when the simulator is installed); no I/O except reading
a plan file. Every simulated figure is labelled with the simulator that
produced it.

Example:
    >>> plans = plans_from_json({"format_version": 1, "swaps": [], "graph_name": "f",
    ...     "serialization": [], "config": {"swapin_ahead": 2}, "skipped": [], "notes": [],
    ...     "batch_size": None})
    >>> plans["f"].swaps, plans["f"].config.swapin_ahead
    ((), 2)
"""

from __future__ import annotations

import json

from tflms.errors import ConfigError
from tflms.plan.swap_plan import SwapPlan
from tflms.utils.units import format_bytes

__all__ = [
    "analysis_dict",
    "analysis_text",
    "plans_dict",
    "plans_from_json",
    "read_plans",
    "simulation_text",
]

PLANS_FORMAT = "tflms.plans"


def _header(analysis) -> dict:
    model = analysis.model
    return {
        "source": str(model.path),
        "format": model.format,
        "format_description": model.describe(),
        "graphs": sum(1 for t in analysis.targets if t.kind == "graph"),
        "functions": sum(1 for t in analysis.targets if t.kind == "function"),
        "training_graphs": [t.name for t in analysis.training],
        "config": analysis.config.to_dict(),
    }


def analysis_dict(analysis, peaks: dict | None = None) -> dict:
    """JSON-ready analysis: the model, every graph, the training graphs with their plans.

    Args:
        analysis: The model's analysis.
        peaks: ``{training graph name: SimulationResult}`` to include as each
            graph's ``simulation`` entry (without timeline); None for none.

    Returns:
        A dict of plain JSON values.
    """
    data = _header(analysis)
    data["targets"] = [
        {"name": t.name, "kind": t.kind, "ops": len(t.nodes), "gradient_ops": t.gradient_ops}
        for t in analysis.targets
    ]
    data["training"] = [t.to_dict() for t in analysis.training]
    for entry, done in zip(data["training"], analysis.training, strict=True):
        if peaks and done.name in peaks:
            entry["simulation"] = peaks[done.name].to_dict(timeline=False)
    return data


def analysis_text(analysis, peaks: dict | None = None) -> str:
    """The readable analysis report.

    Args:
        analysis: The model's analysis.
        peaks: ``{training graph name: SimulationResult}`` whose predicted
            peaks the report shows; None for none.

    Returns:
        The report, lines joined with newlines.
    """
    head = _header(analysis)
    lines = [
        f"{head['source']}: {head['format_description']}, {head['graphs']} graph(s), "
        f"{head['functions']} function(s)",
    ]
    if not analysis.training:
        lines.append(
            "no training graph: nothing computes gradients (an inference-only model), "
            "so there is nothing to swap"
        )
    for done in analysis.training:
        g = done.view.graph
        batch = (
            f"batch {g['batch_size']} (from {g['batch_source']})"
            if g.get("batch_size")
            else "batch unknown: sizes are per sample (pass --batch-size)"
        )
        lines.append("")
        args = len(done.arguments)
        lines.append(
            f"{done.target.kind} {done.name}: {done.view.number_of_nodes() - args} ops "
            f"({done.target.gradient_ops} gradient ops)"
            + (f", {args} arguments" if args else "")
            + f", depth {g.get('depth')}, {batch}"
        )
        lines.append("  devices: " + ", ".join(f"{d} {n}" for d, n in done.devices().items()))
        lines.append("  op types: " + ", ".join(f"{t} {n}" for t, n in done.op_types()))
        if done.target.unsized_resources:
            lines.append(
                f"  note: {done.target.unsized_resources} resource arguments have no known "
                "variable; reads of them are unsized"
            )
        lines.extend("  " + line for line in done.plan.summary().splitlines())
        if done.tuning is not None:
            lines.extend("  " + line for line in done.tuning.summary().splitlines())
        if peaks and done.name in peaks:
            lines.extend("  " + line for line in _peak_lines(peaks[done.name]))
    others = [t for t in analysis.targets if not t.trains]
    if others:
        names = ", ".join(t.name for t in others[:6]) + (", ..." if len(others) > 6 else "")
        lines.append("")
        lines.append(f"left unchanged ({len(others)} without gradients): {names}")
    return "\n".join(lines)


def _peak_lines(result) -> list[str]:
    base = result.baseline
    if base is not None:
        text = (
            f"predicted device peak: {format_bytes(base.device_peak_bytes)} without swaps, "
            f"{format_bytes(result.device_peak_bytes)} with this plan "
            f"({result.overhead:+.1%} step time)"
        )
    else:
        text = f"predicted device peak: {format_bytes(result.device_peak_bytes)} (no swaps)"
    lines = [text]
    terms = result.memory_terms
    if terms:
        tensors = format_bytes(terms["tensors"])
        if base is not None and base.memory_terms:
            tensors = f"{format_bytes(base.memory_terms['tensors'])} -> {tensors}"
        rest = format_bytes(sum(terms.values()) - terms["tensors"])
        lines.append(
            f"  of which tensors {tensors}; the rest ({rest}) is what a TensorFlow GPU process "
            f"holds beyond them ({result.stack} stack: driver, CUDA context, reserve, workspace, "
            "fragmentation)"
        )
    lines.append(
        f"  (simulated on {result.device} over {result.link} by {result.simulator}; "
        f"{result.accounting} accounting)"
    )
    return lines


def simulation_text(name: str, result, tuning=None) -> str:
    """The readable simulation report of one training graph.

    Args:
        name: Name of the training graph.
        result: Its simulation result.
        tuning: The auto-tuner's result, whose summary comes first; None when
            the plan was not tuned.

    Returns:
        The report, lines joined with newlines.
    """
    lines = [f"{name}:"]
    if tuning is not None:
        lines.extend("  " + line for line in tuning.summary().splitlines())
    lines.extend("  " + line for line in result.summary().splitlines())
    return "\n".join(lines)


def plans_dict(analysis) -> dict:
    """The plans of every training graph, as ``tflms rewrite --dry-run`` prints them.

    Args:
        analysis: The model's analysis (with its plans).

    Returns:
        ``{"format", "source", "config", "plans": {graph name: plan dict}}``.
    """
    return {
        "format": PLANS_FORMAT,
        "source": str(analysis.model.path),
        "config": analysis.config.to_dict(),
        "plans": {t.name: t.plan.to_dict() for t in analysis.training},
    }


def plans_from_json(data) -> dict[str, SwapPlan]:
    """``{graph name: plan}`` from :func:`plans_dict` output or one plan's JSON.

    Args:
        data: Parsed JSON: a :func:`plans_dict` document or one plan's dict.

    Returns:
        The plans by training-graph name.

    Raises:
        ConfigError: ``data`` is neither, or a plan in it is malformed.
    """
    if isinstance(data, dict) and data.get("format") == PLANS_FORMAT:
        entries = data.get("plans")
        if not isinstance(entries, dict):
            raise ConfigError("The plan file's 'plans' entry must map graph names to plans.")
        return {name: SwapPlan.from_dict(plan) for name, plan in entries.items()}
    if isinstance(data, dict) and "swaps" in data:
        plan = SwapPlan.from_dict(data)
        return {plan.graph_name: plan}
    raise ConfigError(
        "A plan file holds the output of `tflms rewrite SRC DST --dry-run` or one "
        "SwapPlan's JSON (tflms.SwapPlan.to_json())."
    )


def read_plans(path) -> dict[str, SwapPlan]:
    """Read a plan file (see :func:`plans_from_json`).

    Args:
        path: The plan file (JSON).

    Returns:
        The plans by training-graph name.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or holds no plan.
    """
    try:
        with open(path) as handle:
            data = json.load(handle)
    except OSError as err:
        raise ConfigError(f"Cannot read the plan file '{path}': {err.strerror or err}.") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"The plan file '{path}' is not JSON: {err}.") from err
    return plans_from_json(data)
