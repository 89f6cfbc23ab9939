"""``ddl_tf.Compression``: Horovod's compressors, for ``tf.Tensor``s as well as numpy arrays.

Horovod's ``Compression.fp16.compress(tensor)`` takes and returns
``tf.Tensor``s (users call it themselves, e.g. around their own
collectives). The engine's compressors (:mod:`ddl_tf.core.numerics.compression`) work
on numpy arrays and know nothing of TensorFlow; the classes here extend them
so that the same objects accept both: a ``tf.Tensor`` (or ``tf.Variable``)
is cast with ``tf.cast``, anything else goes to the numpy implementation.
Passing them as ``compression=`` to a collective compresses on the wire, as
before.

Example:
    >>> import tensorflow as tf
    >>> from ddl_tf.tensorflow.compression import Compression
    >>> wire, ctx = Compression.fp16.compress(tf.ones([2], tf.float32))
    >>> wire.dtype, Compression.fp16.decompress(wire, ctx).dtype
    (tf.float16, tf.float32)
    >>> Compression.fp16.compress(tf.ones([2], tf.int32))[0].dtype
    tf.int32
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ddl_tf.core.numerics import compression as core

__all__ = ["Compression", "TensorNoneCompressor", "TensorHalfCompressor"]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) or tf.is_tensor(value)


class TensorNoneCompressor(core.NoneCompressor):
    """Send tensors as they are (``tf.Tensor`` or numpy)."""

    def compress(self, array):
        """Send ``array`` as it is (see ``Compressor``).

        Args:
            array: A ``tf.Tensor``/``tf.Variable`` or a numpy array.

        Returns:
            ``(tensor or array, None)``.
        """
        if _is_tensor(array):
            return tf.convert_to_tensor(array), None
        return super().compress(array)


class TensorHalfCompressor(core.HalfCompressor):
    """Cast floating tensors wider than 16 bits to a 16-bit float; restore the dtype after."""

    def compress(self, array):
        """Cast wider floats to the 16-bit type (see ``Compressor``).

        Args:
            array: A ``tf.Tensor``/``tf.Variable`` or a numpy array.

        Returns:
            ``(cast tensor, original tf.DType)`` for float dtypes wider than 16
            bits, else ``(array, None)``; numpy arrays as in the core compressor.
        """
        if not _is_tensor(array):
            return super().compress(array)
        tensor = tf.convert_to_tensor(array)
        wire = np.dtype(self.wire_dtype(tensor.dtype.as_numpy_dtype))
        if wire == np.dtype(tensor.dtype.as_numpy_dtype):
            return tensor, None
        return tf.cast(tensor, tf.as_dtype(wire)), tensor.dtype

    def decompress(self, array, ctx):
        """Cast back to the original dtype (see ``Compressor``).

        Args:
            array: The reduced tensor or numpy array.
            ctx: The original dtype from :meth:`compress`, or None.

        Returns:
            ``array`` cast to ``ctx``, or ``array`` when ``ctx`` is None.
        """
        if not _is_tensor(array):
            return super().decompress(array, ctx)
        return array if ctx is None else tf.cast(array, tf.as_dtype(ctx))


class Compression(core.Compression):
    """The available compressors: ``none``, ``fp16`` (as Horovod) and ``bf16`` (ddl_tf only)."""

    none: core.Compressor = TensorNoneCompressor()
    fp16: core.Compressor = TensorHalfCompressor("fp16", core.FLOAT16)
    bf16: core.Compressor = TensorHalfCompressor("bf16", core.BFLOAT16)
