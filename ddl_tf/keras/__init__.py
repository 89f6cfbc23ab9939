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
resume from with ``hvd.broadcast(epoch, 0)``. :func:`load_model` gives back
the saved optimizer with all its state (also for models whose ``compile`` is
their own, such as KerasHub's, which ``keras.models.load_model`` leaves with
their default optimizer) and the random-generator state that
:func:`keep_random_state` had the checkpoint keep, so a resumed run equals the
uninterrupted one (see ``docs/reliability.md``).

Example (one process):
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> int(hvd.allreduce(3.0, op=hvd.Sum)), hvd.size()
    (3, 1)
    >>> hvd.shutdown()
"""

from __future__ import annotations

import logging
import warnings
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
from ddl_tf.keras.random_state import assign_random_state, keep_random_state, random_state_variables
from ddl_tf.keras.restore import (
    KERAS_WARNINGS_RESOLVED,
    optimizer_problem,
    restore_optimizer,
    saved_training,
)
from ddl_tf.keras.sharding import ShardedOptimizer
from ddl_tf.tensorflow import BASICS, allgather_ops, allreduce_ops, broadcast_ops, reducescatter_ops
from ddl_tf.tensorflow.allreduce_ops import barrier
from ddl_tf.tensorflow.broadcast_ops import broadcast_global_variables
from ddl_tf.tensorflow.compression import Compression
from ddl_tf.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables
from ddl_tf.tensorflow.gradient_tape import DistributedGradientTape

logger = logging.getLogger(__name__)

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
    "keep_random_state",
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
    """Load a Keras model with everything its file saved of the training, optimizer wrapped.

    A model saved with a ``DistributedOptimizer`` comes back with it, and
    with its state; one saved with a plain optimizer gets it wrapped here,
    with the loaded state. When the model class defines its own ``compile``
    (KerasHub's tasks do, and compile with a default optimizer when built),
    Keras does not restore the saved optimizer: the file's is restored here
    (the class's ``compile`` called with the saved arguments, then the
    optimizer's variables loaded, iterations included), or, where that cannot
    work, :class:`~ddl_tf.errors.RestoreError` names the route that does; the
    wrong optimizer is never kept. The random generators' state is restored
    when the file holds it (see :func:`keep_random_state`), and later saves
    of the model keep it.

    Args:
        filepath: A ``.keras`` file.
        custom_optimizers: Optimizer classes the file may reference.
        custom_objects: Passed to ``keras.models.load_model``.
        compression: Compression for a newly wrapped optimizer.
        legacy_opts: Horovod's switch for Keras 2 ``optimizers.legacy`` models;
            Keras 3 has no legacy optimizers, so only False is accepted.
        **kwargs: Passed to ``keras.models.load_model``. With ``compile=False``
            the optimizer is left as Keras returns it (not restored, not wrapped).

    Returns:
        The model.

    Raises:
        ConfigError: ``legacy_opts=True``.
        RestoreError: The saved optimizer cannot be restored into this model
            class, or the file's random state is another model's.
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
    compile_ = kwargs.get("compile", True)
    saved = saved_training(filepath)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    problem = optimizer_problem(model, saved, objects) if compile_ and saved is not None else None
    if problem is not None:
        assert saved is not None
        restore_optimizer(model, saved, problem, objects)
    for warning in caught:  # Keras's own, but not those about a state restored above
        text = str(warning.message)
        if problem is None or not any(known in text for known in KERAS_WARNINGS_RESOLVED):
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    keep_random_state(model)
    if saved is not None and saved.random_state is not None:
        assign_random_state(random_state_variables(model), saved.random_state)
    elif saved is not None and random_state_variables(model):
        logger.warning(
            "%s holds no random-generator state (it was saved before keep_random_state(model) "
            "or BroadcastGlobalVariablesCallback ran), so the model's Dropout and other random "
            "layers start from new seeds: a resumed run draws other numbers than the "
            "uninterrupted one. Checkpoints saved from now on keep the state.",
            filepath,
        )
    optimizer = getattr(model, "optimizer", None)
    if (
        compile_
        and optimizer is not None
        and not isinstance(optimizer, (DistributedOptimizer, DistributedLossScaleOptimizer))
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
    keep_random_state(model)
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
