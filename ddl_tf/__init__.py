"""ddl_tf: topology-aware distributed training for TensorFlow, Horovod-compatible.

``import ddl_tf as hvd`` (or ``import ddl_tf.keras as hvd`` for Keras) gives
the Horovod API over MPI, with an allreduce that reduce-scatters inside a
node, allreduces across nodes and allgathers inside the node again.

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

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__", "errors"]
