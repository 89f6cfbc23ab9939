"""The simulator held against published real-GPU measurements (anchors), side by side.

Every GPU figure tflms gives is simulated; this benchmark rebuilds each
published real-GPU data point we can rebuild faithfully and asks the
simulator the question the measurement answered: does the training step fit
on that GPU at that size? For each anchor and each size of its sweep it
records the peak with tensors only (``accounting="tensors"``, what the
simulator and Grappler counted before), the realistic peak
(``accounting="realistic"``: tensors plus every term a TensorFlow GPU process
holds beyond them, :mod:`tflms.cost.gpu_memory`) term by term, the verdict,
and Grappler's estimate of the same step (near the boundary). The realistic
model has no constant fitted to these anchors: every term comes from a
source (TensorFlow's code, a real V100 log, NVIDIA's documentation), so
every anchor is held out of the fitting.

Anchors (sources in the JSON):

* ``paper-unet``: the seed paper (``shared/papers/lms-ddl-power-systems.txt``,
  section 3): 3DUnetCNN's isensee2017 model on a V100-16GB under TensorFlow
  1.8: 144^3 is the largest resolution that trained without LMS, 160^3 (the
  "1.4x" point) needed LMS, 192^3 trained with TFLMS. Rebuilt twice: with
  the ops TensorFlow 1.8's tf.keras wrote (``arithmetic="tf1"``, the anchor)
  and with Keras 3's (for comparison).
* ``ibm-resnet50``: IBM's TFLMS example ``examples/Keras_ResNet50.py``
  (tensorflow-large-model-support): tf.keras ResNet50, batch 1, RMSprop,
  TensorFlow 1.12 on a V100-16GB: 2300x2300 the largest image without
  TFLMS; a user report (IBM TFLMS issue 6, TensorFlow 1.10) saw 2350 work and
  2400 run out of memory. Sweep step: 100 pixels. Rebuilt with tf.keras's
  fused BatchNorm (``batch_norm="fused"``, the anchor) and with Keras 3's.

Left out, with the reason recorded in the JSON: the TFLMS paper's ResNet-50
4.7x batch (its batch sizes are not in the stored text), TensorFlow PR 19845
(a P100, for which no preset exists, and no batch size without LMS), IBM's
2019 TFLMS v2 sweeps and 2018 case study (their values are not in the
stored pages), and the paper's own P100 case of section 4 (the model is
described only loosely).

Calibration (fitted, never the default): since the sourced model finds room
where the real GPUs ran out, the benchmark also fits one constant, a factor on
the tensors term (:func:`tflms.cost.gpu_memory.calibrated`), to one anchor's
boundary at a time and predicts the other anchor with it (leave one out).
With the factor fitted to the ResNet50 anchor alone, everything about the
paper's model is held out: its boundary, its overhead over NVLink2 from
160^3 to 192^3 (the paper: 3% to 25%) and its PCIe3/NVLink2 ratio at 192^3
(the paper: 2.47).

Writes ``benchmarks/results/real_anchors.json``. Every tflms and Grappler
figure in it is simulated; the "real" figures are the sources' measurements.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402

import tflms  # noqa: E402
from benchmarks.common import GIB, provenance, setup_logging, write_result  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.cost import gpu_memory  # noqa: E402
from tflms.cost.hardware import get_device  # noqa: E402
from tflms.errors import PlanInfeasibleError  # noqa: E402
from tflms.simulation.grappler import grappler_peak  # noqa: E402

PAPER = "shared/papers/lms-ddl-power-systems.txt, section 3"
ANCHORS = {
    "paper-unet": {
        "source": PAPER
        + ": 'The model could be trained at a maximum resolution of 144^3 without failing on "
        "memory errors on the NVIDIA Volta V100 GPU with 16GB of memory. When using TFLMS to "
        "swap tensors it could be trained on images at a resolution of 192^3'; the overhead "
        "figure's 1.4x point (160^3) needed TFLMS. TensorFlow 1.8, PowerAI 1.5.2, AC922.",
        "model": "3DUnetCNN isensee2017 (zoo.isensee2017: 4 channels, 16 base filters, depth 5, "
        "keras-contrib instance norm, LeakyReLU 0.3, spatial dropout 0.3, 3 segmentation "
        "levels, weighted Dice), batch 1, float32, Adam",
        "device": "V100-16GB",
        "stack": "tf1",
        "size_unit": "edge (voxels per side)",
        "sizes": [128, 144, 160, 176, 192],
        "step": 16,
        "real": {"largest_fit": 144, "first_no_fit": 160, "largest_with_lms": 192},
        "variants": {"tf1": {"arithmetic": "tf1"}, "keras3": {"arithmetic": "keras3"}},
        "anchor_variant": "tf1",
    },
    "ibm-resnet50": {
        "source": "IBM/tensorflow-large-model-support, examples/Keras_ResNet50.py (header "
        "comment): 'Max resolution without TFLMS: 2300x2300', 'with TFLMS: 3900x3900', "
        "TensorFlow 1.12, CUDA 10.0.130, cuDNN 7.3.1, AC922 with V100 16GB; IBM TFLMS issue 6 "
        "(TensorFlow 1.10, GPU not stated): 2350 trained, 2400 ran out of memory",
        "model": "keras.applications ResNet50 (weights=None, 15 classes), batch 1, RMSprop, "
        "square RGB images; the anchor with tf.keras's fused BatchNorm (FusedBatchNormV3, what "
        "TensorFlow 1.12 ran), compared with Keras 3's",
        "device": "V100-16GB",
        "stack": "tf1",
        "size_unit": "image side (pixels)",
        "sizes": [2200, 2300, 2400, 2600, 2800, 3000, 3200],
        "step": 100,
        "real": {"largest_fit": 2300, "first_no_fit": 2400, "largest_with_lms": 3900},
        "variants": {"fused": {"batch_norm": "fused"}, "keras3": {}},
        "anchor_variant": "fused",
    },
}

LEFT_OUT = {
    "tflms-paper-resnet50": "arXiv 1807.02037 reports ResNet-50 with a 4.7x larger batch and "
    "3DUnet with 2x; the batch sizes, GPU and image size behind these ratios are not in the "
    "stored text, so no boundary can be compared",
    "tf-pr-19845": "TensorFlow PR 19845: ResNet-50 at batch 800 with LMS on a P100-16GB; no P100 "
    "preset exists and the batch without LMS is not stated ('~4x')",
    "ibm-tflms-v2-2019": "IBM's 'Performance results with TensorFlow Large Model Support v2' "
    "(V100-32GB, TensorFlow 1.13.1): the stored page stops before its resolution sweeps",
    "ibm-case-study-2018": "IBM's 2018 3D segmentation case study: the stored page holds the "
    "introduction only; the same experiment is the paper's section 3 (paper-unet)",
    "paper-section-4-p100": "the paper's section 4 (64^3 at batch 8 without LMS, 96^3 with, on a "
    "P100): the model is described only as 2+2 3x3x3 convolution layers of 128 channels, and "
    "there is no P100 preset",
}


def build(anchor: str, size: int, options: dict):
    keras.backend.clear_session()
    if anchor == "paper-unet":
        return zoo.isensee2017(size, batch_size=1, **options)
    return zoo.resnet50(size, classes=15, optimizer="rmsprop", **options)


def measure(
    anchor: str, spec: dict, size: int, options: dict, with_grappler: bool, views: dict
) -> dict:
    """One size of an anchor's sweep: tensors-only and realistic peaks, Grappler's near the boundary.

    The view is kept in ``views`` (by size) for the calibrated verdicts.
    """
    start = time.perf_counter()
    model = build(anchor, size, options)
    view = views[size] = tflms.analyze(model, batch_size=1)
    device = get_device(spec["device"])
    tensors = tflms.simulate(view, device=device, accounting="tensors")
    real = tflms.simulate(view, device=device, accounting="realistic", stack=spec["stack"])
    row = {
        "size": size,
        "tensors_peak_bytes": tensors.device_peak_bytes,
        "realistic_peak_bytes": real.device_peak_bytes,
        "terms": real.memory_terms,
        "allocator_limit_bytes": real.allocator_limit_bytes,
        "fits_realistic": real.device_peak_bytes <= device.memory_bytes,
        "fits_tensors": tensors.device_peak_bytes <= device.memory_bytes,
        "peak_op": real.peak_op,
    }
    if with_grappler:
        graph = tflms.train_step_graph(model, batch_size=1)
        peak = grappler_peak(graph, gpu_memory_bytes=device.memory_bytes)
        row["grappler_peak_with_variables_bytes"] = peak.peak_with_variables_bytes
    row["seconds"] = round(time.perf_counter() - start, 1)
    print(
        f"  {anchor} {size}: tensors {tensors.device_peak_bytes / GIB:.2f} GiB, realistic "
        f"{real.device_peak_bytes / GIB:.2f} GiB ({'fits' if row['fits_realistic'] else 'no'})",
        flush=True,
    )
    return row


def verdict(spec: dict, rows: list[dict], key: str) -> dict:
    """The predicted boundary against the real one, in steps of the source's sweep."""
    fitting = [r["size"] for r in rows if r[key]]
    failing = [r["size"] for r in rows if not r[key]]
    predicted = max(fitting) if fitting else None
    real = spec["real"]["largest_fit"]
    steps = None if predicted is None else round((predicted - real) / spec["step"], 2)
    return {
        "predicted_largest_fit": predicted,
        "predicted_first_no_fit": min(failing) if failing else None,
        "real_largest_fit": real,
        "real_first_no_fit": spec["real"]["first_no_fit"],
        "steps_off": steps,
        "within_one_step": steps is not None and abs(steps) <= 1,
        "exact": predicted == real and min(failing, default=None) == spec["real"]["first_no_fit"],
        "sweep_covers_boundary": bool(fitting) and bool(failing),
    }


