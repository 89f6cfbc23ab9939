"""tflms: TensorFlow Large Model Support.

Rewrites TensorFlow training graphs so that long-lived activations are swapped
to host memory after the forward pass and brought back to the GPU just before
the backward pass needs them. The pipeline is analysis (a networkx view of the
graph), plan (a serializable :class:`SwapPlan`), apply (the only step that
mutates a graph).

Logging goes through ``logging.getLogger("tflms...")``; configure the
``tflms`` logger to see the per-pass debug lines.
"""

from importlib import metadata as _metadata

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tflms needs TensorFlow 2.21, which could not be imported "
        f"({_err}). Install the extra for your machine: "
        "pip install 'tflms-ddl[cpu]' (CPU only) or 'tflms-ddl[gpu]' (NVIDIA GPU)."
    ) from _err

from tflms import errors
from tflms.apply import apply_plan, apply_to_view
from tflms.autotuner import AutotuneResult, autotune
from tflms.config import LMSConfig
from tflms.graph_view import build_view
from tflms.keras_callback import LMSCallback
from tflms.lms import LMS
from tflms.lms_function import LMSFunction, function
from tflms.plan import Swap, SwapIn, SwapPlan
from tflms.planner import make_plan
from tflms.simulator import SimulationResult, simulate
from tflms.validate import validate

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "errors",
    "LMS",
    "LMSCallback",
    "LMSConfig",
    "Swap",
    "SwapIn",
    "SwapPlan",
    "apply_plan",
    "apply_to_view",
    "autotune",
    "AutotuneResult",
    "build_view",
    "function",
    "LMSFunction",
    "make_plan",
    "simulate",
    "SimulationResult",
    "validate",
]
