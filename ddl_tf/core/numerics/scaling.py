"""Pre- and post-scaling of reduced arrays, with Horovod's arithmetic for every dtype.

Horovod scales on the CPU in these precisions, and ddl_tf does the same so
that results match bit for bit:

* integers: ``float64`` math, then a cast back that truncates toward zero
  (so ``Average`` of integers is the truncated mean, as in Horovod);
* ``float16`` and ``bfloat16``: ``float32`` math, the factor rounded to
  ``float32`` first;
* ``float32``: the factor rounded to ``float32``, ``float32`` math;
* ``float64`` and complex types: their own precision.

``Average`` is a sum followed by one multiplication by ``postscale / size``
(Horovod folds the division into the post-scale factor), not a multiplication
and then a division.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.numerics.scaling import scale
    >>> scale(np.array([3, -3, 7], np.int32), 0.5)
    array([ 1, -1,  3], dtype=int32)
    >>> scale(np.array([1.0, 3.0], np.float16), 0.5).dtype
    dtype('float16')
"""

from __future__ import annotations

import numpy as np

from ddl_tf.core.numerics.halfconv import from_float32, to_float32
from ddl_tf.core.numerics.mpi import accumulation_dtype
from ddl_tf.errors import ConfigError

__all__ = ["scale", "postscale_factor"]


def postscale_factor(postscale: float, average: bool, size: int) -> float:
    """The one factor applied after the reduction: ``postscale / size`` for Average.

    Args:
        postscale: The user's postscale factor.
        average: Whether the reduction is Average (a sum divided by the size).
        size: Number of ranks in the process set.

    Returns:
        The factor as a float.
    """
    return float(postscale) / size if average else float(postscale)


def scale(array: np.ndarray, factor: float, *, out: np.ndarray | None = None) -> np.ndarray:
    """``array * factor`` in Horovod's precision for ``array``'s dtype.

    Args:
        array: Array to scale.
        factor: Multiplier.
        out: Where to write the result (``array`` itself scales in place);
            None returns a new array.

    Returns:
        ``out``, or a new array of ``array``'s dtype and shape (``array``
        itself when ``factor == 1`` and no ``out`` is given).

    Raises:
        ConfigError: ``array`` is boolean (there is nothing to scale).
    """
    if factor == 1.0:
        if out is None or out is array:
            return array
        out[...] = array
        return out
    dtype = array.dtype
    if dtype == np.bool_:
        raise ConfigError(
            f"Boolean tensors cannot be scaled. Received dtype=bool, factor={factor}; "
            "cast to a numeric type first or leave prescale_factor/postscale_factor at 1.0."
        )
    if dtype.kind in "iu":
        with np.errstate(invalid="ignore", over="ignore"):
            result = (array.astype(np.float64) * np.float64(factor)).astype(dtype)
    else:
        work_dtype = accumulation_dtype(dtype)
        if work_dtype == dtype:  # one multiplication in the array's own precision
            return np.multiply(array, dtype.type(factor), out=out)
        work = to_float32(array)  # 16-bit floats: float32 math, rounded once
        work *= work_dtype.type(factor)
        return from_float32(work, np.empty_like(array) if out is None else out)
    if out is None:
        return result
    out[...] = result
    return out
