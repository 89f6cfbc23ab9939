"""Wire compression: tiny strategy objects, as in Horovod's ``compression.py``.

``compress(array) -> (array, ctx)`` before the collective and
``decompress(array, ctx)`` after it. ``fp16`` and ``bf16`` halve the bytes on
the wire for float32/float64 tensors; the reductions themselves accumulate in
float32 (see :mod:`ddl_tf.core.algorithms`), never in half precision. Integer
and already-half tensors pass through unchanged.

``fp16`` keeps 11 significant bits but overflows above 65504; ``bf16`` keeps
the float32 exponent range with 8 significant bits. Horovod has no ``bf16``.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.compression import Compression
    >>> wire, ctx = Compression.fp16.compress(np.array([1.5, 2.25], np.float32))
    >>> wire.dtype, Compression.fp16.decompress(wire, ctx).dtype
    (dtype('float16'), dtype('float32'))
    >>> Compression.get("bf16").name
    'bf16'
"""

from __future__ import annotations

import abc

import ml_dtypes
import numpy as np

from ddl_tf.errors import ConfigError

__all__ = ["Compressor", "NoneCompressor", "HalfCompressor", "Compression"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)


class Compressor(abc.ABC):
    """Interface: ``compress`` before the collective, ``decompress`` after it."""

    name = "abstract"

    @abc.abstractmethod
    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype ``compress`` turns ``dtype`` into."""

    @abc.abstractmethod
    def compress(self, array: np.ndarray) -> tuple[np.ndarray, np.dtype | None]:
        """Return the array to send and the context ``decompress`` needs."""

    @abc.abstractmethod
    def decompress(self, array: np.ndarray, ctx: np.dtype | None) -> np.ndarray:
        """Undo ``compress`` on the reduced array."""

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    name = "none"

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        return np.dtype(dtype)

    def compress(self, array: np.ndarray) -> tuple[np.ndarray, None]:
        return array, None

    def decompress(self, array: np.ndarray, ctx: None) -> np.ndarray:
        return array


class HalfCompressor(Compressor):
    """Send float32/float64 tensors as a 16-bit float type, restore the dtype afterwards."""

    def __init__(self, name: str, dtype: np.dtype) -> None:
        self.name = name
        self.dtype = np.dtype(dtype)

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype.kind == "f" and dtype.itemsize > 2:
            return self.dtype
        return dtype

    def compress(self, array: np.ndarray) -> tuple[np.ndarray, np.dtype | None]:
        wire = self.wire_dtype(array.dtype)
        if wire == array.dtype:
            return array, None
        return array.astype(wire), array.dtype

    def decompress(self, array: np.ndarray, ctx: np.dtype | None) -> np.ndarray:
        return array if ctx is None else array.astype(ctx)


class Compression:
    """The available compressors (``Compression.none``, ``.fp16``, ``.bf16``)."""

    none: Compressor = NoneCompressor()
    fp16: Compressor = HalfCompressor("fp16", FLOAT16)
    bf16: Compressor = HalfCompressor("bf16", BFLOAT16)

    @classmethod
    def get(cls, value: Compressor | str | None) -> Compressor:
        """Resolve a compressor or its name (``None`` means ``none``).

        Raises:
            ConfigError: Unknown name or object.
        """
        if value is None:
            return cls.none
        if isinstance(value, Compressor):
            return value
        if isinstance(value, str) and value.lower() in ("none", "fp16", "bf16"):
            return getattr(cls, value.lower())
        raise ConfigError(
            f"Unknown compression {value!r}. Received compression={value!r}; use "
            "ddl_tf.Compression.none, .fp16 or .bf16 (or the names 'none', 'fp16', 'bf16')."
        )
