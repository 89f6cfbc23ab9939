"""tflms: TensorFlow Large Model Support.

Rewrites TensorFlow training graphs so that long-lived activations are swapped
to host memory after the forward pass and brought back to the GPU just before
the backward pass needs them. The pipeline, one sub-package per stage:

* :mod:`tflms.graph` - analysis: a networkx view of the graph (read only);
* :mod:`tflms.plan` - plan: a frozen, serializable :class:`SwapPlan`;
* :mod:`tflms.apply` - apply: the only stage that mutates a graph, and
  :func:`validate`, the contracts a rewritten graph must satisfy;
* :mod:`tflms.simulation` - predicted peak memory and step time;
* :mod:`tflms.compose` - one plan from the levers, the choices that need
  the simulator (order edges, swap-in timing) included;
* :mod:`tflms.tuning` - the plan that fits a memory budget;
* :mod:`tflms.pipeline` - the stages above joined, every option resolved
  once (:class:`Pipeline`; :func:`make_plan` is its plan stage alone): what
  every front end and the SavedModel path run;
* :mod:`tflms.saved_model` and :mod:`tflms.cli` - the ``tflms`` command.

Below the pipeline: :mod:`tflms.config` and :mod:`tflms.errors`,
:mod:`tflms.cost` (device and link presets, per-op cost, the :class:`Target`
a plan is made for) and
:mod:`tflms.utils` (units, device strings, files, lazy exports). Above it,
the front ends: :mod:`tflms.frontends` (:class:`LMS` for ``tf.compat.v1``
graphs, :func:`function` for custom loops) and :mod:`tflms.keras`
(:class:`LMSCallback` for Keras ``fit``; :func:`analyze` gives the view of a
compiled Keras model's training step). :mod:`tflms.zoo` holds the models the
tests, benchmarks and demo use.
The names below load on first use, so ``import tflms`` is cheap; it still
fails at once, saying what to install, when TensorFlow is missing.

Logging goes through ``logging.getLogger("tflms...")``; configure the
``tflms`` logger to see the per-pass debug lines.
"""

import importlib.util as _importlib_util
from importlib import metadata as _metadata

from tflms.utils.exports import lazy_exports as _lazy_exports

try:
    _tf_spec = _importlib_util.find_spec("tensorflow")
except ValueError:  # a half-imported tensorflow module
    _tf_spec = None
if _tf_spec is None:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tflms needs TensorFlow 2.21, which could not be imported (No module named "
        "'tensorflow'). Install the extra for your machine: pip install 'tflms-ddl[lms,cpu]' "
        "(CPU only) or 'tflms-ddl[lms,gpu]' (NVIDIA GPU)."
    )

from tflms import errors  # noqa: E402 - after the TensorFlow check

try:
    __version__ = _metadata.version("tflms-ddl")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__getattr__, __dir__, _exported = _lazy_exports(
    __name__,
    {
        "LMS": "tflms.frontends.lms",
        "LMSCallback": "tflms.keras.callback",
        "LMSConfig": "tflms.config",
        "Swap": "tflms.plan.swap_plan",
        "SwapIn": "tflms.plan.swap_plan",
        "SwapPlan": "tflms.plan.swap_plan",
        "Target": "tflms.cost.target",
        "apply_plan": "tflms.apply.core",
        "apply_to_view": "tflms.apply.core",
        "autotune": "tflms.tuning.autotuner",
        "AutotuneResult": "tflms.tuning.autotuner",
        "build_view": "tflms.graph.view",
        "function": "tflms.frontends.decorator",
        "LMSFunction": "tflms.frontends.decorator",
        "make_plan": "tflms.pipeline",
        "Pipeline": "tflms.pipeline",
        "simulate": "tflms.simulation.simulator",
        "SimulationResult": "tflms.simulation.simulator",
        "validate": "tflms.apply.validation",
        "analyze": "tflms.keras.step",
        "train_step_graph": "tflms.keras.step",
    },
)

__all__ = ["__version__", "errors", *_exported]
