"""The six reference models of the tflms tests, at sizes a CPU trains 50 steps of in seconds.

All come from :mod:`tflms.zoo`; each entry of :data:`MODELS` takes a sample
count and returns ``(compiled model, x, y)`` with fixed seeds, so two calls
give the same initial weights and data.
"""

from __future__ import annotations

from tflms import zoo

BATCH = 4

SIZES = {
    "mlp": lambda: zoo.mlp(),
    "cnn_bn": lambda: zoo.cnn(),
    "resnet": lambda: zoo.resnet(),
    "unet3d": lambda: zoo.unet3d(16, depth=2, base_filters=4, channels=2, classes=3),
    "transformer": lambda: zoo.transformer(),
    "lstm": lambda: zoo.lstm(),
}


def _with_data(build):
    def make(n: int):
        model = build()
        return (model, *zoo.synthetic_data(model, n))

    return make


MODELS = {name: _with_data(build) for name, build in SIZES.items()}
mlp = MODELS["mlp"]
cnn_bn = MODELS["cnn_bn"]
