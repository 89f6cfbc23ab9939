"""tflms recomputation against Keras's ``RematScope``, on TensorFlow's real CPU allocator.

Run by ``make bench`` (or ``python benchmarks/bench_remat.py [--families gpt,cnn] [--repeats 3]``;
a run of some families keeps the other families' entries of the JSON).

Four block-stack families (``benchmarks/remat_models.py``: a GPT-style
decoder, a Conv + BatchNorm + ReLU CNN, a residual MLP, a dilated temporal
convolution network), each trained by one custom AdamW loop in six ways:

* ``plain``: ``tf.function``;
* ``rematscope``: each block created inside ``keras.RematScope(mode="full")``
  (one ``tf.recompute_grad`` per block: what a Keras user would pick);
* ``tflms_cheap``: ``tflms.function`` with ``swap=False, recompute=True``
  (the cheap-op groups alone);
* ``tflms_segments1``, ``tflms_segments2``, ``tflms_segments4``: the same
  with ``recompute_segments=1``, ``2`` or ``4`` (whole segments re-run from
  checkpoints kept at every cut, every second or every fourth: a transformer
  block has two cuts, a residual MLP or TCN block one, a Conv + BatchNorm +
  ReLU block four);
  (A segment re-runs every tensor its backward pass reads, the last block's
  before the loss too, as ``RematScope`` re-runs every block, each re-run
  started at most 2 levels before its first reader.)

A family's tflms figure (``best_segments``) is the segment setting that
re-runs the fewest dense ops (then: spends the least CPU time) among those
whose peak is at or under ``RematScope``'s and whose weights equal plain
training's; when none is, the lowest peak of them all. Dense ops first:
their count is the same in every run, where CPU times of settings doing the
same work differ by several percent from run to run on this machine. Every
setting's row stays in the JSON.

Each run is a fresh process (oneDNN's allocator on any x86-64 CPU,
``tflms.utils.cpu.measurement_env``) that measures the step's allocator peak
(``measure_cpu_step``, 3 runs after a warm-up), then times 5 more steps (wall
and process CPU seconds) and hashes the weights. A cell's peak is the median
of its processes' medians; its worst step is the highest peak of any measured
step of any of its processes (TensorFlow's executor orders ready ops
differently from step to step, and a memory budget must hold for every step). The variants run interleaved
``--repeats`` times; the JSON keeps every run and the medians, and says for
each family whether every variant's weights equal plain training's bitwise.
It also records what ``RematScope`` does to single Keras layers in a
TensorFlow step. Real training on this CPU, nothing simulated. Writes
``benchmarks/results/remat.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

VARIANTS = {
    "plain": None,
    "rematscope": None,
    "tflms_cheap": dict(swap=False, recompute=True),
    "tflms_segments1": dict(swap=False, recompute=True, recompute_segments=1),
    "tflms_segments2": dict(swap=False, recompute=True, recompute_segments=2),
    "tflms_segments4": dict(swap=False, recompute=True, recompute_segments=4),
}
SEGMENT_VARIANTS = tuple(v for v in VARIANTS if v.startswith("tflms_segments"))
"""The segment settings; :func:`best_segments` picks each family's tflms figure among them."""
FAMILIES = ("gpt", "cnn", "mlp", "tcn")
TIMED_STEPS = 5
DENSE_OPS = re.compile(
    r'^\s*op: "(_Fused)?(MatMul|BatchMatMul\w*|Conv\w*|DepthwiseConv\w*|Einsum)"$'
)
"""The dense op types counted in the runtime's optimized step (backprop ops included)."""


