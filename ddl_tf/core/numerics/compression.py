"""Wire compression: tiny strategy objects, as in Horovod's ``compression.py``.

``compress(array) -> (array, ctx)`` before the collective and
``decompress(array, ctx)`` after it. ``fp16`` and ``bf16`` halve the bytes on
the wire for float32/float64 tensors; the reductions themselves accumulate in
float32 (see :mod:`ddl_tf.core.algorithms.allreduce`), never in half precision. Integer
and already-half tensors pass through unchanged.

``fp16`` keeps 11 significant bits but overflows above 65504; ``bf16`` keeps
the float32 exponent range with 8 significant bits. Horovod has no ``bf16``.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.numerics.compression import Compression
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
    #: ``compress`` is exactly ``array.astype(wire_dtype(array.dtype))`` and ``decompress``
    #: the cast back; the engine then casts while packing instead of calling them.
    casts_only = False

    @abc.abstractmethod
    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype ``compress`` turns ``dtype`` into.

        Args:
            dtype: The dtype of a tensor to be reduced.

        Returns:
            The dtype sent over the wire; ``dtype`` itself when the compressor
            leaves such tensors alone.
        """

    @abc.abstractmethod
    def compress(self, array: np.ndarray) -> tuple[np.ndarray, np.dtype | None]:
        """Return the array to send and the context ``decompress`` needs.

        Args:
            array: The tensor's values (not modified).

        Returns:
            ``(wire array, ctx)``: ``ctx`` is the original dtype to restore, or
            None when nothing was converted.
        """

    @abc.abstractmethod
    def decompress(self, array: np.ndarray, ctx: np.dtype | None) -> np.ndarray:
        """Undo ``compress`` on the reduced array.

        Args:
            array: The reduced wire array.
            ctx: The context :meth:`compress` returned.

        Returns:
            The array in the original dtype (``array`` itself when ``ctx`` is None).
        """

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    name = "none"
    casts_only = True

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype unchanged (see ``Compressor``).

        Args:
            dtype: The tensor's dtype.

        Returns:
            ``np.dtype(dtype)``.
        """
        return np.dtype(dtype)

    def compress(self, array: np.ndarray) -> tuple[np.ndarray, None]:
        """Send ``array`` as it is (see ``Compressor``).

        Args:
            array: The tensor's values.

        Returns:
            ``(array, None)``.
        """
        return array, None

    def decompress(self, array: np.ndarray, ctx: np.dtype | None) -> np.ndarray:
        """Nothing to undo (see ``Compressor``).

        Args:
            array: The reduced array.
            ctx: Always None.

        Returns:
            ``array``.
        """
        return array


class HalfCompressor(Compressor):
    """Send float32/float64 tensors as a 16-bit float type, restore the dtype afterwards."""

    casts_only = True

    def __init__(self, name: str, dtype: np.dtype) -> None:
        self.name = name
        self.dtype = np.dtype(dtype)

    def wire_dtype(self, dtype: np.dtype) -> np.dtype:
        """The 16-bit type for wider floats (see ``Compressor``).

        Args:
            dtype: The tensor's dtype.

        Returns:
            This compressor's dtype for float dtypes wider than 2 bytes, else
            ``dtype`` (integers and 16-bit floats travel unchanged).
        """
        dtype = np.dtype(dtype)
        if dtype.kind == "f" and dtype.itemsize > 2:
            return self.dtype
        return dtype

    def compress(self, array: np.ndarray) -> tuple[np.ndarray, np.dtype | None]:
        """Cast wider floats to the 16-bit type (see ``Compressor``).

        Args:
            array: The tensor's values (not modified).

        Returns:
            ``(cast copy, original dtype)``, or ``(array, None)`` when the dtype
            is left alone.
        """
        wire = self.wire_dtype(array.dtype)
        if wire == array.dtype:
            return array, None
        return array.astype(wire), array.dtype

    def decompress(self, array: np.ndarray, ctx: np.dtype | None) -> np.ndarray:
        """Cast back to the original dtype (see ``Compressor``).

        Args:
            array: The reduced wire array.
            ctx: The original dtype, or None.

        Returns:
            ``array`` cast to ``ctx``, or ``array`` when ``ctx`` is None.
        """
        return array if ctx is None else array.astype(ctx)


class Compression:
    """The available compressors (``Compression.none``, ``.fp16``, ``.bf16``)."""

    none: Compressor = NoneCompressor()
    fp16: Compressor = HalfCompressor("fp16", FLOAT16)
    bf16: Compressor = HalfCompressor("bf16", BFLOAT16)

    @classmethod
    def get(cls, value: Compressor | str | None) -> Compressor:
        """Resolve a compressor or its name (``None`` means ``none``).

        Args:
            value: A :class:`Compressor`, one of the names ``"none"``, ``"fp16"``,
                ``"bf16"`` (any case), or None.

        Returns:
            The compressor (the shared instance for a name).

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
