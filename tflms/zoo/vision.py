"""Image models of the zoo: small CNNs for tests, ResNet-50 and VGG16 for capacity figures.

Example:
    >>> model = cnn(image=8, filters=(4, 8))
    >>> model.output_shape, model.optimizer.__class__.__name__
    ((None, 10), 'SGD')
"""

from __future__ import annotations

import keras

from tflms.zoo.compiling import compiled

__all__ = ["cnn", "resnet", "resnet50", "vgg16"]


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


def resnet50(image: int = 224, *, classes: int = 1000, optimizer: str = "sgd", seed: int = 0):
    """``keras.applications.ResNet50`` (no weights downloaded) on ``image`` x ``image`` RGB.

    Args:
        image: height and width of the input.
        classes: output classes (softmax, sparse labels).
        optimizer: ``"sgd"``, ``"adam"`` or ``"rmsprop"``.
        seed: Keras' random seed for the initial weights.

    Returns:
        The compiled model.
    """
    keras.utils.set_random_seed(seed)
    model = keras.applications.ResNet50(
        weights=None, input_shape=(image, image, 3), classes=classes
    )
    return compiled(model, keras.losses.SparseCategoricalCrossentropy(), optimizer)


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
