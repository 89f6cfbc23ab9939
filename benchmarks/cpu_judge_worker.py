"""One process of the CPU judge (run by ``bench_fidelity.py``): measure one model, print JSON.

``python benchmarks/cpu_judge_worker.py MODEL``. One inter-op thread, so the
executor's order (and so its peak) is as repeatable as the CPU allows. The
caller starts it under ``tflms.utils.cpu.measurement_env()`` (oneDNN's CPU
allocator, on any x86-64 CPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tensorflow as tf  # noqa: E402

import tflms  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.simulation.measure import measure_cpu_step  # noqa: E402

MODELS = {
    "resnet50": ("keras.applications.ResNet50, 224x224", lambda: zoo.resnet50(), 4),
    "vgg16": ("keras.applications.VGG16, 224x224", lambda: zoo.vgg16(), 2),
    "unet3d": (
        "3D U-Net (widened, depth 4, 16 base filters), 48^3",
        lambda: zoo.unet3d(48, depth=4, base_filters=16, widen=True),
        1,
    ),
    "transformer": (
        "Transformer encoder (2 blocks, 8 heads, 256 wide), 128 tokens, Adam",
        lambda: zoo.transformer(128, 256, heads=8, blocks=2, optimizer="adam"),
        4,
    ),
    "mlp": ("MLP 1024 -> 4 x 4096 -> 1000", lambda: zoo.mlp(1024, (4096,) * 4, classes=1000), 256),
}


def main(name: str) -> None:
    tf.config.threading.set_inter_op_parallelism_threads(1)  # before TensorFlow starts
    description, build, batch = MODELS[name]
    model = build()
    x, y = zoo.synthetic_data(model, batch)
    step = tf.function(model.train_step, jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    data = (tf.constant(x), tf.constant(y))
    view = tflms.build_view(step.get_concrete_function(data).graph)
    measured = measure_cpu_step(step, data, runs=3)
    row = {"model": name, "description": description, "batch": batch, **measured.to_dict()}
    for allocator in ("exact", "bfc"):
        row[f"first_ready_{allocator}_bytes"] = tflms.simulate(
            view, allocator=allocator, accounting="tensors"
        ).device_peak_bytes
        row[f"replayed_{allocator}_bytes"] = tflms.simulate(
            view, allocator=allocator, order=measured.order, accounting="tensors"
        ).device_peak_bytes
    print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1])
