"""float16/bfloat16 <-> float32 conversions for host-side reductions, compiled when possible.

ddl_tf sums 16-bit floats in float32 (each partial sum is rounded once to
half precision), so every half-precision reduction, every ``fp16``/``bf16``
compressed pack and every average of a half tensor converts whole buffers.
numpy converts float16 one element at a time; the optional C extension
``ddl_tf.core.numerics.halfkernels`` (built by ``pip install`` when a C compiler is
present) converts with the CPU's F16C instructions (float16) or vectorized
integer arithmetic (bfloat16). Results are identical either way (round to
nearest even; tests compare the two bit for bit); only the speed differs.
:data:`COMPILED` says which one runs.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.numerics.halfconv import to_float32, from_float32
    >>> h = np.array([1.5, -2.0, 1024.0], np.float16)
    >>> to_float32(h)
    array([   1.5,   -2. , 1024. ], dtype=float32)
    >>> out = np.empty(3, np.float16)
    >>> from_float32(np.array([1.0, 1e6, 0.1], np.float32), out)
    array([1. , inf, 0.1], dtype=float16)
"""

from __future__ import annotations

import importlib
from types import ModuleType

import ml_dtypes
import numpy as np

try:  # a C extension: imported by name, as it has no Python source to type-check
    _kernels: ModuleType | None = importlib.import_module("ddl_tf.core.numerics.halfkernels")
except ImportError:  # built without a C compiler: numpy does the conversions
    _kernels = None

__all__ = ["to_float32", "from_float32", "cast_into", "sum_into", "COMPILED"]

_KINDS = {np.dtype(np.float16): 0, np.dtype(ml_dtypes.bfloat16): 1}
_F32 = np.dtype(np.float32)

#: Which 16-bit kinds convert in compiled code here (empty: numpy only).
COMPILED: tuple[str, ...] = (
    () if _kernels is None else (("float16",) if _kernels.has_f16c() else ()) + ("bfloat16",)
)


def _compiled(kernel: str, kind: int | None, src: np.ndarray, out: np.ndarray) -> bool:
    """Run the compiled ``kernel`` on C-contiguous ``src`` and ``out``; False when it cannot."""
    if _kernels is None or kind is None or not (src.flags.c_contiguous and out.flags.c_contiguous):
        return False
    return getattr(_kernels, kernel)(kind, src.reshape(-1), out.reshape(-1))


def to_float32(src: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``src`` (float16 or bfloat16) converted to float32.

    Args:
        src: The 16-bit array (any other dtype is converted by numpy).
        out: A float32 array of ``src``'s shape to write into; None allocates.

    Returns:
        ``out`` or the new float32 array.
    """
    if out is None:
        out = np.empty(src.shape, _F32)
    if out.dtype != _F32 or not _compiled("to_float32", _KINDS.get(src.dtype), src, out):
        out[...] = src
    return out


def from_float32(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Round float32 ``src`` into the 16-bit array ``out`` (nearest, ties to even).

    Args:
        src: The float32 values (another dtype is converted by numpy).
        out: A float16 or bfloat16 array of ``src``'s shape.

    Returns:
        ``out``.
    """
    if src.dtype != _F32 or not _compiled("from_float32", _KINDS.get(out.dtype), src, out):
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are the right results
            out[...] = src
    return out


def cast_into(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = src`` with numpy's rounding, compiled for float32 <-> 16-bit floats.

    Args:
        src: The values.
        out: The destination, of ``src``'s size (any shape with as many elements).

    Returns:
        ``out``.
    """
    if src.dtype == _F32 and out.dtype in _KINDS:
        return from_float32(src.reshape(out.shape), out)
    if out.dtype == _F32 and src.dtype in _KINDS:
        return to_float32(src.reshape(out.shape), out)
    out[...] = src.reshape(out.shape)
    return out


def sum_into(src: np.ndarray, inout: np.ndarray) -> bool:
    """``inout = inout + src`` for 16-bit floats, in float32, rounded once, in one compiled pass.

    Args:
        src: The values to add (float16 or bfloat16, C-contiguous).
        inout: Same dtype and size, updated in place.

    Returns:
        Whether it was done; False (nothing changed) when the dtype, the layout
        or the machine needs the numpy path (:func:`to_float32`, add,
        :func:`from_float32`), which gives the same bits.
    """
    return src.dtype == inout.dtype and _compiled("sum_into", _KINDS.get(inout.dtype), src, inout)
