"""The demo's outputs: a training-curve PNG, a JSON summary and a text report."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tflms.utils.units import format_bytes  # noqa: E402

from .data import CLASS_NAMES  # noqa: E402

__all__ = ["plot_training", "format_report"]


def plot_training(epochs: list[dict], path: Path) -> None:
    """Loss and per-class validation Dice per epoch."""
    x = [e["epoch"] for e in epochs]
    fig, (ax_loss, ax_dice) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_loss.plot(x, [e["loss"] for e in epochs], marker="o")
    ax_loss.set(xlabel="epoch", ylabel="training loss (CE + soft Dice)", title="Loss")
    for c, name in enumerate(CLASS_NAMES):
        ax_dice.plot(x, [e["dice"][c] for e in epochs], marker="o", label=name)
    ax_dice.set(xlabel="epoch", ylabel="Dice", ylim=(0, 1.02), title="Validation Dice per class")
    ax_dice.legend(loc="lower right", fontsize=8)
    for ax in (ax_loss, ax_dice):
        ax.grid(alpha=0.3)
        ax.set_xticks(x)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mem_line(row: dict | None) -> str:
    if row is None:
        return "  demo size: trained without LMS (--no-lms), not simulated"
    without = format_bytes(row["peak_without_lms_bytes"])
    label = f"  {row['size']}^3 ({row['model']})" if "model" in row else f"  {row['size']}^3"
    if row.get("fits_with_lms") is False:
        best = format_bytes(row["best_peak_with_lms_bytes"])
        return f"{label}: without LMS {without}; with LMS no plan fits (best {best})"
    if "peak_with_lms_bytes" not in row:
        return f"{label}: {without}"
    with_lms = format_bytes(row["peak_with_lms_bytes"])
    note = " (LMS not needed)" if row.get("lms_needed") is False else ""
    swaps = f"{row['swaps']} swaps, " if "swaps" in row else ""
    return (
        f"{label}, batch {row.get('batch', 1)}: without LMS {without}, with LMS {with_lms}{note}, "
        f"{swaps}predicted overhead {100 * row.get('overhead', 0):.1f}%"
    )


def format_report(summary: dict) -> str:
    """A short report a person can read."""
    lines = [
        "=" * 72,
        f"3D U-Net on {summary['data']['source']} volumes ({summary['data']['size']}^3, "
        f"{summary['data']['channels']} channels), {summary['ranks']} ranks, "
        f"{summary['epochs']} epochs",
    ]
    lms = summary["lms"]
    lines.append(
        f"LMS plan: {lms['swaps']} tensors swapped, {format_bytes(lms['bytes_swapped'])} each way per step "
        f"({lms['swap_ins']} swap-ins)"
    )
    lines.append("Per epoch (loss, validation Dice per class: " + ", ".join(CLASS_NAMES) + "):")
    for e in summary["history"]:
        dice = " ".join(f"{d:.3f}" for d in e["dice"])
        lines.append(
            f"  epoch {e['epoch']}: loss {e['loss']:.4f}  Dice {dice}  "
            f"{e['volumes_per_second']:.2f} volumes/s/rank, allreduce {100 * e['allreduce_seconds'] / e['seconds']:.1f}% of the epoch"
        )
    perf = summary["performance"]
    lines.append(
        f"Throughput after the first epoch: {perf['volumes_per_second_per_rank']:.2f} volumes/s per rank; "
        f"communication share {100 * perf['communication_share']:.1f}%"
    )
    lines.append(f"Weights identical on all ranks: {summary['weights_identical']}")
    mem = summary["memory"]
    lines.append(
        f"Simulated GPU peak ({mem['simulator']}; {mem['device']}, {mem['link']}, budget {mem['budget']}):"
    )
    lines.append(_mem_line(mem["demo"]))
    for row in mem["seed_sizes"]:
        lines.append(_mem_line(row))
    lines.append("Files: " + ", ".join(summary["files"].values()))
    lines.append("=" * 72)
    return "\n".join(lines)
