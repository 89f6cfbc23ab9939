"""Horovod's rank and size *ops*: values read when the graph runs, not when it is built
(and Horovod's ``gpu_available``).

``rank_op()`` and friends return int32 scalars. Eagerly they are constants;
in a graph each is a small stateless-looking Python op (``tf.numpy_function``,
marked stateful so it is not folded) that asks the running job, so a graph
built in one process layout and run in another reports the layout it runs in,
as Horovod's do. They are not collectives and are not ordered with them.

Example (one process):
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> int(hvd.rank_op()), int(hvd.size_op()), int(hvd.process_set_included_op())
    (0, 1, 1)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.core.process_sets import by_id

__all__ = [
    "rank_op",
    "local_rank_op",
    "size_op",
    "local_size_op",
    "process_set_included_op",
    "gpu_available",
]


def _runtime_int(read: Callable[[], int], name: str) -> tf.Tensor:
    if tf.executing_eagerly():
        return tf.constant(read(), tf.int32)
    value = tf.numpy_function(lambda: np.int32(read()), [], tf.int32, stateful=True, name=name)
    value.set_shape([])
    return value


def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank, read when the op runs.

    Args:
        name: Op name; None for ``"DDLRank"``.

    Returns:
        A scalar int32 tensor.
    """
    return _runtime_int(basics.rank, name or "DDLRank")


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its node, read when the op runs.

    Args:
        name: Op name; None for ``"DDLLocalRank"``.

    Returns:
        A scalar int32 tensor.
    """
    return _runtime_int(basics.local_rank, name or "DDLLocalRank")


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """Number of ranks, read when the op runs.

    Args:
        process_set_id: The process set's id (0: the whole job).
        name: Op name; None for ``"DDLSize"``.

    Returns:
        A scalar int32 tensor.

    Raises:
        ConfigError: No registered process set has that id.
    """
    return _runtime_int(by_id(process_set_id).size, name or "DDLSize")


def local_size_op(name: str | None = None) -> tf.Tensor:
    """Number of ranks on this node, read when the op runs.

    Args:
        name: Op name; None for ``"DDLLocalSize"``.

    Returns:
        A scalar int32 tensor.
    """
    return _runtime_int(basics.local_size, name or "DDLLocalSize")


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this process belongs to the process set, else 0 (read when the op runs).

    Args:
        process_set_id: The process set's id (0: the whole job).
        name: Op name; None for ``"DDLProcessSetIncluded"``.

    Returns:
        A scalar int32 tensor.

    Raises:
        ConfigError: No registered process set has that id.
    """
    process_set = by_id(process_set_id)
    return _runtime_int(lambda: int(process_set.included()), name or "DDLProcessSetIncluded")


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Horovod's ``gpu_available``: whether the framework named sees a GPU.

    ddl_tf has a TensorFlow extension only: ``"tensorflow"`` asks TensorFlow
    (``tf.config.list_physical_devices("GPU")``); any other name is False, as
    Horovod answers for a framework it was not built for. ``verbose`` is
    accepted. ddl_tf's collectives go through host memory either way
    (``nccl_built()`` and ``cuda_built()`` are False).
    """
    if ext_base_name != "tensorflow":
        return False
    return bool(tf.config.list_physical_devices("GPU"))
