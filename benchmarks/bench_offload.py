"""GPT-2 with its AdamW state on the host (``OffloadedOptimizer``), simulated on a V100-16GB.

Run by ``make bench`` (or ``python benchmarks/bench_offload.py [--models small,medium]``).
The zoo's GPT-2 (sequence 1024, untied 50257-word head, AdamW) is traced as
``tflms.analyze`` traces its Keras training step twice: with plain AdamW, and
with ``OffloadedOptimizer(AdamW)``, whose slots live on the host. Two
logical CPU devices stand in for the GPU (the weights, ``CPU:1``) and its
host (``CPU:0``), so the view places each variable where it lives. Each view
is simulated on the realistic V100-16GB (``accounting="realistic"``) over
PCIe3 and NVLink2, without swaps: the device peak, the variables on the
device, the host peak (the slots, pinned all step long, and the gradients
waiting for their update) and the predicted step time, whose difference is
the gradients' copies to the host, the update there (the host model's
roofline, :data:`tflms.cost.hardware.HOST`; ``bench_cpu_optimizer.py``
checks it against this CPU) and the weights' copies back.

Every figure is simulated on a virtual V100-16GB; none was measured on a GPU.
Writes ``benchmarks/results/offload.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(  # before anything starts TensorFlow's devices
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import keras  # noqa: E402

import tflms  # noqa: E402
from benchmarks.common import RESULTS, provenance, write_result  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.keras import OffloadedOptimizer  # noqa: E402

HOST, DEVICE = "/device:CPU:0", "/device:CPU:1"
GPU = "V100-16GB"
LINKS = ("pcie3", "nvlink2")
MODELS = {  # (blocks, width, heads), batch
    "small": ((12, 768, 12), 2),
    "medium": ((24, 1024, 16), 1),
}
OUT = RESULTS / "offload.json"


def simulate(name: str, offload: bool) -> dict:
    (layers, dim, heads), batch = MODELS[name]
    config = tflms.LMSConfig(device=DEVICE, host_device=HOST, batch_size=batch)
    with tf.device(DEVICE):
        model = zoo.gpt2(layers=layers, dim=dim, heads=heads)
        if offload:
            model.compile(
                optimizer=OffloadedOptimizer(keras.optimizers.AdamW(1e-4), host_device=HOST),
                loss=model.loss,
                jit_compile=False,
            )
        view = tflms.analyze(model, batch_size=batch, config=config)
    row = {"parameters": int(model.count_params())}
    for link in LINKS:
        result = tflms.simulate(view, device=GPU, link=link)
        row[link] = {
            "device_peak_bytes": result.device_peak_bytes,
            "device_variable_bytes": result.variable_bytes,
            "host_peak_bytes": result.host_peak_bytes,
            "step_time_s": round(result.step_time_s, 4),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    rows = {}
    for name in args.models.split(","):
        started = time.perf_counter()
        plain, offloaded = simulate(name, False), simulate(name, True)
        rows[name] = {
            "batch": MODELS[name][1],
            "sequence": 1024,
            "parameters": plain["parameters"],
            "plain": plain,
            "offload": offloaded,
            "device_bytes_freed": plain["pcie3"]["device_peak_bytes"]
            - offloaded["pcie3"]["device_peak_bytes"],
            "step_time_over_plain": {
                link: round(offloaded[link]["step_time_s"] / plain[link]["step_time_s"], 3)
                for link in LINKS
            },
            "analysis_s": round(time.perf_counter() - started, 1),
        }
        print(name, json.dumps(rows[name]["step_time_over_plain"]), flush=True)  # noqa: T201
    write_result(
        OUT.name,
        {
            **provenance("GPT-2 with AdamW's state on the host (OffloadedOptimizer), V100-16GB"),
            "device": GPU,
            "accounting": "realistic",
            "models": rows,
        },
    )


if __name__ == "__main__":
    main()