def gap_at_first_no_fit(spec: dict, rows: list[dict]) -> dict | None:
    """How far the realistic model is from the real out-of-memory at the first failing size."""
    target = spec["real"]["first_no_fit"]
    row = next((r for r in rows if r["size"] == target), None)
    if row is None:
        return None
    memory = get_device(spec["device"]).memory_bytes
    return {
        "size": target,
        "realistic_peak_bytes": row["realistic_peak_bytes"],
        "device_memory_bytes": memory,
        "missing_bytes": max(0, memory - row["realistic_peak_bytes"]),
        "real_over_realistic_at_least": round(memory / row["realistic_peak_bytes"], 3),
        "real_over_tensors_at_least": round(memory / row["tensors_peak_bytes"], 3),
    }


def with_lms(
    spec: dict, sizes: list[int], link: str, with_grappler: bool, stack=None
) -> list[dict]:
    """The paper's model with LMS: the plan ``tflms.autotune`` finds for the realistic preset.

    Judged twice: by the realistic model (the verdict) and, for the same plan
    on a fresh trace, by Grappler, whose estimate counts tensors only and is
    therefore compared with our ``tensors`` term. ``stack``: the software
    stack (default the anchor's; a calibrated one for the held-out checks).
    """
    rows = []
    for size in sizes:
        start = time.perf_counter()
        model = build("paper-unet", size, {"arithmetic": "tf1"})
        view = tflms.analyze(model, batch_size=1)
        row: dict = {"size": size, "link": link}
        try:
            tuned = tflms.autotune(view, spec["device"], link=link, stack=stack or spec["stack"])
        except PlanInfeasibleError as err:
            row.update(fits=False, best_peak_bytes=err.best_peak_bytes)
        else:
            result = tuned.result
            row.update(
                fits=True,
                lms_needed=tuned.lms_needed,
                realistic_peak_bytes=result.device_peak_bytes,
                terms=result.memory_terms,
                overhead=result.overhead,
                swaps=len(tuned.plan.swaps) if tuned.plan else 0,
                recomputes=len(tuned.plan.recomputes) if tuned.plan else 0,
                bytes_swapped_out=result.bytes_swapped_out,
                step_time_s=result.step_time_s,
            )
            if with_grappler and tuned.lms_needed:
                graph = tflms.train_step_graph(model, batch_size=1)
                tflms.apply_plan(graph, tuned.plan)
                device = get_device(spec["device"])
                peak = grappler_peak(graph, gpu_memory_bytes=device.memory_bytes)
                ours = result.memory_terms["tensors"]
                row["grappler_peak_with_variables_bytes"] = peak.peak_with_variables_bytes
                row["grappler_vs_tensors"] = round(peak.peak_with_variables_bytes / ours - 1, 4)
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(f"  paper-unet with LMS {size} over {link}: {row.get('fits')}", flush=True)
        rows.append(row)
    return rows


