"""mpi4py, loaded late, and the numpy-dtype to MPI-datatype tables.

``import ddl_tf`` must not initialize MPI (``from mpi4py import MPI`` does),
so this module imports ``mpi4py.MPI`` only inside :func:`load`, which
``ddl_tf.init()`` calls. :func:`dtype_info` tells the algorithms, for one
numpy dtype, which MPI datatype moves it, which MPI datatype and operations
reduce it, and in which dtype local sums accumulate (float32 for the 16-bit
floats, so partial sums are never rounded to half precision inside a rank).

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.numerics.mpi import accumulation_dtype, reduce_into
    >>> from ddl_tf.core.numerics.reduce_ops import ReduceOp
    >>> accumulation_dtype(np.float16)
    dtype('float32')
    >>> a = np.array([1, 5], np.int32)
    >>> reduce_into(a, np.array([3, 2], np.int32), ReduceOp.MAX); a
    array([3, 5], dtype=int32)
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ddl_tf import env
from ddl_tf.core.numerics.halfconv import from_float32, sum_into, to_float32
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.errors import ConfigError

__all__ = [
    "load",
    "is_loaded",
    "DtypeInfo",
    "dtype_info",
    "accumulation_dtype",
    "reduce_into",
    "reduce_rows",
    "check_reducible",
    "SUPPORTED_DTYPES",
]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
HALF_DTYPES = (np.dtype(np.float16), BFLOAT16)
SUPPORTED_DTYPES = tuple(
    np.dtype(d)
    for d in (
        np.float16,
        ml_dtypes.bfloat16,
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.complex64,
        np.complex128,
        np.bool_,
    )
)

# Open MPI 5.0's AVX reduction kernels saturate 8- and 16-bit integer sums (for vectors of
# 64+ elements) instead of wrapping like numpy, TensorFlow and the scalar path do; sums of
# these dtypes therefore use a numpy operation.
_SATURATING = tuple(np.dtype(d) for d in (np.int8, np.uint8, np.int16, np.uint16))

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def load() -> Any:
    """Import (and thereby initialize) ``mpi4py.MPI`` with thread support, once.

    Collectives issued from TensorFlow graphs run on TensorFlow's threads, so
    ddl_tf asks for ``MPI_THREAD_MULTIPLE`` (it serializes its own calls with a
    lock, so ``MPI_THREAD_SERIALIZED`` would do).

    In an elastic job MPI is never finalized: ``MPI_Finalize`` after a
    membership change can wait forever for a rank that left (seen here in one
    run in a few), while a rank that ends after ddl_tf's collective shutdown
    needs nothing more from MPI; mpirun then reports each rank's own exit
    status.
    """
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        if env.elastic_job():
            mpi4py.rc.finalize = False
    from mpi4py import MPI

    return MPI


def is_loaded() -> bool:
    """Whether ``mpi4py.MPI`` has been imported (and MPI therefore initialized)."""
    return "mpi4py.MPI" in sys.modules


def is_process_failure(err: BaseException) -> bool:
    """Whether ``err`` is MPI reporting a failed peer or a revoked communicator (ULFM).

    ``MPI_ERR_IN_STATUS`` (a request of ``Testsome``/``Waitall`` failed) counts
    too: ddl_tf's requests fail only when a peer does.
    """
    MPI = load() if is_loaded() else None
    if MPI is None or not isinstance(err, MPI.Exception):
        return False
    names = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_IN_STATUS")
    classes = {getattr(MPI, n, None) for n in names} - {None}
    return err.Get_error_class() in classes


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype local reductions run in: float32 for 16-bit floats, else ``dtype``.

    Args:
        dtype: The dtype of the reduced tensors.

    Returns:
        ``float32`` for float16 and bfloat16, else ``dtype``.
    """
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in HALF_DTYPES else dtype


def check_reducible(dtype: np.dtype, op: ReduceOp) -> None:
    """Raise :class:`ConfigError` unless ``op`` is defined for ``dtype``.

    Average of integers is defined as Horovod defines it: the sum times
    ``1 / size`` in float64, truncated toward zero (see :mod:`ddl_tf.core.numerics.scaling`).

    Args:
        dtype: Numpy dtype of the tensor.
        op: The reduction (``AVERAGE`` included).
    """
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(
            f"ddl_tf cannot reduce tensors of dtype {dtype}. Received dtype={dtype}; "
            "use float16, bfloat16, float32, float64 or an integer type."
        )
    if dtype == np.bool_:
        raise ConfigError(
            f"Boolean tensors cannot be reduced. Received dtype=bool, op={op.name}; "
            "cast to int32 first (e.g. tf.cast(x, tf.int32))."
        )
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dtype.kind == "c":
        raise ConfigError(
            f"Min and Max are not defined for complex numbers. Received dtype={dtype}, "
            f"op={op.name}; reduce the real and imaginary parts separately."
        )


def reduce_into(dst: np.ndarray, src: np.ndarray, op: ReduceOp) -> None:
    """``dst = dst (op) src`` elementwise, accumulating 16-bit floats in float32.

    Args:
        dst: Destination array, updated in place.
        src: Array of the same shape combined into it.
        op: SUM, MIN, MAX or PRODUCT (averaging happens elsewhere).
    """
    ufunc = _UFUNCS[op]
    if dst.dtype in HALF_DTYPES:
        if op is ReduceOp.SUM and sum_into(src, dst):
            return
        work = to_float32(dst)
        with np.errstate(over="ignore"):  # overflow to inf is the right half-precision result
            ufunc(work, to_float32(src), out=work)
        from_float32(work, dst)
    else:
        ufunc(dst, src, out=dst)


