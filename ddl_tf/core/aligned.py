"""64-byte aligned host buffers, so TensorFlow can adopt collective results without a copy.

TensorFlow wraps a numpy array as a tensor without copying it only when the
data starts on a 64-byte boundary (``EIGEN_MAX_ALIGN_BYTES``): a
``tf.numpy_function`` output or an eager tensor made from an aligned array
shares its memory, any other is copied. numpy's own large allocations are
only 16-byte aligned, so every buffer a collective returns is allocated here
(and fused members start on aligned offsets, see :mod:`~ddl_tf.core.fusion`).

Example:
    >>> from ddl_tf.core.aligned import aligned_empty, is_aligned
    >>> buf = aligned_empty((3, 5), "float32")
    >>> buf.shape, buf.dtype.name, is_aligned(buf)
    ((3, 5), 'float32', True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["ALIGN_BYTES", "aligned_empty", "is_aligned", "align_up"]

ALIGN_BYTES = 64


def align_up(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN_BYTES`.

    Args:
        nbytes: A byte count or offset.

    Returns:
        The smallest multiple of 64 not below ``nbytes``.
    """
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def aligned_empty(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary.

    Args:
        shape: The array's shape.
        dtype: Its dtype.

    Returns:
        A writable array (a view of a slightly larger byte buffer, which it
        keeps alive).
    """
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN_BYTES, np.uint8)
    start = -raw.ctypes.data % ALIGN_BYTES
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def is_aligned(array: np.ndarray) -> bool:
    """Whether ``array``'s data starts on a 64-byte boundary.

    Args:
        array: Any numpy array.

    Returns:
        True when TensorFlow can adopt the memory without a copy (as far as
        alignment goes).
    """
    return array.ctypes.data % ALIGN_BYTES == 0