def factor_interval(spec: dict, rows: list[dict]) -> dict:
    """The tensor factors with which the realistic model reproduces an anchor's real boundary.

    :func:`tflms.cost.gpu_memory.fit_tensor_factor` on the sourced model's
    terms at the real largest fit and first no-fit sizes; the fitted value is
    the middle of the interval (the bench then re-simulates to check).
    """
    by_size = {r["size"]: r for r in rows}
    real = spec["real"]
    fit = gpu_memory.fit_tensor_factor(
        by_size[real["largest_fit"]]["terms"],
        by_size[real["first_no_fit"]]["terms"],
        get_device(spec["device"]).memory_bytes,
    )
    return {"low_exclusive": fit.low, "high": fit.high, "fitted": fit.fitted}


def calibrated_rows(spec: dict, views: dict, stack) -> list[dict]:
    """An anchor's sweep judged with a calibrated stack (the views of :func:`measure`)."""
    device = get_device(spec["device"])
    rows = []
    for size in sorted(views):
        result = tflms.simulate(views[size], device=device, accounting="realistic", stack=stack)
        rows.append(
            {
                "size": size,
                "realistic_peak_bytes": result.device_peak_bytes,
                "terms": result.memory_terms,
                "fits_calibrated": result.device_peak_bytes <= device.memory_bytes,
            }
        )
    return rows


