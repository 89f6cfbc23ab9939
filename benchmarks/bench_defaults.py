"""Which LMSConfig defaults save memory on typical CNNs without tuning? (simulated)

Plans ResNet-50 (batch 128), VGG16 (batch 64) and the 3D U-Net (128^3) with
``tflms.make_plan`` - no auto-tuning - over a grid of ``swapout_threshold``
x ``swapin_ahead``, then one-at-a-time sweeps of ``swapin_groupby`` and
``min_tensor_bytes`` around the best pair, and simulates every plan over
PCIe3 and NVLink2. For each setting it records the device-peak saving and the
predicted step-time overhead, and recommends the setting with the largest
mean saving whose NVLink2 overhead stays within 10% on every model (ties:
lower PCIe3 overhead, then fewer swaps).
Writes ``benchmarks/results/defaults_sweep.json``.

Every figure is simulated (tflms.simulate, virtual V100-16GB); none measured.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tflms  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.common import provenance, setup_logging, write_result  # noqa: E402

THRESHOLDS = (5, 10, 20, 30, 40, 50, 100, 200)
AHEADS = (1, 2, 4, 8, 16, 32, 64)
GROUPBYS = (0, 5, 20, 50)
MIN_BYTES = (32 << 10, 1 << 20, 4 << 20, 16 << 20)
LINKS = ("pcie3", "nvlink2")
MAX_NVLINK_OVERHEAD = 0.10
WORKLOADS = [
    ("resnet50", models.resnet50, 128, None),
    ("vgg16", models.vgg16, 64, None),
    ("unet3d", models.unet3d, 1, (128, 128, 128, 4)),
]


def evaluate(views, baselines, config):
    row = {"config": {k: getattr(config, k) for k in SWEPT}, "models": {}}
    for name, view in views.items():
        plan = tflms.make_plan(view, config)
        entry = {"swaps": len(plan.swaps), "bytes_swapped": plan.bytes_swapped}
        for link in LINKS:
            result = tflms.simulate(
                view, plan, link=link, baseline=baselines[name][link], accounting="tensors"
            )
            entry[link] = {
                "peak_bytes": result.device_peak_bytes,
                "saving": 1 - result.device_peak_bytes / baselines[name][link].device_peak_bytes,
                "overhead": result.overhead,
            }
        row["models"][name] = entry
    models_ = row["models"].values()
    row["worst_saving"] = min(min(m[link]["saving"] for link in LINKS) for m in models_)
    row["mean_saving"] = sum(m[link]["saving"] for m in models_ for link in LINKS) / (
        len(views) * len(LINKS)
    )
    row["mean_saving_nvlink2"] = sum(m["nvlink2"]["saving"] for m in models_) / len(views)
    row["worst_overhead_nvlink2"] = max(m["nvlink2"]["overhead"] for m in models_)
    row["worst_overhead_pcie3"] = max(m["pcie3"]["overhead"] for m in models_)
    return row


SWEPT = ("swapout_threshold", "swapin_ahead", "swapin_groupby", "min_tensor_bytes")


def recommend(rows):
    ok = [r for r in rows if r["worst_overhead_nvlink2"] <= MAX_NVLINK_OVERHEAD]
    return max(
        ok or rows,
        key=lambda r: (
            round(r["mean_saving"], 3),
            -round(r["worst_overhead_pcie3"], 2),
            -sum(m["swaps"] for m in r["models"].values()),
        ),
    )


def main() -> int:
    setup_logging()
    t0 = time.time()
    views, baselines = {}, {}
    for name, build, batch, x_shape in WORKLOADS:
        views[name] = tflms.build_view(build().trace(batch, x_shape))
        baselines[name] = {
            link: tflms.simulate(views[name], link=link, accounting="tensors") for link in LINKS
        }
        print(f"{name}: plain peak {baselines[name]['nvlink2'].device_peak_bytes / 2**30:.2f} GiB")
    current = tflms.LMSConfig()
    rows = [evaluate(views, baselines, current)]
    for threshold, ahead in itertools.product(THRESHOLDS, AHEADS):
        config = current.replace(swapout_threshold=threshold, swapin_ahead=ahead)
        rows.append(evaluate(views, baselines, config))
    best = recommend(rows)
    base = tflms.LMSConfig(**best["config"])
    for groupby in GROUPBYS:
        rows.append(evaluate(views, baselines, base.replace(swapin_groupby=groupby)))
    best = recommend(rows)
    base = tflms.LMSConfig(**best["config"])
    for min_bytes in MIN_BYTES:
        rows.append(evaluate(views, baselines, base.replace(min_tensor_bytes=min_bytes)))
    best = recommend(rows)
    for row in (rows[0], best):
        print(
            ("current " if row is rows[0] else "recommended ")
            + f"{row['config']}: worst saving {row['worst_saving']:.1%}, worst overhead "
            f"nvlink2 {row['worst_overhead_nvlink2']:+.1%}, pcie3 {row['worst_overhead_pcie3']:+.1%}"
        )
        for name, m in row["models"].items():
            print(
                f"    {name:9} swaps {m['swaps']:4d}  saving {m['nvlink2']['saving']:.1%} "
                f"(pcie3 {m['pcie3']['saving']:.1%})  overhead nvlink2 "
                f"{m['nvlink2']['overhead']:+.1%}, pcie3 {m['pcie3']['overhead']:+.1%}"
            )
    data = {
        **provenance(
            "Device-peak saving and predicted overhead of tflms.make_plan (no auto-tuning) "
            "over a grid of LMSConfig options, on three CNN training steps."
        ),
        "workloads": {
            name: {
                "plain_peak_bytes": baselines[name]["nvlink2"].device_peak_bytes,
                "plain_step_time_s": baselines[name]["nvlink2"].step_time_s,
                "depth": views[name].graph["depth"],
            }
            for name in views
        },
        "criterion": f"largest mean saving (over models, PCIe3 and NVLink2) with NVLink2 "
        f"overhead <= {MAX_NVLINK_OVERHEAD:.0%} on every model; then the lower PCIe3 "
        "overhead, then fewer swaps",
        "current_defaults": rows[0],
        "recommended": best,
        "rows": rows,
    }
    path = write_result("defaults_sweep.json", data)
    print(f"{len(rows)} settings in {time.time() - t0:.0f}s -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
