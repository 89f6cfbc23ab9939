"""The names of Horovod's API that ddl_tf exports, grouped by the module that defines them.

One source for ``ddl_tf.__all__`` (and its lazy loader), ``ddl_tf.basics.__all__``
and ``ddl_tf.keras.__all__``. Importing this module imports nothing else.
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

COLLECTIVES = (
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "alltoall",
    "barrier",
    "ProcessSet",
    "global_process_set",
)
"""Defined in :mod:`ddl_tf.collectives`."""

FUNCTIONS = ("broadcast_variables", "broadcast_object", "allgather_object")
"""Defined in :mod:`ddl_tf.functions`."""

TAPES = ("DistributedGradientTape", "PartialDistributedGradientTape")
"""Defined in :mod:`ddl_tf.tape`."""

REDUCE_OPS = ("ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum")
"""Defined in :mod:`ddl_tf.core.reduce_ops`."""
