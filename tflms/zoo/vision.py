"""Image models of the zoo: small CNNs for tests, ResNet-50 and VGG16 for capacity figures.

Example:
    >>> model = cnn(image=8, filters=(4, 8))
    >>> model.output_shape, model.optimizer.__class__.__name__
    ((None, 10), 'SGD')
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflms.errors import ConfigError
from tflms.zoo.compiling import compiled

__all__ = ["FusedBatchNormalization", "cnn", "resnet", "resnet50", "vgg16"]

BATCH_NORMS = ("keras3", "fused")
"""Values of :func:`resnet50`'s ``batch_norm``."""


class FusedBatchNormalization(keras.layers.Layer):
    """Batch normalization over the last axis of a 4-D input as one fused TensorFlow kernel.

    What ``tf.keras`` ran under TensorFlow 1.x and 2.x (``fused=True`` was
    chosen for 4-D channels-last inputs): ``FusedBatchNormV3`` in training,
    whose gradient reads the input and the kernel's saved mean and inverse
    variance only. Keras 3's ``BatchNormalization`` computes the moments and
    the normalization as separate ops, and its gradient keeps their
    temporaries. The parameters and the moving statistics are those of
    ``keras.layers.BatchNormalization(axis=-1)``, so a model's weights load
    into either, and the outputs and gradients agree to float rounding; the
    moving variance is updated with the kernel's batch variance, which
    carries Bessel's correction (``tf.keras``'s fused path did the same;
    Keras 3 uses the biased one).

    Args:
        momentum: momentum of the moving statistics.
        epsilon: added to the variance.
        **kwargs: ``keras.layers.Layer`` arguments (``name``...).
    """

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.epsilon = epsilon

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ConfigError(
                f"FusedBatchNormalization needs a 4-D (batch, height, width, channels) input; "
                f"got shape {tuple(input_shape)}. Use keras.layers.BatchNormalization."
            )
        channels = (input_shape[-1],)
        # float32 under mixed precision too: the kernel takes float16 inputs
        # with float32 parameters and statistics (autocast would make them float16)
        weight = dict(shape=channels, autocast=False)
        self.gamma = self.add_weight(initializer="ones", name="gamma", **weight)
        self.beta = self.add_weight(initializer="zeros", name="beta", **weight)
        self.moving_mean = self.add_weight(
            initializer="zeros", name="moving_mean", trainable=False, **weight
        )
        self.moving_variance = self.add_weight(
            initializer="ones", name="moving_variance", trainable=False, **weight
        )

    def call(self, inputs, training=False, mask=None):  # mask: passed by Keras, unused
        if training:
            y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs, self.gamma, self.beta, epsilon=self.epsilon, is_training=True
            )
            keep = self.momentum
            self.moving_mean.assign(self.moving_mean * keep + mean * (1 - keep))
            self.moving_variance.assign(self.moving_variance * keep + variance * (1 - keep))
            return y
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs,
            self.gamma,
            self.beta,
            mean=self.moving_mean,
            variance=self.moving_variance,
            epsilon=self.epsilon,
            is_training=False,
        )
        return y

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "epsilon": self.epsilon}


def _sparse_logits():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def cnn(
    image: int = 16,
    filters: tuple[int, ...] = (8, 16, 16, 32),
    *,
    batch_norm: bool = True,
    channels: int = 3,
    classes: int = 10,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """A plain CNN: per filter count a 3x3 convolution (+ BatchNorm) + ReLU, then pooling and a classifier.

    Args:
        image: height and width of the input.
        filters: filters of each convolution, in order.
        batch_norm: put a BatchNormalization after each convolution.
        channels: input channels.
        classes: output classes (logits, sparse labels).
        optimizer: ``"sgd"``, ``"adam"`` or ``"rmsprop"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    inp = keras.Input((image, image, channels))
    x = inp
    for f in filters:
        x = keras.layers.Conv2D(f, 3, padding="same", activation=None if batch_norm else "relu")(x)
        if batch_norm:
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(classes)(x)
    return compiled(keras.Model(inp, out, name="cnn"), _sparse_logits(), optimizer)


def resnet(
    image: int = 16,
    blocks: tuple[tuple[int, int], ...] = ((16, 1), (16, 1), (32, 2), (32, 1)),
    *,
    classes: int = 10,
    optimizer: str = "sgd",
    seed: int = 7,
) -> keras.Model:
    """A small residual network: basic blocks of two 3x3 convolutions with BatchNorm.

    Args:
        image: height and width of the RGB input.
        blocks: ``(filters, stride)`` of each residual block.
        classes: output classes (logits, sparse labels).
        optimizer: ``"sgd"``, ``"adam"`` or ``"rmsprop"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    inp = keras.Input((image, image, 3))
    x = keras.layers.Conv2D(blocks[0][0], 3, padding="same", activation="relu")(inp)
    for filters, stride in blocks:
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same")(x)
        y = keras.layers.BatchNormalization()(y)
        y = keras.layers.Activation("relu")(y)
        y = keras.layers.Conv2D(filters, 3, padding="same")(y)
        y = keras.layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride)(shortcut)
        x = keras.layers.Activation("relu")(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(classes)(x)
    return compiled(keras.Model(inp, out, name="resnet"), _sparse_logits(), optimizer)


def resnet50(
    image: int = 224,
    *,
    classes: int = 1000,
    optimizer: str = "sgd",
    seed: int = 0,
    batch_norm: str = "keras3",
):
    """``keras.applications.ResNet50`` (no weights downloaded) on ``image`` x ``image`` RGB.

    Args:
        image: height and width of the input.
        classes: output classes (softmax, sparse labels).
        optimizer: ``"sgd"``, ``"adam"`` or ``"rmsprop"``.
        seed: Keras' random seed for the initial weights.
        batch_norm: ``"keras3"``: Keras 3's ``BatchNormalization``;
            ``"fused"``: every one replaced by :class:`FusedBatchNormalization`
            (same weights), the fused kernel ``tf.keras`` ran under TensorFlow
            1.x, as in the published ResNet50 measurements.

    Returns:
        The compiled model.

    Raises:
        ConfigError: an unknown ``batch_norm``.
    """
    if batch_norm not in BATCH_NORMS:
        raise ConfigError(f"batch_norm must be one of {BATCH_NORMS}. Received {batch_norm!r}.")
    keras.utils.set_random_seed(seed)
    model = keras.applications.ResNet50(
        weights=None, input_shape=(image, image, 3), classes=classes
    )
    if batch_norm == "fused":
        model = keras.models.clone_model(model, clone_function=_fused_batch_norm)
    return compiled(model, keras.losses.SparseCategoricalCrossentropy(), optimizer)


def _fused_batch_norm(layer):
    if isinstance(layer, keras.layers.BatchNormalization):
        return FusedBatchNormalization(
            momentum=layer.momentum, epsilon=layer.epsilon, name=layer.name
        )
    return layer.__class__.from_config(layer.get_config())


def vgg16(image: int = 224, *, classes: int = 1000, optimizer: str = "sgd", seed: int = 0):
    """``keras.applications.VGG16`` (no weights downloaded) on ``image`` x ``image`` RGB.

    Args:
        image: height and width of the input.
        classes: output classes (softmax, sparse labels).
        optimizer: ``"sgd"``, ``"adam"`` or ``"rmsprop"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    model = keras.applications.VGG16(weights=None, input_shape=(image, image, 3), classes=classes)
    return compiled(model, keras.losses.SparseCategoricalCrossentropy(), optimizer)
