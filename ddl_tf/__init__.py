"""ddl_tf: topology-aware distributed training for TensorFlow, Horovod-compatible.

``import ddl_tf as hvd`` (or ``import ddl_tf.keras as hvd`` for Keras) gives
the Horovod API over MPI, with an allreduce that reduce-scatters inside a
node, allreduces across nodes and allgathers inside the node again.
Importing ddl_tf does not initialize MPI; :func:`init` does.

Layers (each its own module; the core knows nothing of TensorFlow):
:mod:`ddl_tf.core` (topology, algorithms, fusion, compression, negotiation,
timeline, engine on numpy arrays) -> :mod:`ddl_tf.bridge` (tensors, eager and
in graphs, in program order) -> :mod:`ddl_tf.collectives`,
:mod:`ddl_tf.functions`, :mod:`ddl_tf.tape` (Horovod's TensorFlow API) ->
:mod:`ddl_tf.keras` (DistributedOptimizer, callbacks) -> :mod:`ddl_tf.launch`
(``ddlrun``).

Logging goes through ``logging.getLogger("ddl_tf...")``.
"""

from importlib import metadata as _metadata

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "ddl_tf needs TensorFlow 2.21, which could not be imported "
        f"({_err}). Install the extra for your machine: "
        "pip install 'tflms-ddl[cpu]' (CPU only) or 'tflms-ddl[gpu]' (NVIDIA GPU); "
        "add the 'mpi' extra if the machine has no MPI of its own."
    ) from _err

from ddl_tf import errors
from ddl_tf.basics import (
    ccl_built,
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
from ddl_tf.collectives import (
    ProcessSet,
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    global_process_set,
    grouped_allreduce,
    reducescatter,
)
from ddl_tf.core.compression import Compression
from ddl_tf.core.reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ddl_tf.functions import allgather_object, broadcast_object, broadcast_variables
from ddl_tf.tape import DistributedGradientTape, PartialDistributedGradientTape

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"


def DistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 - Horovod's name
    """Wrap a Keras 3 optimizer; see :class:`ddl_tf.keras.DistributedOptimizer`."""
    from ddl_tf.keras.optimizer import DistributedOptimizer as _DistributedOptimizer

    return _DistributedOptimizer(optimizer, *args, **kwargs)


__all__ = [
    "__version__",
    "errors",
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
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "alltoall",
    "barrier",
    "broadcast_variables",
    "broadcast_object",
    "allgather_object",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "Compression",
    "ReduceOp",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "ProcessSet",
    "global_process_set",
]