def calibration(anchors: dict, views: dict) -> dict:
    """Fit the tensor factor to each anchor in turn and judge every anchor with it."""
    fits = {}
    for name, spec in ANCHORS.items():
        variant = spec["anchor_variant"]
        interval = factor_interval(spec, anchors[name]["variants"][variant]["rows"])
        fitted_on = (
            f"{name}: {spec['real']['largest_fit']} fits, {spec['real']['first_no_fit']} does not"
        )
        stack = gpu_memory.calibrated(spec["stack"], interval["fitted"], fitted_on)
        judged = {}
        for other, other_spec in ANCHORS.items():
            other_variant = other_spec["anchor_variant"]
            rows = calibrated_rows(other_spec, views[(other, other_variant)], stack)
            judged[other] = {
                "held_out": other != name,
                "rows": rows,
                "verdict": verdict(other_spec, rows, "fits_calibrated"),
            }
        fits[name] = {
            "interval": interval,
            "stack": stack.name,
            "fitted_on": fitted_on,
            "judged": judged,
        }
        print(f"  factor fitted to {name}: {interval}", flush=True)
    return fits


def trigger_sweep(spec: dict, size: int, links: tuple[str, ...]) -> dict:
    """Level-based swap-in triggers, as TFLMS v1's ``lb`` set them, without the auto-tuner.

    Every candidate tensor swapped (``swapout_threshold=40``, the default), no
    recomputation, no retimed triggers: only how many levels before its
    consumer a swap-in starts (``swapin_ahead``) varies, the knob the
    paper's users tuned. A row fits if it does with the link's and with
    instantaneous copies, as ``tflms.autotune`` requires.
    """
    model = build("paper-unet", size, {"arithmetic": "tf1"})
    view = tflms.analyze(model, batch_size=1)
    memory = get_device(spec["device"]).memory_bytes
    sweep: dict = {"size": size, "swapout_threshold": 40, "rows": {}}
    baseline = None
    for link in links:
        rows = []
        for ahead in (1, 2, 3, 5, 8, 13, 21, 34, 55):
            plan = tflms.make_plan(view, tflms.LMSConfig(swapin_ahead=ahead))
            result = tflms.simulate(
                view,
                plan,
                device=spec["device"],
                link=link,
                stack=spec["stack"],
                baseline=baseline or True,
            )
            baseline = result.baseline
            instant = tflms.simulate(
                view,
                plan,
                device=spec["device"],
                link="ideal",
                stack=spec["stack"],
                baseline=False,
            )
            rows.append(
                {
                    "swapin_ahead": ahead,
                    "fits": max(result.device_peak_bytes, instant.device_peak_bytes) <= memory,
                    "realistic_peak_bytes": result.device_peak_bytes,
                    "overhead": result.overhead,
                    "swaps": len(plan.swaps),
                }
            )
        sweep["rows"][link] = rows
        print(f"  paper-unet {size} level triggers over {link}: done", flush=True)
    return sweep


