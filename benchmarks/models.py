"""Benchmark workloads: models of :mod:`tflms.zoo` at the sizes the tflms benchmarks use.

Each builder returns a :class:`TrainStep` whose :meth:`TrainStep.trace`
traces a fresh training step (``model.train_step``, as Keras ``fit`` traces
it; :func:`tflms.train_step_graph`) with a static batch and returns its
``FuncGraph``. A fresh trace per call matters: applying a plan rewrites the
graph in place. Weights are never downloaded; only the graphs matter here.

Models:
    ``resnet50``: ``keras.applications.ResNet50``, 224x224x3, 1000 classes, SGD+momentum.
    ``vgg16``: ``keras.applications.VGG16``, 224x224x3, SGD+momentum.
    ``unet3d``: the demo's 3D U-Net widened as 3DUnetCNN's plain U-Net (depth 4,
        32 base filters, 4 channels, 4 classes), Adam, batch 1. Not the seed paper's model.
    ``isensee2017``: the seed paper's model, 3DUnetCNN's isensee2017 (16 base filters,
        depth 5, instance norm, weighted Dice), Adam, batch 1.
    ``transformer``: a BERT-base-like encoder (12 blocks, 12 heads, width 768, MLP 3072,
        512 tokens) with a pooled classifier, Adam.
    ``mlp``: 8 dense layers of 8192 units with ReLU on 4096 features, 1000 classes, SGD.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

import tflms  # noqa: E402
from tflms import zoo  # noqa: E402

__all__ = [
    "TrainStep",
    "resnet50",
    "vgg16",
    "unet3d",
    "isensee2017",
    "transformer",
    "mlp",
    "BUILDERS",
]


@dataclass
class TrainStep:
    """A zoo model at benchmark size, ready to trace training steps.

    Attributes:
        name: short model name.
        description: what it is, for reports.
        build: makes the compiled model for an input shape (``None``: the default one).
        x_shape: the default input shape without the batch dimension.
    """

    name: str
    description: str
    build: Callable[[tuple | None], object]
    x_shape: tuple
    _models: dict = field(default_factory=dict, repr=False)

    def model(self, x_shape: tuple | None = None):
        """The compiled model for ``x_shape`` (built once per shape)."""
        key = tuple(x_shape or self.x_shape)
        if key not in self._models:
            self._models[key] = self.build(None if key == tuple(self.x_shape) else key)
        return self._models[key]

    def trace(self, batch: int, x_shape: tuple | None = None) -> tf.Graph:
        """Trace a fresh training step for ``batch`` samples; returns its FuncGraph.

        Args:
            batch: the (static) batch size.
            x_shape: another input shape (e.g. another U-Net cube size).
        """
        return tflms.train_step_graph(self.model(x_shape), batch_size=batch)


def resnet50(image: int = 224) -> TrainStep:
    """ResNet-50 on ``image`` x ``image`` RGB."""
    return TrainStep(
        "resnet50",
        f"keras.applications.ResNet50, {image}x{image}x3, SGD+momentum",
        lambda shape: zoo.resnet50(image if shape is None else shape[0]),
        (image, image, 3),
    )


def vgg16(image: int = 224) -> TrainStep:
    """VGG16 on ``image`` x ``image`` RGB."""
    return TrainStep(
        "vgg16",
        f"keras.applications.VGG16, {image}x{image}x3, SGD+momentum",
        lambda shape: zoo.vgg16(image if shape is None else shape[0]),
        (image, image, 3),
    )


def unet3d(size: int = 128, depth: int = 4, base: int = 32) -> TrainStep:
    """The demo's 3D U-Net, widened as 3DUnetCNN's plain U-Net, on ``size``^3 cubes
    (not the seed paper's model: that is :func:`isensee2017`)."""
    return TrainStep(
        "unet3d",
        f"3D U-Net (the demo's, widened as 3DUnetCNN's plain U-Net: depth {depth}, {base} base "
        "filters, 4 channels in, 4 classes), Adam",
        lambda shape: zoo.unet3d(
            size if shape is None else shape[0], depth=depth, base_filters=base, widen=True
        ),
        (size, size, size, 4),
    )


def isensee2017(size: int = 128, arithmetic: str = "tf1") -> TrainStep:
    """The seed paper's 3D U-Net (3DUnetCNN's isensee2017) on ``size``^3 cubes of 4 channels.

    ``arithmetic="tf1"`` normalises with keras-contrib's arithmetic, whose
    temporaries are what the paper's real V100 held (see :mod:`tflms.zoo.isensee`).
    """
    return TrainStep(
        "isensee2017",
        f"3DUnetCNN isensee2017 (the seed paper's model: 16 base filters, depth 5, instance "
        f"norm with {arithmetic} arithmetic, 3 segmentation levels, weighted Dice), Adam",
        lambda shape: zoo.isensee2017(
            size if shape is None else shape[0], batch_size=None, arithmetic=arithmetic
        ),
        (size, size, size, 4),
    )


def transformer(
    seq: int = 512, dim: int = 768, heads: int = 12, blocks: int = 12, mlp_dim: int = 3072
) -> TrainStep:
    """A BERT-base-like Transformer encoder on ``seq`` tokens of width ``dim``."""
    return TrainStep(
        "transformer",
        f"Transformer encoder: {blocks} blocks, {heads} heads, width {dim}, MLP {mlp_dim}, "
        f"sequence {seq}, Adam",
        lambda shape: zoo.transformer(
            seq, dim, heads=heads, blocks=blocks, mlp_dim=mlp_dim, optimizer="adam"
        ),
        (seq, dim),
    )


def mlp(width: int = 8192, layers: int = 8, features: int = 4096) -> TrainStep:
    """An MLP of ``layers`` ReLU layers of ``width`` units on ``features`` inputs."""
    return TrainStep(
        "mlp",
        f"MLP: {layers} x Dense({width}, relu) on {features} features, SGD+momentum",
        lambda shape: zoo.mlp(features, (width,) * layers, classes=1000),
        (features,),
    )


BUILDERS = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "unet3d": unet3d,
    "isensee2017": isensee2017,
    "transformer": transformer,
    "mlp": mlp,
}
