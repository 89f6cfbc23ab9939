"""Compose: one plan from the levers, with the choices that need the simulator.

The planners of :mod:`tflms.plan` choose swaps and recomputations from the
graph alone. Composing them, and the levers chosen by simulation, need the
later stages: :func:`compose_plan` (:mod:`~tflms.compose.levers`, the one
composition of the levers, for ``tflms.make_plan`` and the auto-tuner alike)
applies the recomputations to the view (:mod:`tflms.apply`) before planning
swaps on it, and retimes and orders by simulation; :func:`order_edges` (:mod:`~tflms.compose.ordering`)
finds the control edges that lower a simulated peak; :func:`retime_triggers`
(:mod:`~tflms.compose.retime`) re-triggers swap-ins by simulated time instead
of level distance. :mod:`tflms.tuning` searches the options of all of them.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Levers": "tflms.compose.levers",
        "compose_plan": "tflms.compose.levers",
        "order_edges": "tflms.compose.ordering",
        "retime_triggers": "tflms.compose.retime",
    },
)
