"""ddl_tf: topology-aware distributed training for TensorFlow, Horovod-compatible.

``import ddl_tf as hvd`` (or ``import ddl_tf.keras as hvd`` for Keras) gives
the Horovod API over MPI, with an allreduce that reduce-scatters inside a
node, allreduces across nodes and allgathers inside the node again.
Importing ddl_tf does not initialize MPI; :func:`init` does.

Layers (each its own module; the core knows nothing of TensorFlow):
:mod:`ddl_tf.core` (numpy + MPI, no TensorFlow: init and rank queries,
topology, algorithms, fusion, compression, negotiation, timeline, the engine)
-> :mod:`ddl_tf.tensorflow` (Horovod's TensorFlow API: one module per
collective, ops and their gradients, through a bridge that runs the engine
eagerly and inside graphs) -> :mod:`ddl_tf.keras` (DistributedOptimizer,
callbacks). ``docs/migrating-from-horovod.md`` maps every Horovod name. Launching is apart:
:mod:`ddl_tf.launch` (hosts, the mpirun command, checks) <- :mod:`ddl_tf.cluster`
(rehearsal on virtual nodes) <- :mod:`ddl_tf.ddlrun` (the ``ddlrun`` command).

Logging goes through ``logging.getLogger("ddl_tf...")``.
"""

import importlib.util as _importlib_util
from importlib import metadata as _metadata

from ddl_tf.exports import MISSING_TF as _MISSING_TF
from ddl_tf.exports import lazy_exports as _lazy_exports

try:
    _tf_spec = _importlib_util.find_spec("tensorflow")
except ValueError:  # a half-imported tensorflow module
    _tf_spec = None
if _tf_spec is None:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(_MISSING_TF.format("No module named 'tensorflow'"))

from ddl_tf import errors  # noqa: E402
from ddl_tf.tensorflow import API as _API  # noqa: E402 - a table of names; imports no TensorFlow

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

# The public API is loaded on first use (PEP 562), so that `import ddl_tf` stays cheap:
# ddlrun and the numpy/MPI core never import TensorFlow, and nothing here starts MPI.
__getattr__, __dir__, _exported = _lazy_exports(
    __name__, {**_API, "DistributedOptimizer": "ddl_tf.keras.optimizer", "run": "ddl_tf.launch.api"}
)

__all__ = ["__version__", "errors", *_exported]
