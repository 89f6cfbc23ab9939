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


def _users(name: str, **kwargs):
    """A model of ``tests/tflms/users_models.py``: families the simulator was not tuned to."""
    from tests.tflms import users_models

    return lambda: users_models.USERS_MODELS[name](**kwargs)


def _users_data(model, batch):
    from tests.tflms.users_models import users_data

    return users_data(model, batch)


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
    "gpt2": (
        "zoo.gpt2, 4 blocks, 256 wide, 128 tokens, vocabulary 2048, AdamW",
        lambda: zoo.gpt2(2048, 128, 256, heads=4, layers=4),
        8,
    ),
    "bert": (
        "zoo.bert, 4 blocks, 256 wide, 128 tokens, vocabulary 2048, AdamW",
        lambda: zoo.bert(2048, 128, 256, heads=4, layers=4),
        8,
    ),
    "vit": ("users' ViT: 16 patches + class token, 2 blocks, 32 wide, AdamW", _users("vit"), 768),
    "convnext": ("users' ConvNeXt: 2 blocks, 24 wide, 4x4 tokens, AdamW", _users("convnext"), 1024),
    "mobilenet_v3": ("users' MobileNetV3: hard-swish, SE, 16x16", _users("mobilenet_v3"), 512),
    "diffusion_unet": (
        "users' diffusion U-Net: GroupNorm, time input, 16x16",
        _users("diffusion_unet"),
        128,
    ),
    "conv_bigru": (
        "users' Conv1D + bidirectional GRU tagger, 12 tokens",
        _users("conv_bigru"),
        4096,
    ),
    "encoder_decoder": (
        "users' encoder-decoder, cross attention, 10 tokens",
        _users("encoder_decoder"),
        1024,
    ),
}
"""name: (description, build, batch). The users' models (``tests/tflms/users_models.py``)
take their data from ``users_data``; the zoo's from ``zoo.synthetic_data``."""

USERS = {"vit", "convnext", "mobilenet_v3", "diffusion_unet", "conv_bigru", "encoder_decoder"}


def main(name: str) -> None:
    tf.config.threading.set_inter_op_parallelism_threads(1)  # before TensorFlow starts
    description, build, batch = MODELS[name]
    model = build()
    x, y = (_users_data if name in USERS else zoo.synthetic_data)(model, batch)
    step = tf.function(model.train_step, jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    data = (tf.nest.map_structure(tf.constant, x), tf.constant(y))
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
