"""Plan: what to swap, for which consumers, started by which trigger.

:func:`make_plan` reads an analysis view and returns a frozen, JSON
round-tripping :class:`SwapPlan`; it never touches TensorFlow.
:mod:`~tflms.plan.candidates` decides which tensors may be swapped at all,
:mod:`~tflms.plan.triggers` groups far consumers and picks the op whose
completion starts each swap-in.
"""

from tflms.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "make_plan": "tflms.plan.planner",
        "PLAN_FORMAT_VERSION": "tflms.plan.swap_plan",
        "Swap": "tflms.plan.swap_plan",
        "SwapIn": "tflms.plan.swap_plan",
        "SwapPlan": "tflms.plan.swap_plan",
    },
)