def worker(family: str, variant: str) -> dict:
    """One measured run in this process (see the module doc)."""
    import keras
    import tensorflow as tf

    import tflms
    from benchmarks.remat_models import batch, build
    from tests.tflms.models import tape_step
    from tflms.simulation.measure import measure_cpu_step

    model = build(family, variant == "rematscope")
    optimizer = keras.optimizers.AdamW(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    step = tape_step(model, optimizer, loss_fn)
    options = VARIANTS[variant]
    fn = tflms.function(step, config=tflms.LMSConfig(**options)) if options else tf.function(step)
    x, y = (tf.constant(a) for a in batch(family))
    start = time.perf_counter()
    fn(x, y)  # trace (and plan) once, outside every figure
    first = time.perf_counter() - start
    measured = measure_cpu_step(fn, x, y, runs=3, warmup=1, profile=False)
    wall, cpu = [], []
    for _ in range(TIMED_STEPS):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(x, y).numpy()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    out = {
        "peak_bytes": measured.peak_bytes,
        "peaks_bytes": list(measured.peaks_bytes),
        "resident_bytes": measured.resident_bytes,
        "step_seconds": statistics.median(wall),
        "step_cpu_seconds": statistics.median(cpu),
        "first_call_seconds": round(first, 2),
        "weights": hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest(),
        "steps": 1 + 4 + TIMED_STEPS,
    }
    out["dense_ops"] = _dense_ops()
    if options:
        plan = fn.plan_for(x, y)
        out["plan"] = {
            "groups": len(plan.recomputes),
            "ops_rerun": sum(len(r.ops) for r in plan.recomputes),
            "bytes_not_kept": sum(r.bytes for r in plan.recomputes),
            "check": plan.notes[-1][:300],
        }
    return out


def _dense_ops() -> int | None:
    """Dense ops of the training step's graph as the runtime ran it (see the module doc)."""
    found = sorted(
        Path(os.environ["TF_DUMP_GRAPH_PREFIX"]).glob("*.after_graph_optimization.pbtxt")
    )
    sizes = {p: p.stat().st_size for p in found}
    if not sizes:
        return None
    step = max(sizes, key=sizes.get)  # the step, not the variables' initializers
    return sum(1 for line in step.read_text().splitlines() if DENSE_OPS.match(line))


def _run(family: str, variant: str) -> dict:
    from tflms.utils.cpu import measurement_env

    with tempfile.TemporaryDirectory(prefix="bench_remat_") as dump:
        env = measurement_env()
        env.update(TF_DUMP_GRAPH_PREFIX=dump, TF_DUMP_GRAPH_NAME_FILTER="*")
        done = subprocess.run(
            [sys.executable, __file__, "--worker", family, variant],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"]}
    return {
        "peak_mib": round(statistics.median(r["peak_bytes"] for r in ok) / 2**20, 1),
        # what a memory budget must cover: the executor's order varies from step to step
        "worst_step_peak_mib": round(max(p for r in ok for p in r["peaks_bytes"]) / 2**20, 1),
        "step_seconds": round(statistics.median(r["step_seconds"] for r in ok), 4),
        "step_cpu_seconds": round(statistics.median(r["step_cpu_seconds"] for r in ok), 4),
        "runs": len(ok),
        "weights": sorted({r["weights"] for r in ok}),
        "dense_ops": ok[0].get("dense_ops"),
        **({"plan": ok[0]["plan"]} if "plan" in ok[0] else {}),
    }


def best_segments(rows: dict) -> dict | None:
    """The family's tflms figure among its segment rows (see the module doc), named.

    >>> rows = {"rematscope": {"peak_mib": 90.0},
    ...         "tflms_segments1": {"peak_mib": 97.0, "step_cpu_seconds": 0.50,
    ...                             "dense_ops_rerun": 4, "bitwise_with_plain": True},
    ...         "tflms_segments2": {"peak_mib": 89.0, "step_cpu_seconds": 0.56,
    ...                             "dense_ops_rerun": 6, "bitwise_with_plain": True},
    ...         "tflms_segments4": {"peak_mib": 81.0, "step_cpu_seconds": 0.55,
    ...                             "dense_ops_rerun": 6, "bitwise_with_plain": True}}
    >>> best_segments(rows)["setting"]  # at or under 90 MiB, as many dense ops: less CPU
    'tflms_segments4'
    >>> rows["rematscope"]["peak_mib"] = 80.0  # none: the lowest peak
    >>> best_segments(rows)["setting"]
    'tflms_segments4'
    """
    segments = {v: rows[v] for v in SEGMENT_VARIANTS if v in rows and "error" not in rows[v]}
    if not segments:
        return None
    scope = rows.get("rematscope", {}).get("peak_mib")
    level = {
        v: row
        for v, row in segments.items()
        if scope is not None and row["peak_mib"] <= scope and row.get("bitwise_with_plain")
    }
    if level:
        name = min(
            level,
            key=lambda v: (level[v].get("dense_ops_rerun") or 0, level[v]["step_cpu_seconds"]),
        )
    else:
        name = min(segments, key=lambda v: segments[v]["peak_mib"])
    return {"setting": name, **segments[name]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("FAMILY", "VARIANT"))
    parser.add_argument(
        "--layers-only",
        action="store_true",
        help="only re-record what RematScope does to single layers, into the existing JSON",
    )
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    from benchmarks.common import RESULTS, write_result
    from benchmarks.remat_models import BATCH, MODELS, remat_layer_failures
    from tflms.utils.cpu import cpu_state

    if args.layers_only:
        result = json.loads((RESULTS / "remat.json").read_text())
        result["rematscope_single_layers"] = remat_layer_failures()
        print(write_result("remat.json", result))
        return

    families = args.families.split(",")
    # a run of some families keeps the others' entries (each family's runs are its own)
    path = RESULTS / "remat.json"
    kept = json.loads(path.read_text()) if path.exists() and set(families) < set(FAMILIES) else {}
    runs: dict = {f: {v: [] for v in VARIANTS} for f in families}
    for repeat in range(args.repeats):
        for family in families:
            for variant in VARIANTS:  # interleaved: the machine's drift hits every variant alike
                runs[family][variant].append(_run(family, variant))
                print(repeat, family, variant, json.dumps(runs[family][variant][-1])[:200])
    result: dict = {
        "measured": "TensorFlow's CPU allocator (oneDNN), one process per run; nothing simulated",
        "cpu": cpu_state(),
        "repeats": args.repeats,
        "models": {
            **kept.get("models", {}),
            **{f: {"blocks_width_input_classes": MODELS[f], "batch": BATCH[f]} for f in families},
        },
        "variants": {k: v or k for k, v in VARIANTS.items()},
        "rematscope_single_layers": remat_layer_failures(),
        "families": {f: row for f, row in kept.get("families", {}).items() if f not in families},
    }
    for family in families:
        rows = {v: _summary(r) for v, r in runs[family].items()}
        plain = rows["plain"]
        for name, row in rows.items():
            if "error" in row or name == "plain":
                continue
            row["peak_vs_plain"] = round(row["peak_mib"] / plain["peak_mib"], 3)
            row["worst_step_vs_plain"] = round(
                row["worst_step_peak_mib"] / plain["worst_step_peak_mib"], 3
            )
            row["cpu_vs_plain"] = round(row["step_cpu_seconds"] / plain["step_cpu_seconds"], 3)
            row["bitwise_with_plain"] = row["weights"] == plain["weights"]
            if row.get("dense_ops") is not None and plain.get("dense_ops") is not None:
                row["dense_ops_rerun"] = row["dense_ops"] - plain["dense_ops"]
        best = best_segments(rows)
        result["families"][family] = {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "repeats": args.repeats,
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "variants": rows,
            "best_segments": best,
            "runs": runs[family],
        }
    print(write_result("remat.json", result))


if __name__ == "__main__":
    main()
