"""The host's optimizer update, measured here: AdamW's bytes per second on this CPU, and the simulator's host model.

Run by ``make bench`` (or ``python benchmarks/bench_cpu_optimizer.py``).
With ``OffloadedOptimizer`` (:mod:`tflms.keras.offload`) the update runs on
the host, so the simulator has to time it there. It times every op with a
roofline model (:class:`tflms.cost.hardware.DeviceModel`); for the host
(:data:`tflms.cost.hardware.HOST`: a stated server with 100 GB/s of DRAM)
the question is how much of the memory bandwidth a real optimizer update
reaches. Measured here, in one process:

* ``elementwise_bytes_per_s``: TensorFlow's own elementwise bandwidth on this
  CPU (one ``x * c`` over a 128 MiB float32 tensor: bytes read plus written
  over the median time);
* ``adamw``: Keras's ``AdamW.apply`` on one variable of 32M float32
  parameters inside a ``tf.function`` (the optimizer's own ops, as ``fit``
  runs them): the median step time, and its throughput as the 28 bytes each
  parameter's update must move (read weight, gradient and two slots; write
  weight and two slots);
* ``simulated_seconds``: the same update graph timed by the simulator's
  roofline on a host model with this CPU's measured elementwise bandwidth
  (memory efficiency 1);
* ``memory_efficiency``: simulated over measured time: above 1, the
  roofline at this CPU's elementwise bandwidth predicts the update slower
  than it runs (its time model for the host errs on the slow side).

Writes ``benchmarks/results/cpu_optimizer.json``. Measured on this machine's
CPU, not simulated (except ``simulated_seconds``, which says so).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.machine import machine_info, wait_for_quiet  # noqa: E402
from tflms.cost.hardware import HOST  # noqa: E402
from tflms.graph.view import build_view  # noqa: E402
from tflms.simulation.schedule import compile_view  # noqa: E402

OUT = HERE / "results" / "cpu_optimizer.json"
PARAMS = 32 << 20
BYTES_PER_PARAM = 28  # AdamW: read w, g, m, v; write w, m, v (float32)
REPEATS = 15


def median_seconds(fn, repeats: int = REPEATS) -> float:
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def elementwise_bandwidth() -> float:
    x = tf.Variable(tf.ones([PARAMS]))

    @tf.function
    def scale():
        x.assign(x * 1.0000001)

    seconds = median_seconds(lambda: scale())
    return 2 * 4 * PARAMS / seconds  # one read and one write of each float32


def adamw_update() -> tuple[float, tf.Graph]:
    weight = keras.Variable(tf.ones([PARAMS]))
    grad = tf.fill([PARAMS], 1e-3)
    optimizer = keras.optimizers.AdamW(1e-4, weight_decay=0.01)
    optimizer.build([weight])

    @tf.function
    def step():
        optimizer.apply([grad], [weight])

    seconds = median_seconds(lambda: step())
    return seconds, step.get_concrete_function().graph


def main() -> None:
    quiet = wait_for_quiet()
    bandwidth = elementwise_bandwidth()
    seconds, graph = adamw_update()
    here = HOST.__class__(
        "this-CPU",
        HOST.memory_bytes,
        HOST.dense_flops,
        HOST.half_dense_flops,
        HOST.vector_flops,
        bandwidth,
        memory_efficiency=1.0,
        kernel_overhead_s=HOST.kernel_overhead_s,
        description="this machine's CPU at its measured TensorFlow elementwise bandwidth",
    )
    compiled = compile_view(build_view(graph), device=here, link="pcie3")
    simulated = sum(compiled.durations)
    result = {
        "measured": True,
        "what": "Keras AdamW.apply on 32M float32 parameters on this CPU, in a tf.function",
        "machine": machine_info(**quiet),
        "parameters": PARAMS,
        "elementwise_bytes_per_s": round(bandwidth),
        "adamw": {
            "median_seconds": round(seconds, 5),
            "bytes_per_s": round(BYTES_PER_PARAM * PARAMS / seconds),
            "params_per_s": round(PARAMS / seconds),
        },
        "simulated_seconds": round(simulated, 5),
        "simulated_note": "the update graph timed by tflms's roofline at the measured bandwidth",
        "memory_efficiency": round(simulated / seconds, 3),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(OUT)
    print(json.dumps({k: result[k] for k in ("adamw", "memory_efficiency")}))  # noqa: T201


if __name__ == "__main__":
    main()
