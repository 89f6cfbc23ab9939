"""``import ddl_tf.tensorflow as hvd``: Horovod's TensorFlow API (``horovod.tensorflow``).

The TensorFlow layer of ddl_tf: one module per collective, each an op on
``tf.Tensor``s with its gradient, eager and inside ``tf.function``, all
running on the numpy/MPI engine of :mod:`ddl_tf.core` through
:mod:`.bridge` (program order, TensorFlow-typed errors from :mod:`.tf_errors`):

=========================  =================================================
:mod:`.allreduce_ops`      allreduce, grouped_allreduce, barrier, join
:mod:`.allgather_ops`      allgather, grouped_allgather
:mod:`.alltoall_ops`       alltoall
:mod:`.reducescatter_ops`  reducescatter, grouped_reducescatter
:mod:`.broadcast_ops`      broadcast, broadcast_, broadcast_global_variables
:mod:`.functions`          broadcast_variables, broadcast_object, allgather_object
:mod:`.gradient_tape`      DistributedGradientTape
:mod:`.overlap`            gradient buckets reduced while the backward pass runs
:mod:`.rank_ops`           rank_op, size_op, ... (graph constants)
:mod:`.compression`        Compression.none / fp16 / bf16
:mod:`.sync_batch_norm`    SyncBatchNormalization
:mod:`.elastic`            Horovod's ``hvd.elastic`` (state, run, sampler)
=========================  =================================================

``ddl_tf`` itself exports the same names (``import ddl_tf as hvd``) and
the Keras layer's ``DistributedOptimizer``; the Keras API is
:mod:`ddl_tf.keras`. Names load on first use, so
importing this package imports neither TensorFlow nor MPI.

Example:
    >>> import ddl_tf.tensorflow as hvd
    >>> hvd.allreduce.__module__
    'ddl_tf.tensorflow.allreduce_ops'
"""

from ddl_tf.core import HOROVOD_BASICS
from ddl_tf.exports import lazy_exports

BASICS = HOROVOD_BASICS
"""Horovod's initialization, rank queries, build flags and timeline names (defined in
:mod:`ddl_tf.core.basics`)."""

API = {
    **dict.fromkeys(BASICS, "ddl_tf.core.basics"),
    **dict.fromkeys(
        ("allreduce", "grouped_allreduce", "barrier", "join"), "ddl_tf.tensorflow.allreduce_ops"
    ),
    **dict.fromkeys(("allgather", "grouped_allgather"), "ddl_tf.tensorflow.allgather_ops"),
    "alltoall": "ddl_tf.tensorflow.alltoall_ops",
    **dict.fromkeys(
        ("reducescatter", "grouped_reducescatter"), "ddl_tf.tensorflow.reducescatter_ops"
    ),
    **dict.fromkeys(
        (
            "broadcast",
            "broadcast_",
            "broadcast_global_variables",
            "BroadcastGlobalVariablesHook",
        ),
        "ddl_tf.tensorflow.broadcast_ops",
    ),
    **dict.fromkeys(
        ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"),
        "ddl_tf.core.process_sets",
    ),
    **dict.fromkeys(
        (
            "rank_op",
            "local_rank_op",
            "size_op",
            "local_size_op",
            "process_set_included_op",
            "gpu_available",
        ),
        "ddl_tf.tensorflow.rank_ops",
    ),
    **dict.fromkeys(
        ("broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"),
        "ddl_tf.tensorflow.functions",
    ),
    **dict.fromkeys(
        ("DistributedGradientTape", "PartialDistributedGradientTape"),
        "ddl_tf.tensorflow.gradient_tape",
    ),
    "SyncBatchNormalization": "ddl_tf.tensorflow.sync_batch_norm",
    "Compression": "ddl_tf.tensorflow.compression",
    **dict.fromkeys(
        ("ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum"),
        "ddl_tf.core.numerics.reduce_ops",
    ),
    "elastic": "ddl_tf.tensorflow.elastic",  # Horovod's hvd.elastic namespace: the module
}
"""Every Horovod ``horovod.tensorflow`` name ddl_tf defines, and the module defining it
(``docs/migrating-from-horovod.md`` lists each with its status)."""

__getattr__, __dir__, _exported = lazy_exports(__name__, API)
__all__ = ["API", "BASICS", *_exported]