def link_ratios(with_lms_rows: dict) -> list[dict]:
    """PCIe3 step time over NVLink2 step time per size (the paper: 2.47 at 192^3).

    Both links share the step without swaps (copies are the only difference),
    so the ratio is ``(1 + overhead over PCIe3) / (1 + overhead over NVLink2)``.
    """
    nvlink = {r["size"]: r for r in with_lms_rows.get("nvlink2", []) if r.get("fits")}
    ratios = []
    for row in with_lms_rows.get("pcie3", []):
        other = nvlink.get(row["size"])
        if row.get("fits") and other is not None:
            ratio = (1 + row["overhead"]) / (1 + other["overhead"])
            ratios.append({"size": row["size"], "pcie3_over_nvlink2": round(ratio, 3)})
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the sizes around each boundary")
    parser.add_argument("--no-grappler", action="store_true", help="skip Grappler's estimates")
    parser.add_argument("--no-lms", action="store_true", help="skip the paper model with LMS")
    args = parser.parse_args()
    setup_logging()
    started = time.perf_counter()
    anchors = {}
    views: dict = {}
    for name, spec in ANCHORS.items():
        print(f"== {name}", flush=True)
        sizes = spec["sizes"]
        if args.quick:
            sizes = [spec["real"]["largest_fit"], spec["real"]["first_no_fit"]]
        real = spec["real"]
        variants = {}
        for variant, options in spec["variants"].items():
            kept = views.setdefault((name, variant), {})
            rows = [
                measure(
                    name,
                    spec,
                    size,
                    options,
                    with_grappler=not args.no_grappler
                    and variant == spec["anchor_variant"]
                    and size in (real["largest_fit"], real["first_no_fit"]),
                    views=kept,
                )
                for size in sizes
            ]
            if variant != spec["anchor_variant"]:
                views.pop((name, variant))  # only the anchors are calibrated
            variants[variant] = {
                "options": options,
                "rows": rows,
                "realistic": verdict(spec, rows, "fits_realistic"),
                "tensors": verdict(spec, rows, "fits_tensors"),
                "gap": gap_at_first_no_fit(spec, rows),
            }
        anchors[name] = {
            **{k: v for k, v in spec.items() if k != "variants"},
            "held_out": True,
            "variants": variants,
        }
        if name == "paper-unet" and not args.no_lms:
            sizes_lms = [160, 192, 208] if args.quick else [160, 176, 192, 208, 224]
            anchors[name]["with_lms"] = {
                link: with_lms(spec, sizes_lms, link, not args.no_grappler)
                for link in ("nvlink2", "pcie3")
            }
            anchors[name]["link_ratios"] = link_ratios(anchors[name]["with_lms"])
            anchors[name]["real_link_ratio"] = {"size": 192, "pcie3_over_nvlink2": 2.47}
            anchors[name]["real_overhead_nvlink2"] = {"160": 0.03, "192": 0.25}
            anchors[name]["trigger_sweep"] = trigger_sweep(spec, 192, ("nvlink2", "pcie3"))
    print("== calibration (fitted, not the default)", flush=True)
    fits = calibration(anchors, views)
    views.clear()
    held_out_lms = None
    if not args.no_lms:
        # the factor fitted to ResNet50 alone: every paper-unet figure is held out
        spec = ANCHORS["paper-unet"]
        resnet = fits["ibm-resnet50"]
        stack = gpu_memory.calibrated(
            spec["stack"], resnet["interval"]["fitted"], resnet["fitted_on"]
        )
        sizes_cal = [160, 192] if args.quick else [160, 176, 192]
        rows = {
            link: with_lms(spec, sizes_cal, link, False, stack) for link in ("nvlink2", "pcie3")
        }
        held_out_lms = {
            "fitted_on": "ibm-resnet50",
            "tensor_factor": stack.tensor_factor,
            "with_lms": rows,
            "link_ratios": link_ratios(rows),
        }
    stacks = {
        name: {
            "context_bytes": stack.context_bytes,
            "reserve_rule": stack.reserve_rule,
            "workspace_limit_bytes": stack.workspace_limit_bytes,
            "sources": list(stack.sources),
        }
        for name, stack in gpu_memory.STACKS.items()
    }
    data = {
        **provenance(
            "tflms and Grappler figures are simulated; 'real' figures are the sources' "
            "measurements on real GPUs. The realistic model fits no constant to the anchors "
            "(all are held out)."
        ),
        "command": "python benchmarks/bench_real_anchors.py" + (" --quick" if args.quick else ""),
        "fitted_constants": [],
        "anchors": anchors,
        "calibration": {
            "what": "tensor_factor of gpu_memory.calibrated: the tensors term times a factor "
            "fitted to one anchor's real boundary (the middle of the interval that reproduces "
            "it); the other anchor is held out. Never the default: the sourced model above "
            "has no fitted constant.",
            "fits": fits,
            "paper_unet_with_lms": held_out_lms,
        },
        "left_out": LEFT_OUT,
        "stacks": stacks,
        "sources": gpu_memory.SOURCES,
        "seconds": round(time.perf_counter() - started, 1),
    }
    path = write_result("real_anchors.json", data)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
