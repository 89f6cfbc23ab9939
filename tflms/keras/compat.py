"""What Keras 3 gives a callback no public API for, in one place.

:class:`~tflms.LMSCallback` needs three facts about the running ``fit`` that
Keras passes to no callback: the ``CallbackList`` of that ``fit`` (to put the
model back when another callback raises, since ``on_train_end`` then never
runs), its data adapter and data (the batch size, when the traced step's
tensors leave it open), and the batches Keras peeked from a generator. They
are read here and nowhere else: from the ``fit`` frame on the Python stack and
from one private attribute of the data adapter. Everything else the callback
does goes through public API (its hooks, ``self.model``,
``make_train_function``, the traced step's tensors).

The names read here are those of Keras :data:`KERAS_RANGE` (the range
``setup.cfg`` pins and the suite covers; ``tests/tflms/test_keras_compat.py``
checks each of them inside a real ``fit``). A Keras outside that range gets one
warning; should a name move, the callback loses only what that name gave
(the batch size falls back to ``LMSConfig(batch_size=...)``, the hook guard to
healing at the next ``fit``), never silently trains differently.

Example:
    >>> running_fit(object()) is None  # no fit of this object on the stack
    True
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import keras

__all__ = ["KERAS_RANGE", "RunningFit", "running_fit", "peeked_batches", "check_keras_version"]

logger = logging.getLogger(__name__)

KERAS_RANGE = ("3.15", "3.16")
"""Keras versions ``[low, high)`` whose ``fit`` internals this module reads (setup.cfg pins it)."""

_warned: list[str] = []


@dataclass(frozen=True)
class RunningFit:
    """What the running ``fit`` of a model holds that no callback is given.

    Attributes:
        callbacks: its ``keras.callbacks.CallbackList`` (None if not found).
        adapter: its data adapter (None before Keras made one).
        data: its ``x`` argument (arrays, a ``tf.data.Dataset``, a ``PyDataset``...).
    """

    callbacks: Any
    adapter: Any
    data: Any


def running_fit(model: Any) -> RunningFit | None:
    """The ``fit`` of ``model`` running in this thread, or None (e.g. hooks driven by hand).

    Args:
        model: The Keras model whose ``fit`` to look for.

    Returns:
        Its :class:`RunningFit`, read from the ``fit`` frame's locals.
    """
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001 - the documented stack reader
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            names = frame.f_locals
            callbacks = names.get("callbacks")
            if not isinstance(callbacks, keras.callbacks.CallbackList):
                callbacks = None
            iterator = names.get("epoch_iterator")
            return RunningFit(callbacks, getattr(iterator, "data_adapter", None), names.get("x"))
        frame = frame.f_back
    return None


def peeked_batches(adapter: Any) -> list:
    """The batches Keras read ahead from a Python generator to learn its specs ([] if none).

    Args:
        adapter: A Keras data adapter.
    """
    return list(getattr(adapter, "_first_batches", None) or [])


def check_keras_version(version: str | None = None) -> bool:
    """Warn once when Keras is outside :data:`KERAS_RANGE`; return whether it is inside.

    Args:
        version: The version to judge; None reads ``keras.__version__``.
    """
    version = version or keras.__version__
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = (tuple(int(p) for p in v.split(".")) for v in KERAS_RANGE)
    inside = low <= parts < high
    if not inside and version not in _warned:
        _warned.append(version)
        logger.warning(
            "tflms: LMSCallback reads internals of Keras %s to %s (exclusive) that Keras gives "
            "callbacks no public API for; Keras %s is outside that range. If the batch size is "
            "not found, pass LMSConfig(batch_size=N); install the supported Keras with "
            "pip install 'keras>=%s,<%s'.",
            *KERAS_RANGE,
            version,
            *KERAS_RANGE,
        )
    return inside
