"""The names of Horovod's API that ddl_tf exports, grouped by the module that defines them.

One source for ``ddl_tf.__all__`` (and its lazy loader), ``ddl_tf.basics.__all__``
and ``ddl_tf.keras.__all__``. Importing this module imports nothing else. Every
Horovod 0.28.1 ``horovod.tensorflow`` name and its status in ddl_tf is listed in
``docs/migrating-from-horovod.md``.
"""

BASICS = (
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "start_timeline",
    "stop_timeline",
    "collective_stats",
)
"""Defined in :mod:`ddl_tf.basics`: initialization, rank queries, build flags, timeline."""

COLLECTIVES = ("allreduce", "grouped_allreduce", "barrier")
"""Defined in :mod:`ddl_tf.collectives`."""

EXCHANGE = ("allgather", "grouped_allgather", "alltoall")
"""Defined in :mod:`ddl_tf.exchange`."""

SCATTER = ("reducescatter", "grouped_reducescatter")
"""Defined in :mod:`ddl_tf.scatter`."""

BROADCASTS = (
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
)
"""Defined in :mod:`ddl_tf.broadcasts`."""

PROCESS_SETS = ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set")
"""Defined in :mod:`ddl_tf.process_sets`."""

RANK_OPS = ("rank_op", "local_rank_op", "size_op", "local_size_op", "process_set_included_op")
"""Defined in :mod:`ddl_tf.rank_ops`."""

FUNCTIONS = ("broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object")
"""Defined in :mod:`ddl_tf.functions`."""

TAPES = ("DistributedGradientTape", "PartialDistributedGradientTape")
"""Defined in :mod:`ddl_tf.tape`."""

REDUCE_OPS = ("ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum")
"""Defined in :mod:`ddl_tf.core.reduce_ops`."""
