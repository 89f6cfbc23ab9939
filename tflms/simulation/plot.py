"""PNG memory timelines of simulated training steps.

:func:`plot_result` draws device memory over the simulated step (top) and
host memory (bottom): the step with swaps, the same step without swaps when
the result carries a baseline, the memory budget as a dashed line, and the
device peak marked with the op that reached it. Time is in milliseconds of
simulated time; both runs are drawn on their own time axis so a slower step
with swaps visibly ends later.

Example:
    >>> import os, tempfile
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> from tflms.simulation.simulator import simulate
    >>> v = nx.DiGraph(name="chain")
    >>> for i in range(4):
    ...     out = (TensorInfo(f"op{i}:0", 0, "float32", (1 << 20,), 4 << 20),)
    ...     v.add_node(f"op{i}", type="Relu", device="", placement="compute", outputs=out,
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     if i:
    ...         v.add_edge(f"op{i-1}", f"op{i}", tensors=[(0, 0)], control=False)
    >>> assign_levels(v)
    >>> path = os.path.join(tempfile.mkdtemp(), "timeline.png")
    >>> plot_result(simulate(v), path, budget_bytes=12 << 20)
    >>> os.path.getsize(path) > 10_000
    True
"""

from __future__ import annotations

import logging
import os

from tflms.utils.units import format_bytes

__all__ = ["plot_result"]

logger = logging.getLogger(__name__)

_GIB = float(1 << 30)


def _steps(times, values, end):
    """Step curve points: each value holds until the next point."""
    xs: list[float] = []
    ys: list[float] = []
    for k, (t, v) in enumerate(zip(times, values, strict=True)):
        nxt = times[k + 1] if k + 1 < len(times) else end
        xs.extend((t * 1e3, nxt * 1e3))
        ys.extend((v / _GIB, v / _GIB))
    return xs, ys


def plot_result(result, path, *, budget_bytes: int | None = None, title: str | None = None) -> None:
    """Write the memory timeline of ``result`` to the PNG file ``path``.

    Args:
        result: a :class:`~tflms.simulation.simulator.SimulationResult`.
        path: where to write the PNG (folders are created).
        budget_bytes: draw this memory budget as a dashed line.
        title: the figure title (default: graph, device and link).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (ax_dev, ax_host) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
    )
    base = result.baseline
    end = max(result.step_time_s, base.step_time_s if base is not None else 0.0)
    if base is not None:
        xs, ys = _steps(base.timeline_s, base.timeline_device, base.step_time_s)
        ax_dev.plot(xs, ys, color="0.55", lw=1.2, label=_label("without swaps", base))
    xs, ys = _steps(result.timeline_s, result.timeline_device, result.step_time_s)
    with_swaps = "with swaps" if result.swap_outs else "simulated"
    ax_dev.plot(xs, ys, color="tab:blue", lw=1.6, label=_label(with_swaps, result))
    ax_dev.fill_between(xs, ys, color="tab:blue", alpha=0.12, lw=0)
    if result.variable_bytes:
        ax_dev.axhline(
            result.variable_bytes / _GIB, color="tab:green", lw=0.8, ls=":", label="variables"
        )
    if budget_bytes:
        ax_dev.axhline(
            budget_bytes / _GIB,
            color="tab:red",
            ls="--",
            lw=1.3,
            label=f"budget {format_bytes(budget_bytes)}",
        )
    peak_y = result.device_peak_bytes / _GIB
    ax_dev.plot([result.peak_time_s * 1e3], [peak_y], "o", color="tab:red", ms=7, zorder=5)
    ax_dev.annotate(
        f"peak {format_bytes(result.device_peak_bytes)}\n{_short(result.peak_op)}",
        (result.peak_time_s * 1e3, peak_y),
        xytext=(12, -4),
        textcoords="offset points",
        fontsize=8.5,
        va="top",
        bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.7", "alpha": 0.9},
    )
    top = max(peak_y, (base.device_peak_bytes / _GIB) if base is not None else 0.0)
    if budget_bytes:
        top = max(top, budget_bytes / _GIB)
    ax_dev.set_ylim(0, top * 1.12 or 1.0)
    ax_dev.set_ylabel("device memory (GiB)")
    ax_dev.legend(loc="upper left", fontsize=8.5, framealpha=0.9)
    ax_dev.grid(alpha=0.3)

    xs, ys = _steps(result.timeline_s, result.timeline_host, result.step_time_s)
    ax_host.plot(xs, ys, color="tab:orange", lw=1.4, label="host memory (swapped tensors)")
    ax_host.fill_between(xs, ys, color="tab:orange", alpha=0.15, lw=0)
    ax_host.set_ylabel("host (GiB)")
    ax_host.set_xlabel("simulated time in the training step (ms)")
    ax_host.set_xlim(0, end * 1e3 * 1.01 or 1.0)
    ax_host.set_ylim(0, max(result.host_peak_bytes / _GIB * 1.15, 0.01))
    ax_host.legend(loc="upper left", fontsize=8.5, framealpha=0.9)
    ax_host.grid(alpha=0.3)

    fig.suptitle(
        title or f"{result.graph_name or 'training step'} on {result.device} over {result.link}",
        fontsize=12,
    )
    fig.text(
        0.99,
        0.005,
        f"SIMULATED by {result.simulator}; {result.accounting} memory accounting",
        ha="right",
        va="bottom",
        fontsize=7,
        color="0.35",
    )
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    logger.info("wrote memory timeline %s", path)


def _label(kind: str, result) -> str:
    text = f"{kind}: peak {format_bytes(result.device_peak_bytes)}, step {result.step_time_s * 1e3:.0f} ms"
    if result.baseline is not None and result.baseline_step_time_s:
        text += f" ({result.overhead:+.1%})"
    return text


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]