def reduce_rows(rows: np.ndarray, op: ReduceOp, out: np.ndarray) -> None:
    """Reduce a ``(P, n)`` array over its first axis into ``out`` (length ``n``).

    All ``P`` rows are combined in the accumulation dtype before the single
    rounding to ``out.dtype``: this is where "transfer in half precision, sum in
    float32" holds exactly (alltoall-sum-allgather).

    Args:
        rows: ``(P, n)`` array, one row per rank.
        op: SUM, MIN, MAX or PRODUCT (averaging happens elsewhere).
        out: Length-``n`` array receiving the result (rounded once to its
            dtype).
    """
    ufunc = _UFUNCS[op]
    work = to_float32(rows) if rows.dtype in HALF_DTYPES else rows
    with np.errstate(over="ignore"):
        result = ufunc.reduce(work, axis=0)
    if out.dtype in HALF_DTYPES:
        from_float32(result, out)
    else:
        out[...] = result


@dataclass(frozen=True)
class DtypeInfo:
    """How one numpy dtype travels through MPI.

    Attributes:
        dtype: The numpy dtype.
        move_type: MPI datatype used by data-movement calls (send, gather).
        reduce_type: MPI datatype used by reductions (may differ for halves).
        ops: MPI operation per :class:`ReduceOp` (built-in or user-defined).
        custom_op: Whether ``ops`` are Python callbacks (MPI cannot reduce the dtype).
    """

    dtype: np.dtype
    move_type: Any
    reduce_type: Any
    ops: dict
    custom_op: bool = False


@functools.cache
def dtype_info(dtype: np.dtype) -> DtypeInfo:
    """MPI datatypes and operations for ``dtype`` (needs :func:`load` to have run).

    Args:
        dtype: The numpy dtype of the tensors to move.

    Returns:
        The MPI datatypes to move and reduce ``dtype`` with, and one MPI
        operation per reduction (a user-defined one for 16-bit floats, which
        sum in float32).

    Raises:
        ConfigError: MPI cannot move ``dtype`` (see ``SUPPORTED_DTYPES``).
    """
    MPI = load()
    dtype = np.dtype(dtype)
    builtin_ops = {
        ReduceOp.SUM: MPI.SUM,
        ReduceOp.MIN: MPI.MIN,
        ReduceOp.MAX: MPI.MAX,
        ReduceOp.PRODUCT: MPI.PROD,
    }
    native = {
        np.dtype(np.float32): MPI.FLOAT,
        np.dtype(np.float64): MPI.DOUBLE,
        np.dtype(np.int8): MPI.INT8_T,
        np.dtype(np.int16): MPI.INT16_T,
        np.dtype(np.int32): MPI.INT32_T,
        np.dtype(np.int64): MPI.INT64_T,
        np.dtype(np.uint8): MPI.UINT8_T,
        np.dtype(np.uint16): MPI.UINT16_T,
        np.dtype(np.uint32): MPI.UINT32_T,
        np.dtype(np.uint64): MPI.UINT64_T,
        np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX,
        np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
        np.dtype(np.bool_): MPI.UINT8_T,
    }
    if dtype in native:
        ops = dict(builtin_ops)
        if dtype in _SATURATING:
            ops[ReduceOp.SUM] = _numpy_op(MPI, dtype, ReduceOp.SUM)
        return DtypeInfo(dtype, native[dtype], native[dtype], ops)
    if dtype in HALF_DTYPES:
        # Our own operation even where MPI has float16 (Open MPI's MPIX_C_FLOAT16): it adds in
        # float32 by definition, and measured no slower than Open MPI 5.0's float16 kernel here.
        pair = _half_pair_type(MPI)
        ops = {op: _numpy_op(MPI, dtype, op) for op in _UFUNCS}
        return DtypeInfo(dtype, MPI.UINT16_T, pair, ops, custom_op=True)
    raise ConfigError(
        f"ddl_tf cannot move tensors of dtype {dtype} through MPI. Received dtype={dtype}; "
        f"supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}."
    )


@functools.cache
def _half_pair_type(MPI: Any) -> Any:
    return MPI.BYTE.Create_contiguous(2).Commit()


@functools.cache
def _numpy_op(MPI: Any, dtype: np.dtype, op: ReduceOp) -> Any:
    """A user-defined MPI operation computing ``op`` with numpy (float32 math for halves)."""
    ufunc = _UFUNCS[op]
    half = dtype in HALF_DTYPES

    def combine(inbuf, inoutbuf, datatype):  # called by MPI on received segments
        a = np.frombuffer(inbuf, dtype=dtype)
        b = np.frombuffer(inoutbuf, dtype=dtype)
        if not half:
            ufunc(a, b, out=b)
            return
        if op is ReduceOp.SUM and sum_into(a, b):  # a + b: addition commutes bit for bit
            return
        work = to_float32(a)
        with np.errstate(over="ignore"):
            ufunc(work, to_float32(b), out=work)
        from_float32(work, b)

    return MPI.Op.Create(combine, commute=True)
