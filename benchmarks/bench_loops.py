"""Recurrent models: the simulator against TensorFlow's CPU allocator, and LMS on their loops.

The issue's models: 2-layer LSTM, GRU and bidirectional LSTM (256 units), 256
time steps of 64 features, batch 32, SGD. Each runs in a fresh process per
round under TensorFlow's plain BFC CPU allocator, which counts every
allocation (``tflms.utils.cpu.every_allocation_env``; oneDNN's leaves small
ones out of its peak, and an RNN's per-step tensors are small), with one
inter-op thread. Per model, three simulated peaks side by side:

* ``blind``: the loop's lists counted as empty (the simulator before it read
  loop bodies: what ``tflms.simulate`` said until then);
* ``lists``: the lists each loop keeps for its gradient (``tflms.graph.loops``);
* ``lists_in_flight`` (the simulator's prediction): plus each gradient loop's
  running weight-gradient terms for every iteration TensorFlow may run at once.

Then ``tflms.autotune`` at 80% of the predicted peak on the V100-16GB preset
(tensors-only accounting, so the budget is the model's own memory): what it
reaches, how many of the loops' lists it swaps, its predicted overhead.

``python benchmarks/bench_loops.py`` writes ``results/loops.json`` (about 5
minutes on a 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ROUNDS = 3
MODELS = ("LSTM", "GRU", "BiLSTM")
BUDGET_SHARE = 0.8
SEQ, FEATURES, UNITS, BATCH = 256, 64, 256, 32

WORKER = """
import dataclasses, json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {repo!r})
import keras, tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
import tflms
from tflms import zoo
from tflms.simulation.measure import measure_cpu_step

kind, measure_only = {kind!r}, {measure_only!r}
keras.utils.set_random_seed(1)
x = inp = keras.Input(({seq}, {features}))
for i in range(2):
    layer = (keras.layers.GRU if kind == "GRU" else keras.layers.LSTM)({units}, return_sequences=i == 0)
    x = keras.layers.Bidirectional(layer)(x) if kind == "BiLSTM" else layer(x)
model = keras.Model(inp, keras.layers.Dense(10)(x))
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.optimizer.build(model.trainable_variables)
xs, ys = zoo.synthetic_data(model, {batch})
data = (tf.constant(xs), tf.constant(ys))
step = tf.function(model.train_step, jit_compile=False)
view = tflms.build_view(step.get_concrete_function(data).graph)
m = measure_cpu_step(step, data, runs=3, profile=False)
out = {{"measured": list(m.peaks_bytes)}}
if not measure_only:
    def peak(v):
        return tflms.simulate(v, accounting="tensors").device_peak_bytes

    def without(v, lists):
        v = v.copy()
        for name, d in v.nodes(data=True):
            if "loop" in d:
                d["loop"] = dataclasses.replace(d["loop"], scratch_bytes=0)
                if not lists:
                    d["outputs"] = tuple(t._replace(bytes=0) if t.dtype == "variant" else t
                                         for t in d["outputs"])
        return v

    predicted = peak(view)
    out.update(blind=peak(without(view, False)), lists=peak(without(view, True)),
               lists_in_flight=predicted,
               trips=sorted({{d["loop"].trips for _, d in view.nodes(data=True) if "loop" in d}}))
    start = time.perf_counter()
    budget = int({budget_share} * predicted)
    try:
        tuned = tflms.autotune(view, budget, accounting="tensors", safety_margin=0.0)
    except tflms.errors.PlanInfeasibleError as err:
        out["autotune"] = {{"budget_bytes": budget, "fits": False, "why": str(err)}}
    else:
        plan = tuned.plan
        out["autotune"] = {{
            "budget_bytes": budget,
            "fits": True,
            "seconds": round(time.perf_counter() - start, 1),
            "peak_bytes": tuned.result.device_peak_bytes,
            "overhead": tuned.result.overhead,
            "swaps": len(plan.swaps),
            "loop_list_swaps": sum(s.dtype == "variant" for s in plan.swaps),
            "recomputes": len(plan.recomputes),
        }}
print(json.dumps(out))
"""


def run(kind: str, measure_only: bool) -> dict:
    """One fresh measuring process for ``kind``."""
    sys.path.insert(0, str(REPO))
    from tflms.utils.cpu import every_allocation_env

    code = WORKER.format(
        repo=str(REPO),
        kind=kind,
        measure_only=measure_only,
        seq=SEQ,
        features=FEATURES,
        units=UNITS,
        batch=BATCH,
        budget_share=BUDGET_SHARE,
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=every_allocation_env(),
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    sys.path.insert(0, str(REPO))
    from benchmarks.common import provenance
    from tflms.utils.files import write_json

    started = time.time()
    rows = {}
    for kind in MODELS:
        first = run(kind, measure_only=False)
        peaks = list(first["measured"])
        for _ in range(ROUNDS - 1):
            peaks += run(kind, measure_only=True)["measured"]
        row = {k: v for k, v in first.items() if k != "measured"}
        row["measured_peaks"] = peaks
        row["measured_max"] = max(peaks)
        for key in ("blind", "lists", "lists_in_flight"):
            row[f"{key}_ratio"] = first[key] / max(peaks)
        rows[kind] = row
        print(json.dumps({kind: {k: row[k] for k in row if k.endswith("ratio")}}), flush=True)
    result = {
        "benchmark": "loops",
        **provenance(
            "simulated peaks (tensors-only accounting) against TensorFlow's plain BFC CPU "
            "allocator; autotune figures are simulated on the V100-16GB preset over PCIe3"
        ),
        "seconds": round(time.time() - started, 1),
        "models": f"2 layers of {UNITS} units (LSTM, GRU, Bidirectional(LSTM)), {SEQ} steps of "
        f"{FEATURES} features, batch {BATCH}, SGD",
        "method": f"{ROUNDS} fresh processes per model, 3 measured steps each after a warm-up; "
        "TF_CPU_ALLOCATOR_USE_BFC=true, TF_ENABLE_ONEDNN_OPTS=0, one inter-op thread",
        "rows": rows,
    }
    write_json(RESULTS / "loops.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
