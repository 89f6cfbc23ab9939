"""Restore what a ``.keras`` checkpoint saved of the training, where Keras's loader does not.

``keras.models.load_model`` restores the compile settings (the optimizer
with its variables, iterations included) by calling ``compile`` with the
saved ones, but only when the model class does not define ``compile``
itself: for such a class (KerasHub's ``CausalLM`` and every KerasHub task,
whose ``__init__`` also compiles with a default optimizer) Keras warns that
it did not call ``compile``, keeps whatever optimizer the class made, and
warns again when that optimizer's variables do not match the saved ones,
which it then drops. A resumed run would go on with another optimizer
(KerasHub's ``Adam(2e-5)``) at iteration 0.

:func:`saved_training` reads what the file saved (its ``config.json`` and
the optimizer group of ``model.weights.h5``, with ``zipfile`` and
``h5py``), :func:`optimizer_problem` tells whether the loaded model lacks it,
and :func:`restore_optimizer` puts it back with public Keras calls: the
model's own ``compile`` with the saved arguments, ``optimizer.build`` and
``model.load_weights(path)`` (which reads the optimizer's variables and the
random-generator state, see :mod:`ddl_tf.keras.random_state`). Where that
cannot work (a ``compile`` that takes other arguments, or that ignores the
optimizer it is given) it raises :class:`~ddl_tf.errors.RestoreError`
naming the route that does: build and compile the model yourself, then
``model.load_weights(path)``.

Example:
    >>> import keras
    >>> from ddl_tf.keras.restore import describe_optimizer
    >>> describe_optimizer(keras.saving.serialize_keras_object(keras.optimizers.AdamW(1e-3)))
    'AdamW(learning_rate=0.001)'
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np

from ddl_tf.errors import RestoreError
from ddl_tf.keras.random_state import ATTRIBUTE, keep_random_state

__all__ = [
    "SavedTraining",
    "saved_training",
    "optimizer_problem",
    "restore_optimizer",
    "describe_optimizer",
    "KERAS_WARNINGS_RESOLVED",
]

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
OPTIMIZER_GROUP = "optimizer/vars"
RANDOM_STATE_GROUP = f"{ATTRIBUTE}/vars"

KERAS_WARNINGS_RESOLVED = (
    "was not called as part of model loading because the model's `compile()` method is custom",
    "Skipping variable loading for optimizer",
)
"""Keras's warnings about a checkpoint's optimizer that it did not restore: once
:func:`restore_optimizer` restored it, ``ddl_tf.keras.load_model`` does not pass them on."""

_WRAPPER_KEYS = ("optimizer", "inner_optimizer")
"""Where a wrapper optimizer's config holds the optimizer it wraps (DistributedOptimizer,
LossScaleOptimizer)."""


@dataclass(frozen=True)
class SavedTraining:
    """What a ``.keras`` file saved of the training (besides the weights).

    Attributes:
        path: The file (or ``.keras`` directory).
        compile_config: The serialized compile settings, or None (saved uncompiled).
        optimizer_variables: How many optimizer variables the file holds.
        random_state: The random generators' states, or None (not kept in the file).
    """

    path: Path
    compile_config: dict | None
    optimizer_variables: int
    random_state: list[np.ndarray] | None

    @property
    def optimizer_config(self) -> dict | None:
        """The serialized optimizer of :attr:`compile_config`, or None."""
        optimizer = (self.compile_config or {}).get("optimizer")
        return optimizer if isinstance(optimizer, dict) else None

    def optimizer_value(self, index: int) -> np.ndarray:
        """The saved value of the optimizer's variable number ``index``.

        Args:
            index: Its position in ``optimizer.variables``.

        Returns:
            The array.
        """
        with _weights(self.path) as weights:
            return np.asarray(weights[f"{OPTIMIZER_GROUP}/{index}"])


def saved_training(filepath: Any) -> SavedTraining | None:
    """Read what ``filepath`` saved of the training; None for what it does not read.

    Reads ``config.json`` and the names (not the values) of the optimizer's
    variables; the random state's values are small and read whole. Files
    other than the ``.keras`` format (a file object, ``hf://``, legacy
    ``.h5``) give None.

    Args:
        filepath: What was passed to ``load_model``.

    Returns:
        A :class:`SavedTraining`, or None.
    """
    if not isinstance(filepath, (str, Path)) or str(filepath).startswith("hf://"):
        return None
    path = Path(filepath)
    if not (path.is_dir() and (path / CONFIG_FILE).exists()) and not (
        path.suffix == ".keras" and zipfile.is_zipfile(path)
    ):
        return None
    config = json.loads(_read_member(path, CONFIG_FILE))
    with _weights(path) as weights:
        optimizer = weights.get(OPTIMIZER_GROUP)
        count = len(optimizer.keys()) if isinstance(optimizer, h5py.Group) else 0
        group = weights.get(RANDOM_STATE_GROUP)
        random_state = None
        if isinstance(group, h5py.Group):
            random_state = [np.asarray(group[str(i)]) for i in range(len(group.keys()))]
    compile_config = config.get("compile_config")
    return SavedTraining(
        path, compile_config if isinstance(compile_config, dict) else None, count, random_state
    )


def optimizer_problem(
    model: keras.Model, saved: SavedTraining, custom_objects: dict | None = None
) -> str | None:
    """What the loaded ``model`` lacks of the file's optimizer, or None when it has it all.

    The optimizer must be the saved one (same classes, wrappers included, and
    configuration; names aside) and hold as many variables as the file, which
    Keras loads all together or not at all.

    Args:
        model: What ``keras.models.load_model`` returned.
        saved: What :func:`saved_training` read from the same file.
        custom_objects: Classes the saved optimizer may name.

    Returns:
        The problem in words, or None.
    """
    expected = saved.optimizer_config
    if expected is None:
        return None
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return "the loaded model has no optimizer"
    loaded = keras.saving.serialize_keras_object(optimizer)
    if not _same_optimizer(loaded, expected, custom_objects):
        return f"the loaded model has {describe_optimizer(loaded)} instead"
    count = len(optimizer.variables) if optimizer.built else 0
    if count != saved.optimizer_variables and not _sharded(optimizer):
        return (
            f"Keras did not load its {saved.optimizer_variables} variables (the loaded "
            f"optimizer has {count})"
        )
    return None


def restore_optimizer(
    model: keras.Model, saved: SavedTraining, problem: str, custom_objects: dict | None = None
) -> None:
    """Compile ``model`` with the file's settings and load the optimizer's saved variables.

    Calls the model's own ``compile`` with the saved arguments (so a class
    that sets more up there, as KerasHub's do, still does), builds the
    optimizer and reads the file again with ``model.load_weights``, which
    sets the optimizer's variables (iterations included) and the random state.

    Args:
        model: What ``keras.models.load_model`` returned for ``saved.path``.
        saved: What :func:`saved_training` read from the file.
        problem: What :func:`optimizer_problem` found (for the messages).
        custom_objects: Classes the saved settings may name.

    Raises:
        RestoreError: The model's ``compile`` does not take Keras's arguments,
            ignores the optimizer it is given, or the saved variables still do
            not fit; the message names the route that restores the state.
    """
    expected = saved.optimizer_config
    assert expected is not None  # optimizer_problem() found a problem with it
    cls = type(model).__name__
    wanted = describe_optimizer(expected)
    head = f"{saved.path} was saved with {wanted}, but {problem}"
    route = _route(saved.path, expected)
    try:
        arguments = keras.saving.deserialize_keras_object(
            saved.compile_config, custom_objects=custom_objects
        )
    except Exception as err:  # noqa: BLE001 - any failure to rebuild becomes the route
        raise RestoreError(
            f"{head}; its compile settings cannot be rebuilt here ({type(err).__name__}: "
            f"{err}). {route}"
        ) from err
    try:
        model.compile(**arguments)
    except TypeError as err:
        raise RestoreError(
            f"{head}, and {cls}.compile does not take the saved compile arguments ({err}). {route}"
        ) from err
    now = keras.saving.serialize_keras_object(model.optimizer)
    if not _same_optimizer(now, expected, custom_objects):
        raise RestoreError(
            f"{head}, and {cls}.compile(optimizer=...) made {describe_optimizer(now)} instead "
            f"of the optimizer it was given. {route}"
        )
    optimizer = model.optimizer
    if model.trainable_variables and not optimizer.built:
        optimizer.build(model.trainable_variables)
    keep_random_state(model)
    model.load_weights(saved.path)
    count = len(optimizer.variables) if optimizer.built else 0
    if count != saved.optimizer_variables and not _sharded(optimizer):
        raise RestoreError(
            f"{head}; compiled again with it, the model's optimizer has {count} variables where "
            f"the file holds {saved.optimizer_variables} (is the model built?). {route}"
        )
    if not _sharded(optimizer):
        index = [id(v) for v in optimizer.variables].index(id(optimizer.iterations))
        stored = int(saved.optimizer_value(index))
        if int(optimizer.iterations.numpy()) != stored:
            raise RestoreError(
                f"{head}; after loading, the optimizer is at iteration "
                f"{int(optimizer.iterations.numpy())} where the file holds {stored}. {route}"
            )
    logger.info(
        "%s: %s.compile is the model's own, so Keras left it with another optimizer; "
        "restored the saved %s with its %d variables (iteration %d)",
        saved.path,
        cls,
        wanted,
        count,
        int(optimizer.iterations.numpy()),
    )


def describe_optimizer(config: dict) -> str:
    """``DistributedOptimizer(AdamW(learning_rate=0.001))`` for a serialized optimizer.

    Args:
        config: What ``keras.saving.serialize_keras_object(optimizer)`` returns.

    Returns:
        The wrappers and the optimizer by class, with the learning rate when it is a number.
    """
    names = []
    node: Any = config
    while isinstance(node, dict):
        names.append(str(node.get("class_name", "?")))
        inner = node.get("config") or {}
        node = next((inner[k] for k in _WRAPPER_KEYS if isinstance(inner.get(k), dict)), None)
        if node is None:
            rate = inner.get("learning_rate")
            if isinstance(rate, (int, float)):
                names[-1] += f"(learning_rate={float(np.float32(rate)):.6g})"
    text = names[-1]
    for name in reversed(names[:-1]):
        text = f"{name}({text})"
    return text


def _route(path: Path, expected: dict) -> str:
    return (
        "To resume with the saved optimizer and its state: build the model (e.g. "
        f"load_model({str(path)!r}, compile=False)), compile it with the optimizer it was "
        f"trained with ({describe_optimizer(expected)}, e.g. "
        "model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(...)), ...)), "
        "call model.optimizer.build(model.trainable_variables) and "
        "hvd.keep_random_state(model), then "
        f"model.load_weights({str(path)!r}): it restores the weights, the optimizer's variables "
        "(iterations included) and the random-generator state."
    )


def _same_optimizer(config: dict, expected: dict, custom_objects: dict | None) -> bool:
    """Whether serialized optimizer ``config`` is the saved ``expected`` one (names aside).

    Compared as saved, then as the saved one serializes once rebuilt: an
    optimizer whose configuration does not survive a round trip unchanged
    is still recognized.
    """
    if _comparable(config) == _comparable(expected):
        return True
    try:
        rebuilt = keras.saving.deserialize_keras_object(expected, custom_objects=custom_objects)
        again = keras.saving.serialize_keras_object(rebuilt)
    except Exception:  # noqa: BLE001 - not rebuildable here: not recognizably the same
        return False
    return _comparable(config) == _comparable(again)


def _comparable(config: Any) -> Any:
    """A serialized optimizer without its names (which Keras numbers per process)."""
    if isinstance(config, dict):
        return {k: _comparable(v) for k, v in config.items() if k != "name"}
    if isinstance(config, (list, tuple)):
        return [_comparable(v) for v in config]
    return config


def _sharded(optimizer: Any) -> bool:
    """Whether ``optimizer`` keeps its state in shards (its variables are this rank's share)."""
    from ddl_tf.keras.sharding import ShardedOptimizer

    while optimizer is not None:
        if isinstance(optimizer, ShardedOptimizer):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def _read_member(path: Path, name: str) -> bytes:
    if path.is_dir():
        return (path / name).read_bytes()
    with zipfile.ZipFile(path) as archive:
        return archive.read(name)


@contextlib.contextmanager
def _weights(path: Path) -> Iterator[h5py.File]:
    """``model.weights.h5`` of a ``.keras`` file or directory, opened read-only.

    In a ``.keras`` zip the member is stored uncompressed (as Keras writes
    it), so h5py reads it in place through a window on the file: a few
    seeks for the groups looked up, never the whole file.
    """
    if path.is_dir():
        with h5py.File(path / WEIGHTS_FILE, "r") as weights:
            yield weights
        return
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(WEIGHTS_FILE)
        with contextlib.ExitStack() as stack:
            if info.compress_type == zipfile.ZIP_STORED:
                raw = stack.enter_context(open(path, "rb"))  # noqa: SIM115 - closed by the stack
                handle: Any = _Window(raw, _data_offset(raw, info), info.file_size)
            else:
                handle = stack.enter_context(archive.open(info))
            yield stack.enter_context(h5py.File(handle, "r"))


def _data_offset(raw: Any, info: zipfile.ZipInfo) -> int:
    """Where a member's data starts: after its local header (whose extra field may differ)."""
    raw.seek(info.header_offset)
    header = raw.read(30)
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``size`` bytes of ``raw`` from ``start``."""

    def __init__(self, raw: Any, start: int, size: int) -> None:
        super().__init__()
        self._raw, self._start, self._size, self._pos = raw, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = max(0, min(len(view), self._size - self._pos))
        if count == 0:
            return 0
        self._raw.seek(self._start + self._pos)
        got = self._raw.readinto(view[:count])
        self._pos += got
        return got
