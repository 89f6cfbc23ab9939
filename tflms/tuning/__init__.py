"""Tuning: the plan that fits a memory budget at the lowest predicted step time.

:func:`autotune` searches the options (:mod:`~tflms.tuning.search`) of the
plans :mod:`tflms.compose` makes, with the simulator as judge.
``make_plan``, ``order_edges`` and ``retime_triggers`` live in
:mod:`tflms.compose`; they are still importable from here.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "AutotuneResult": "tflms.tuning.autotuner",
        "autotune": "tflms.tuning.autotuner",
        "resolve_budget": "tflms.tuning.autotuner",
        "retime_triggers": "tflms.compose.retime",
        "make_plan": "tflms.compose.levers",
        "order_edges": "tflms.compose.ordering",
    },
)
