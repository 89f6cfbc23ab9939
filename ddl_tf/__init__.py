"""ddl_tf: topology-aware distributed training for TensorFlow, Horovod-compatible.

``import ddl_tf as hvd`` (or ``import ddl_tf.keras as hvd`` for Keras) gives
the Horovod API over MPI, with an allreduce that reduce-scatters inside a
node, allreduces across nodes and allgathers inside the node again.
Importing ddl_tf does not initialize MPI; :func:`init` does.

Layers (each its own module; the core knows nothing of TensorFlow):
:mod:`ddl_tf.core` (topology, algorithms, fusion, compression, negotiation,
timeline, engine on numpy arrays) -> :mod:`ddl_tf.bridge` (tensors, eager and
in graphs, in program order; :mod:`ddl_tf.tf_errors` for TensorFlow-typed
errors) -> Horovod's TensorFlow API: :mod:`ddl_tf.collectives` (allreduce),
:mod:`ddl_tf.exchange` (allgather, alltoall), :mod:`ddl_tf.scatter`
(reducescatter), :mod:`ddl_tf.broadcasts`, :mod:`ddl_tf.functions`,
:mod:`ddl_tf.tape`, :mod:`ddl_tf.rank_ops`, :mod:`ddl_tf.elastic`,
:mod:`ddl_tf.sync_batch_norm` -> :mod:`ddl_tf.keras` (DistributedOptimizer,
callbacks). ``docs/migrating-from-horovod.md`` maps every Horovod name. Launching is apart:
:mod:`ddl_tf.launch` (hosts, the mpirun command, checks) <- :mod:`ddl_tf.cluster`
(rehearsal on virtual nodes) <- :mod:`ddl_tf.ddlrun` (the ``ddlrun`` command).

Logging goes through ``logging.getLogger("ddl_tf...")``.
"""

import importlib as _importlib
import importlib.util as _importlib_util
from importlib import metadata as _metadata

_MISSING_TF = (
    "ddl_tf needs TensorFlow 2.21, which could not be imported ({}). Install the extra for "
    "your machine: pip install 'tflms-ddl[cpu]' (CPU only) or 'tflms-ddl[gpu]' (NVIDIA GPU); "
    "add the 'mpi' extra if the machine has no MPI of its own."
)

try:
    _tf_spec = _importlib_util.find_spec("tensorflow")
except ValueError:  # a half-imported tensorflow module
    _tf_spec = None
if _tf_spec is None:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(_MISSING_TF.format("No module named 'tensorflow'"))

from ddl_tf import api_names as _names  # noqa: E402
from ddl_tf import errors  # noqa: E402

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

# The public API is loaded on first use (PEP 562), so that `import ddl_tf` stays cheap:
# ddlrun and the numpy/MPI core never import TensorFlow, and nothing here starts MPI.
_EXPORTS = {
    **dict.fromkeys(_names.BASICS, "ddl_tf.basics"),
    **dict.fromkeys(_names.COLLECTIVES, "ddl_tf.collectives"),
    **dict.fromkeys(_names.EXCHANGE, "ddl_tf.exchange"),
    **dict.fromkeys(_names.SCATTER, "ddl_tf.scatter"),
    **dict.fromkeys(_names.BROADCASTS, "ddl_tf.broadcasts"),
    **dict.fromkeys(_names.PROCESS_SETS, "ddl_tf.process_sets"),
    **dict.fromkeys(_names.RANK_OPS, "ddl_tf.rank_ops"),
    **dict.fromkeys(_names.FUNCTIONS, "ddl_tf.functions"),
    **dict.fromkeys(_names.TAPES, "ddl_tf.tape"),
    "DistributedOptimizer": "ddl_tf.keras.optimizer",
    "SyncBatchNormalization": "ddl_tf.sync_batch_norm",
    "Compression": "ddl_tf.tensor_compression",
    **dict.fromkeys(_names.REDUCE_OPS, "ddl_tf.core.reduce_ops"),
}
_SUBMODULES = {"elastic": "ddl_tf.elastic"}  # Horovod's hvd.elastic namespace


def __getattr__(name: str):
    module_name = _EXPORTS.get(name) or _SUBMODULES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ddl_tf' has no attribute {name!r}")
    try:
        module = _importlib.import_module(module_name)
    except ImportError as err:
        if "tensorflow" in str(err) or "keras" in str(err):
            raise ImportError(_MISSING_TF.format(err)) from err
        raise
    value = module if name in _SUBMODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


__all__ = ["__version__", "errors", *_EXPORTS, *_SUBMODULES]
