"""Where the demo's training step spends its time on this CPU, with oneDNN off and on.

TensorFlow picks its CPU kernels by the CPU: oneDNN's where the CPU has
AVX-512-class features, Eigen's elsewhere (an AVX2-only AMD EPYC, say), unless
``TF_ENABLE_ONEDNN_OPTS`` says otherwise. This runs the demo's model (the
3D U-Net of ``make demo``: 32^3, depth 2, 8 base filters, batch 2, Adam) in a
fresh process per setting, times ``STEPS`` training steps after warm-up,
profiles a few more, and sums the time of each op type on the host (CPU
seconds per step, summed over TensorFlow's threads: more than the step's wall
time where ops run in parallel).

``python benchmarks/bench_cpu_kernels.py`` writes ``results/cpu_kernels.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
STEPS, PROFILED, ROUNDS = 20, 3, 3

WORKER = """
import collections, glob, json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {repo!r})
import numpy as np
import tensorflow as tf
from tflms import zoo

model = zoo.unet3d(32, depth=2, base_filters=8, seed=1)
model.compile(optimizer="adam", loss=zoo.SegmentationLoss(), jit_compile=False)
x, y = zoo.synthetic_data(model, 2)
step = tf.function(model.train_step, jit_compile=False)
data = (tf.constant(x), tf.constant(y))
for _ in range(3):
    step(data)
times = []
for _ in range({steps}):
    start = time.perf_counter()
    step(data)["loss"].numpy()
    times.append(time.perf_counter() - start)
logdir = {logdir!r}
tf.profiler.experimental.start(logdir)
for _ in range({profiled}):
    step(data)["loss"].numpy()
tf.profiler.experimental.stop()
from tensorflow.tsl.profiler.protobuf import xplane_pb2
space = xplane_pb2.XSpace()
path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
space.ParseFromString(open(path, "rb").read())
by_type = collections.Counter()
for plane in space.planes:
    if not plane.name.startswith("/host:CPU"):
        continue
    for line in plane.lines:
        if "TraceMe" in line.name or "python" in line.name.lower():
            continue
        for event in line.events:
            label = plane.event_metadata[event.metadata_id].name
            kind = label.split(":")[-1]
            if ":" in label and kind != "Process":  # a whole-process span, not an op
                by_type[kind] += event.duration_ps / 1e12 / {profiled}
print(json.dumps({{"step_seconds": sorted(times)[len(times) // 2],
                  "op_cpu_seconds_per_step": dict(by_type.most_common(12))}}))
"""


def run(onednn: str) -> dict:
    """One fresh process with ``TF_ENABLE_ONEDNN_OPTS=onednn``: its median step and op times."""
    with tempfile.TemporaryDirectory(prefix="cpu-kernels-") as logdir:
        code = WORKER.format(repo=str(REPO), steps=STEPS, profiled=PROFILED, logdir=logdir)
        env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn)
        env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    sys.path.insert(0, str(REPO))
    from tflms.utils.cpu import cpu_state
    from tflms.utils.files import write_json

    started = time.time()
    rounds = []
    for r in range(ROUNDS):  # interleaved, order flipped every other round: load hits both
        order = ("0", "1") if r % 2 == 0 else ("1", "0")
        rounds.append({setting: run(setting) for setting in order})
        print(json.dumps({k: v["step_seconds"] for k, v in rounds[-1].items()}), flush=True)
    median = {s: sorted(r[s]["step_seconds"] for r in rounds)[ROUNDS // 2] for s in ("0", "1")}
    result = {
        "benchmark": "cpu_kernels",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "cpu": cpu_state(),
        "model": "the demo's 3D U-Net: 32^3, depth 2, 8 base filters, batch 2, Adam "
        "(one rank, no LMS)",
        "method": f"{ROUNDS} rounds, each a fresh process per setting (order flipped every "
        f"other round); per process the median of {STEPS} steps after 3 warm-up steps; "
        f"op CPU seconds per step from {PROFILED} profiled steps (host events summed "
        "over threads)",
        "step_seconds": {"onednn_off": median["0"], "onednn_on": median["1"]},
        "speedup_with_onednn": median["0"] / median["1"],
        "op_cpu_seconds_per_step": {
            "onednn_off": rounds[-1]["0"]["op_cpu_seconds_per_step"],
            "onednn_on": rounds[-1]["1"]["op_cpu_seconds_per_step"],
        },
        "rounds": rounds,
    }
    write_json(RESULTS / "cpu_kernels.json", result)
    print(json.dumps({k: result[k] for k in ("step_seconds", "speedup_with_onednn")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
