"""How zoo models are compiled and seeded: fixed seeds, SGD with momentum, Adam(W) or RMSprop, no XLA.

Example:
    >>> [type(optimizer(name)).__name__ for name in OPTIMIZERS]
    ['SGD', 'Adam', 'RMSprop', 'AdamW']
"""

from __future__ import annotations

import keras

from tflms.errors import ConfigError

__all__ = ["optimizer", "compiled", "OPTIMIZERS"]

OPTIMIZERS = ("sgd", "adam", "rmsprop", "adamw")


def optimizer(name: str) -> keras.optimizers.Optimizer:
    """``"sgd"``: SGD(0.01, momentum 0.9); ``"adam"``: Adam(1e-3); ``"rmsprop"``: RMSprop(1e-3);
    ``"adamw"``: AdamW(1e-4, weight decay 0.01, as BERT and GPT-2 trained).

    Args:
        name: one of :data:`OPTIMIZERS`.

    Returns:
        A new Keras optimizer instance.

    Raises:
        ConfigError: another name.
    """
    if name == "sgd":
        return keras.optimizers.SGD(0.01, momentum=0.9)
    if name == "adam":
        return keras.optimizers.Adam(1e-3)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(1e-3)
    if name == "adamw":
        return keras.optimizers.AdamW(1e-4, weight_decay=0.01)
    raise ConfigError(f"optimizer must be one of {OPTIMIZERS}. Received optimizer={name!r}.")


def compiled(model: keras.Model, loss, optimizer_name: str) -> keras.Model:
    """``model`` compiled with ``loss`` and the named optimizer, XLA off (LMS needs placement).

    Args:
        model: The Keras model; compiled in place.
        loss: Any loss ``model.compile`` accepts.
        optimizer_name: one of :data:`OPTIMIZERS` (see :func:`optimizer`).

    Returns:
        ``model`` itself.

    Raises:
        ConfigError: ``optimizer_name`` is not a known optimizer.
    """
    model.compile(optimizer=optimizer(optimizer_name), loss=loss, jit_compile=False)
    return model
