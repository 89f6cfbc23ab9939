"""Tuning: the plan that fits a memory budget at the lowest predicted step time.

:func:`make_plan` combines the levers (recompute, swap, order);
:func:`autotune` searches their options (:mod:`~tflms.tuning.search`) with
the simulator as judge; :func:`order_edges` finds the control edges that
lower a simulated peak; :func:`retime_triggers` re-triggers swap-ins by
simulated time instead of level distance.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "AutotuneResult": "tflms.tuning.autotuner",
        "autotune": "tflms.tuning.autotuner",
        "resolve_budget": "tflms.tuning.autotuner",
        "retime_triggers": "tflms.tuning.retime",
        "make_plan": "tflms.tuning.compose",
        "order_edges": "tflms.tuning.ordering",
    },
)
