"""Data-movement collectives (no arithmetic) on numpy arrays: gather, broadcast, alltoall.

Horovod semantics: ``allgather`` concatenates along the first dimension,
which may differ per rank; ``broadcast_arrays`` sends several arrays from
the root in one fused message; ``alltoall`` sends slices of the first
dimension to each rank and returns what it received plus the received
splits. These functions assume the caller already checked that all ranks
run the same collective (see :mod:`ddl_tf.core.collectives.negotiation`); the first
dimensions and splits, which may legitimately differ, are exchanged here.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.collectives.movement import aligned_layout
    >>> aligned_layout([np.zeros(3, np.float64), np.zeros((2, 2), np.int8)])
    ([0, 64], 68)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ddl_tf.core.algorithms.steps import shard_layout
from ddl_tf.core.numerics import mpi
from ddl_tf.core.numerics.aligned import align_up, aligned_empty
from ddl_tf.core.numerics.mpi import dtype_info
from ddl_tf.errors import CollectiveArgumentError, ConfigError

__all__ = ["allgatherv", "broadcast_arrays", "alltoallv", "alltoall_problem", "aligned_layout"]

_CHUNK = 1 << 30  # keep MPI counts well inside int32


def aligned_layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """Byte offsets of ``arrays`` packed back to back at 64-byte alignment, and the total.

    With the buffer itself aligned (:func:`~ddl_tf.core.numerics.aligned.aligned_empty`),
    every array received into it can become a tensor without a copy.

    Args:
        arrays: The arrays to pack, in order.

    Returns:
        ``(offsets, total)``: each array's start in bytes (a multiple of 64)
        and the bytes the packed buffer needs.
    """
    offsets, total = [], 0
    for array in arrays:
        total = align_up(total)
        offsets.append(total)
        total += array.nbytes
    return offsets, total


def allgatherv(comm: Any, array: np.ndarray) -> np.ndarray:
    """Concatenate every rank's ``array`` along the first dimension (which may differ).

    Args:
        comm: The mpi4py communicator.
        array: This rank's contribution; its trailing dimensions and dtype must
            match on every rank.

    Returns:
        A new array: the ranks' arrays stacked in rank order.

    Raises:
        CollectiveArgumentError: ``array`` is a scalar.
    """
    if array.ndim == 0:
        raise CollectiveArgumentError(
            "allgather needs a tensor with at least one dimension. Received a scalar; "
            "reshape it to [1] first (e.g. tf.reshape(x, [1]))."
        )
    array = np.ascontiguousarray(array)
    dims = np.empty(comm.size, np.int64)
    comm.Allgather(np.array([array.shape[0]], np.int64), dims)
    row = int(np.prod(array.shape[1:], dtype=np.int64))
    counts = tuple(int(d) * row for d in dims)
    displs = tuple(int(x) for x in np.concatenate(([0], np.cumsum(counts[:-1]))))
    out = aligned_empty((int(dims.sum()), *array.shape[1:]), array.dtype)
    move = dtype_info(array.dtype).move_type
    comm.Allgatherv([array, move], [out, (counts, displs), move])
    return out


def broadcast_arrays(comm: Any, arrays: Sequence[np.ndarray], root: int) -> list[np.ndarray]:
    """Every rank gets the root's ``arrays`` (same shapes and dtypes on all ranks), in one message.

    Args:
        comm: The mpi4py communicator.
        arrays: The arrays; only the root's values matter, but every rank
            passes arrays of the same shapes and dtypes.
        root: Rank whose values everyone receives.

    Returns:
        New arrays holding the root's values (copies with a single rank).

    Raises:
        ConfigError: ``root`` is not a rank of ``comm``.
    """
    if not 0 <= root < comm.size:
        raise ConfigError(
            f"root_rank must be a rank of the job (0..{comm.size - 1}). Received "
            f"root_rank={root}; broadcast from rank 0 if unsure."
        )
    arrays = [np.asarray(a) for a in arrays]
    if comm.size == 1:
        return [a.copy() for a in arrays]
    offsets, total = aligned_layout(arrays)
    buf = aligned_empty(total, np.uint8)
    if comm.rank == root:
        for array, offset in zip(arrays, offsets, strict=True):
            buf[offset : offset + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).ravel()
    byte = mpi.load().BYTE
    for start in range(0, total, _CHUNK):
        comm.Bcast([buf[start : start + _CHUNK], byte], root=root)
    return [
        buf[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
        for array, offset in zip(arrays, offsets, strict=True)
    ]


def alltoallv(
    comm: Any, array: np.ndarray, splits: Sequence[int] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Send ``array[rows of split j]`` to rank ``j``; return received rows and received splits.

    Args:
        comm: Communicator.
        array: At least one dimension; rows are slices of the first.
        splits: Rows for each rank (summing to ``array.shape[0]``); None splits
            as evenly as possible, the first ranks getting one more row.

    Returns:
        ``(received rows, received splits)``: the rows from every rank
        concatenated in rank order, and how many came from each rank.

    Raises:
        CollectiveArgumentError: Bad splits or a scalar (see :func:`alltoall_problem`).
    """
    problem = alltoall_problem(array, splits, comm.size)
    if problem is not None:
        raise CollectiveArgumentError(problem)
    rows = array.shape[0]
    if splits is None:
        send_rows = np.array(shard_layout(rows, comm.size)[0], np.int64)
    else:
        send_rows = np.asarray(splits, np.int64).reshape(-1)
    recv_rows = np.empty(comm.size, np.int64)
    comm.Alltoall(send_rows, recv_rows)
    row = int(np.prod(array.shape[1:], dtype=np.int64))
    send_counts = tuple(int(x) * row for x in send_rows)
    recv_counts = tuple(int(x) * row for x in recv_rows)
    send_displs = tuple(int(x) for x in np.concatenate(([0], np.cumsum(send_counts[:-1]))))
    recv_displs = tuple(int(x) for x in np.concatenate(([0], np.cumsum(recv_counts[:-1]))))
    out = aligned_empty((int(recv_rows.sum()), *array.shape[1:]), array.dtype)
    move = dtype_info(array.dtype).move_type
    comm.Alltoallv(
        [np.ascontiguousarray(array), (send_counts, send_displs), move],
        [out, (recv_counts, recv_displs), move],
    )
    return out, recv_rows.astype(np.int32)


