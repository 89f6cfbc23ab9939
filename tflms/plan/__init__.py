"""Plan: what to swap, for which consumers, started by which trigger.

The plan is a frozen, JSON round-tripping :class:`SwapPlan` of
:mod:`~tflms.plan.entries`. :func:`plan_swaps` chooses swaps
(:mod:`~tflms.plan.candidates` decides which tensors may be swapped at all,
:mod:`~tflms.plan.triggers` groups far consumers and picks the op whose
completion starts each swap-in); :func:`plan_recomputes`
(:mod:`~tflms.plan.recompute`) chooses what to recompute. Nothing here
touches TensorFlow; :func:`tflms.make_plan` combines the levers.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "plan_swaps": "tflms.plan.planner",
        "plan_recomputes": "tflms.plan.recompute",
        "Recompute": "tflms.plan.entries",
        "PLAN_FORMAT_VERSION": "tflms.plan.swap_plan",
        "Swap": "tflms.plan.swap_plan",
        "SwapIn": "tflms.plan.swap_plan",
        "SwapPlan": "tflms.plan.swap_plan",
    },
)
