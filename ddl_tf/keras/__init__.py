"""``import ddl_tf.keras as hvd``: Horovod's Keras API for Keras 3.

The one-line migration of a Horovod Keras script::

    import horovod.tensorflow.keras as hvd   # before
    import ddl_tf.keras as hvd               # after

Everything else (``hvd.init()``, ``hvd.DistributedOptimizer(opt)``,
``hvd.callbacks.BroadcastGlobalVariablesCallback(0)``, ``hvd.rank() == 0``
checkpointing, ``hvd.load_model``) keeps its Horovod meaning.

Checkpoints: save on rank 0 only (``if hvd.rank() == 0:
callbacks.append(keras.callbacks.ModelCheckpoint(...))``) so ranks never
write the same file; to resume, load on rank 0 with :func:`load_model` (or on
every rank from shared storage) and let ``BroadcastGlobalVariablesCallback``
hand the weights and optimizer state to the others; broadcast the epoch to
resume from with ``hvd.broadcast(epoch, 0)``.

Example (one process):
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> int(hvd.allreduce(3.0, op=hvd.Sum)), hvd.size()
    (3, 1)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from typing import Any

import keras

from ddl_tf.core.basics import (
    ccl_built,
    collective_stats,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ddl_tf.core.numerics.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from ddl_tf.core.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    member_engine,
    remove_process_set,
)
from ddl_tf.errors import ConfigError
from ddl_tf.keras import callbacks, elastic
from ddl_tf.keras.loss_scale import DistributedLossScaleOptimizer
from ddl_tf.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from ddl_tf.keras.sharding import ShardedOptimizer
from ddl_tf.tensorflow import BASICS, allgather_ops, allreduce_ops, broadcast_ops, reducescatter_ops
from ddl_tf.tensorflow.allreduce_ops import barrier
from ddl_tf.tensorflow.broadcast_ops import broadcast_global_variables
from ddl_tf.tensorflow.compression import Compression
from ddl_tf.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables
from ddl_tf.tensorflow.gradient_tape import DistributedGradientTape

__all__ = [
    *BASICS,
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "DistributedGradientTape",
    "callbacks",
    "elastic",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "broadcast_global_variables",
    "broadcast_variables",
    "broadcast_object",
    "allgather_object",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "barrier",
    "load_model",
    "save_model",
    "ShardedOptimizer",
    "Compression",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
]


def allreduce(
    value,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op=None,
    compression: Any = None,
):
    """Allreduce a tensor-compatible value (Average by default); returns a tensor.

    Args:
        value: A tensor, array or number (converted with ``keras.ops.convert_to_tensor``).
        name: Name of the collective; None for an automatic one.
        average: Horovod's deprecated switch (True: Average, False: Sum); use ``op``.
        prescale_factor: Multiplies each rank's value before the reduction.
        postscale_factor: Multiplies the result.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        compression: ``Compression.none`` (default), ``.fp16`` or ``.bf16``.

    Returns:
        The reduced tensor, same shape as ``value``.
    """
    return allreduce_ops.allreduce(
        keras.ops.convert_to_tensor(value),
        average=average,
        op=op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )


def allgather(value, name: str | None = None):
    """Concatenate every rank's value along the first dimension; returns a tensor.

    Args:
        value: A tensor, array or number of rank >= 1 (first dimensions may differ).
        name: Name of the collective; None for an automatic one.

    Returns:
        The concatenation, in rank order.
    """
    return allgather_ops.allgather(keras.ops.convert_to_tensor(value), name=name)


def broadcast(value, root_rank: int, name: str | None = None):
    """The root's value on every rank; returns a tensor.

    Args:
        value: A tensor, array or number (same shape and dtype on every rank).
        root_rank: The rank whose value everyone gets.
        name: Name of the collective; None for an automatic one.

    Returns:
        A tensor equal to ``root_rank``'s value.
    """
    return broadcast_ops.broadcast(keras.ops.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name: str | None = None, op=Average):
    """Reduce a value and keep this rank's rows of the first dimension; returns a tensor.

    Args:
        value: A tensor, array or number of rank >= 1.
        name: Name of the collective; None for an automatic one.
        op: ``Average`` (default) or ``Sum`` (``Min``, ``Max``, ``Product`` also work).

    Returns:
        This rank's slice of the reduced value along the first dimension.
    """
    return reducescatter_ops.reducescatter(keras.ops.convert_to_tensor(value), op=op, name=name)


def load_model(
    filepath,
    custom_optimizers=None,
    custom_objects=None,
    compression=None,
    legacy_opts: bool = False,
    **kwargs,
) -> keras.Model:
    """Load a Keras model and make sure its optimizer is a :class:`DistributedOptimizer`.

    A model saved with a ``DistributedOptimizer`` comes back wrapped (with its
    optimizer state); one saved with a plain optimizer gets it wrapped here,
    keeping the loaded state.

    Args:
        filepath: A ``.keras`` file.
        custom_optimizers: Optimizer classes the file may reference.
        custom_objects: Passed to ``keras.models.load_model``.
        compression: Compression for a newly wrapped optimizer.
        legacy_opts: Horovod's switch for Keras 2 ``optimizers.legacy`` models;
            Keras 3 has no legacy optimizers, so only False is accepted.
        **kwargs: Passed to ``keras.models.load_model``.

    Raises:
        ConfigError: ``legacy_opts=True``.
    """
    if legacy_opts:
        raise ConfigError(
            "Keras 3 has no keras.optimizers.legacy, so a model cannot be loaded with "
            "legacy_opts=True. Received legacy_opts=True; save the model with a Keras 3 "
            "optimizer and load it with legacy_opts=False."
        )
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not isinstance(
        optimizer, (DistributedOptimizer, DistributedLossScaleOptimizer)
    ):
        model.optimizer = DistributedOptimizer(optimizer, compression=compression)
        model.train_function = None  # rebuilt by the next fit() with the wrapped optimizer
    return model


def save_model(model: keras.Model, filepath, **kwargs) -> None:
    """Save ``model`` to ``filepath`` from rank 0; call it on every rank.

    Without sharding only rank 0 does anything (as Horovod scripts write
    ``if hvd.rank() == 0: model.save(path)``). With
    ``DistributedOptimizer(sharding=...)`` the optimizer state lives in
    shards: every rank sends its shard and rank 0 writes the state in the
    replicated layout, which loads on any number of ranks, sharded or not,
    and in one process (sharded over a ``process_set``: the set's first rank
    writes, and ranks outside the set write nothing). A ``model.save`` or ``ModelCheckpoint`` on rank 0
    alone would wait for shards the other ranks never send (the job stops
    with a collective mismatch or stall error naming the checkpoint).

    Args:
        model: A compiled Keras model.
        filepath: A ``.keras`` path (written by rank 0).
        **kwargs: Passed to ``model.save``.
    """
    optimizer = getattr(model, "optimizer", None)
    sharded = getattr(optimizer, "inner_optimizer", None)
    if not isinstance(sharded, ShardedOptimizer):
        if rank() == 0:
            model.save(filepath, **kwargs)
        return
    # the first rank of the ranks that share the state writes; a rank outside a
    # process set trains alone and writes nothing
    engine = member_engine(sharded.process_set)
    if engine is None:
        return
    if engine.rank == 0:
        model.save(filepath, **kwargs)
    else:
        sharded.gather_shards()  # the collective the writer's save makes