def alltoall_problem(
    array: np.ndarray, splits: Sequence[int] | None, size: int, *, even: bool = False
) -> str | None:
    """What is wrong with an alltoall's local arguments (None: nothing).

    Args:
        array: The rows to send.
        splits: Rows per rank, or None.
        size: Number of ranks.
        even: Without ``splits``, the first dimension must be a multiple of ``size``.

    Returns:
        The error message for a scalar, bad splits, or (with ``even``) a
        first dimension not divisible by ``size``; None when all is well.

    Example:
        >>> import numpy as np
        >>> alltoall_problem(np.zeros((5, 2)), [2, 2], 2)
        'alltoall splits must give one non-negative row count per rank (2) summing to the first dimension (5). Received splits=[2, 2].'
    """
    if array.ndim == 0:
        return (
            "alltoall sends slices of the first dimension, so it needs a tensor with at least "
            "one dimension. Received a scalar; reshape it to [1] first."
        )
    rows = array.shape[0]
    if splits is None:
        if even and rows % size:
            return (
                "alltoall without splits sends the first dimension in equal parts, so it must be "
                f"a multiple of the number of ranks ({size}). Received a first dimension of "
                f"{rows}; pass splits=[rows for each rank] for uneven parts."
            )
        return None
    send_rows = np.asarray(splits, np.int64).reshape(-1)
    if send_rows.size != size or send_rows.sum() != rows or (send_rows < 0).any():
        return (
            f"alltoall splits must give one non-negative row count per rank ({size}) summing "
            f"to the first dimension ({rows}). Received splits={send_rows.tolist()}."
        )
    return None
