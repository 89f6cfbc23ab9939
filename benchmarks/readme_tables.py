"""Print the README's simulator tables (Markdown) from the benchmark JSON files.

Usage: ``python benchmarks/readme_tables.py`` after ``make bench``; paste the
output into README.md's "Memory simulator and auto-tuning" section.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1 << 30


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:+.0%}"


def capacity_table(data: dict) -> list[str]:
    lines = [
        "| virtual V100-16GB | without LMS | with LMS over PCIe3 (overhead) "
        "| with LMS over NVLink2 (overhead) | ratio | Grappler judges: without / with LMS "
        "| at the first 2x-oversubscribed size: PCIe3 / NVLink2 overhead |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("resnet50", "ResNet-50 224x224: batch"),
        ("unet3d", "3D U-Net: cube edge"),
    ):
        model = data["models"][name]
        summary = data["summary"][name]
        plain = model["without_lms"]
        cells = []
        for link in ("pcie3", "nvlink2"):
            point = model["with_lms"][link]
            cells.append(f"{point['ours']} ({_pct(point['at_ours'][link].get('overhead'))})")
        over = model["oversubscribed_2x"]
        if over["pcie3"]["fits"] or over["nvlink2"]["fits"]:
            at_2x = (
                f"{over['size']}: {_pct(over['pcie3'].get('overhead'))} / "
                f"{_pct(over['nvlink2'].get('overhead'))}"
            )
        else:
            at_2x = f"{over['size']}: does not fit with LMS"
        lines.append(
            f"| {label} | {plain['ours']} | {cells[0]} | {cells[1]} "
            f"| {summary['ratio_ours']:.2f}x ({summary['ratio_is']}) "
            f"| {plain['grappler']} / {model['with_lms']['grappler']['size']} "
            f"({summary['ratio_grappler']:.2f}x) | {at_2x} |"
        )
    return lines


def fidelity_table(data: dict) -> list[str]:
    lines = [
        "| model | plan | swaps | Grappler peak | ours, Grappler's conventions | diff "
        "| ours, TensorFlow's conventions |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['model']} | {row['plan']} | {row['swaps']} "
            f"| {row['grappler_peak_bytes'] / GIB:.2f} GiB | {row['ours_bytes'] / GIB:.2f} GiB "
            f"| {row['relative_error']:+.1%} | {row['ours_tensorflow_bytes'] / GIB:.2f} GiB |"
        )
    return lines


def main() -> int:
    for name, table in (
        ("capacity.json", capacity_table),
        ("simulator_fidelity.json", fidelity_table),
    ):
        path = RESULTS / name
        if not path.exists():
            print(f"{path} missing: run make bench", file=sys.stderr)
            return 1
        print("\n".join(table(json.loads(path.read_text()))))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
