"""Training steps of realistic models for the tflms benchmarks.

Each builder returns a :class:`TrainStep` whose :meth:`TrainStep.trace`
traces a fresh ``@tf.function`` training step (forward pass under a
``GradientTape``, gradients, optimizer update) with a static batch, as Keras
``fit`` traces it, and returns its ``FuncGraph``. A fresh trace per call
matters: applying a swap plan rewrites the graph in place.

Weights are never downloaded (``weights=None``); only the graphs matter here.

Models:
    ``resnet50``: ``keras.applications.ResNet50``, 224x224x3, 1000 classes,
        SGD with momentum.
    ``vgg16``: ``keras.applications.VGG16``, 224x224x3, SGD with momentum.
    ``unet3d``: the 3D U-Net of the seed paper's BraTS experiment (Ellis'
        ``unet_model_3d``, after Cicek et al. 2016): 4 input channels, depth 4,
        32 base filters, two 3x3x3 convolutions + ReLU per level (the second
        doubles the filters), max pooling, upsampling and skip concatenation,
        3 sigmoid outputs, Adam, batch 1.
    ``transformer``: a BERT-base-like encoder: 12 blocks of 12-head attention
        and a 3072-wide GELU MLP on 768-wide tokens, with LayerNorm, Adam.
    ``mlp``: 8 dense layers of 8192 units with ReLU, 1000 classes, SGD.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

__all__ = ["TrainStep", "resnet50", "vgg16", "unet3d", "transformer", "mlp", "BUILDERS"]


@dataclass
class TrainStep:
    """A model with its loss and optimizer, ready to trace training steps.

    Attributes:
        name: short model name.
        description: what it is, for reports.
        model, optimizer, loss: the Keras objects.
        x_shape: input shape without the batch dimension.
        y_shape, y_dtype: target shape without the batch dimension, and dtype.
    """

    name: str
    description: str
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    loss: Callable
    x_shape: tuple
    y_shape: tuple
    y_dtype: tf.DType = tf.float32
    _built: bool = field(default=False, repr=False)

    def trace(self, batch: int, x_shape: tuple | None = None) -> tf.Graph:
        """Trace a fresh training step for ``batch`` samples; returns its FuncGraph.

        Args:
            batch: the (static) batch size.
            x_shape: overrides the input shape (e.g. another U-Net cube size);
                the target shape follows for dense outputs.
        """
        x_shape = tuple(x_shape or self.x_shape)
        y_shape = self.y_shape if x_shape == tuple(self.x_shape) else self._y_for(x_shape)
        if not self._built:  # create optimizer slots outside the trace
            self.optimizer.build(self.model.trainable_variables)
            self._built = True
        model, optimizer, loss_fn = self.model, self.optimizer, self.loss

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        specs = (
            tf.TensorSpec([batch, *x_shape], tf.float32, name="x"),
            tf.TensorSpec([batch, *y_shape], self.y_dtype, name="y"),
        )
        return step.get_concrete_function(*specs).graph

    def _y_for(self, x_shape: tuple) -> tuple:
        return (*x_shape[:-1], self.y_shape[-1])


def _sgd() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.01, momentum=0.9)


def resnet50(image: int = 224) -> TrainStep:
    """ResNet-50 (keras.applications, no weights) on ``image`` x ``image`` RGB."""
    model = keras.applications.ResNet50(weights=None, input_shape=(image, image, 3), classes=1000)
    return TrainStep(
        "resnet50",
        f"keras.applications.ResNet50, {image}x{image}x3, SGD+momentum",
        model,
        _sgd(),
        keras.losses.SparseCategoricalCrossentropy(),
        (image, image, 3),
        (),
        tf.int32,
    )


def vgg16(image: int = 224) -> TrainStep:
    """VGG16 (keras.applications, no weights) on ``image`` x ``image`` RGB."""
    model = keras.applications.VGG16(weights=None, input_shape=(image, image, 3), classes=1000)
    return TrainStep(
        "vgg16",
        f"keras.applications.VGG16, {image}x{image}x3, SGD+momentum",
        model,
        _sgd(),
        keras.losses.SparseCategoricalCrossentropy(),
        (image, image, 3),
        (),
        tf.int32,
    )


def unet3d(
    size: int = 128,
    channels: int = 4,
    base: int = 32,
    depth: int = 4,
    labels: int = 3,
    upsampling: str = "transpose",
):
    """The seed paper's 3D U-Net (Ellis' unet_model_3d) on ``size``^3 cubes.

    The input size is left open (``None`` spatial dims are not used: traces
    pass ``x_shape``), so one model serves every cube size.
    """
    keras.utils.set_random_seed(0)
    inp = keras.Input((None, None, None, channels))
    x = inp
    levels = []
    for level in range(depth):
        filters = base * 2**level
        a = keras.layers.Conv3D(filters, 3, padding="same", activation="relu")(x)
        b = keras.layers.Conv3D(2 * filters, 3, padding="same", activation="relu")(a)
        levels.append(b)
        x = keras.layers.MaxPooling3D(2)(b) if level < depth - 1 else b
    for level in range(depth - 2, -1, -1):
        if upsampling == "transpose":  # Cicek et al.'s 2x2x2 up-convolution
            x = keras.layers.Conv3DTranspose(x.shape[-1], 2, strides=2)(x)
        else:  # Ellis' default; Grappler cannot infer the shapes of its gradient
            x = keras.layers.UpSampling3D(2)(x)
        x = keras.layers.Concatenate()([x, levels[level]])
        filters = levels[level].shape[-1]
        x = keras.layers.Conv3D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv3D(filters, 3, padding="same", activation="relu")(x)
    out = keras.layers.Conv3D(labels, 1, activation="sigmoid")(x)
    model = keras.Model(inp, out, name="unet3d")

    def dice_loss(y_true, y_pred):
        inter = tf.reduce_sum(y_true * y_pred)
        return 1.0 - (2.0 * inter + 1.0) / (tf.reduce_sum(y_true) + tf.reduce_sum(y_pred) + 1.0)

    return TrainStep(
        "unet3d",
        f"3D U-Net (Ellis unet_model_3d: depth {depth}, {base} base filters, "
        f"{channels} channels in, {labels} out), Adam",
        model,
        keras.optimizers.Adam(1e-5),
        dice_loss,
        (size, size, size, channels),
        (size, size, size, labels),
    )


def transformer(
    seq: int = 512, dim: int = 768, heads: int = 12, blocks: int = 12, mlp_dim: int = 3072
) -> TrainStep:
    """A BERT-base-like Transformer encoder on ``seq`` tokens of width ``dim``."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((seq, dim))
    x = inp
    for _ in range(blocks):
        attn = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + attn)
        ff = keras.layers.Dense(mlp_dim, activation="gelu")(x)
        ff = keras.layers.Dense(dim)(ff)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + ff)
    out = keras.layers.Dense(dim)(x)
    model = keras.Model(inp, out, name="transformer")
    return TrainStep(
        "transformer",
        f"Transformer encoder: {blocks} blocks, {heads} heads, width {dim}, MLP {mlp_dim}, "
        f"sequence {seq}, Adam",
        model,
        keras.optimizers.Adam(1e-4),
        keras.losses.MeanSquaredError(),
        (seq, dim),
        (seq, dim),
    )


def mlp(width: int = 8192, layers: int = 8, features: int = 4096) -> TrainStep:
    """An MLP of ``layers`` ReLU layers of ``width`` units on ``features`` inputs."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((features,))
    x = inp
    for _ in range(layers):
        x = keras.layers.Dense(width, activation="relu")(x)
    out = keras.layers.Dense(1000)(x)
    model = keras.Model(inp, out, name="mlp")
    return TrainStep(
        "mlp",
        f"MLP: {layers} x Dense({width}, relu) on {features} features, SGD+momentum",
        model,
        _sgd(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        (features,),
        (),
        tf.int32,
    )


BUILDERS = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "unet3d": unet3d,
    "transformer": transformer,
    "mlp": mlp,
}
