"""Tuning: the plan that fits a memory budget at the lowest predicted step time.

:func:`autotune` searches the options (:mod:`~tflms.tuning.search`) of the
plans :mod:`tflms.compose` makes, with the simulator as judge; each setting
is composed by the same :func:`~tflms.compose.levers.compose_plan` that
``tflms.make_plan`` runs.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "AutotuneResult": "tflms.tuning.autotuner",
        "Candidate": "tflms.tuning.search",
        "autotune": "tflms.tuning.autotuner",
    },
)
