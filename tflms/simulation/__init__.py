"""Simulation: predict the memory peak and step time of a training step without a GPU.

:func:`simulate` compiles a view (:mod:`~tflms.simulation.schedule`), times its
ops (:mod:`tflms.cost.ops`, presets in :mod:`tflms.cost.hardware`),
schedules them as Grappler does and accounts every buffer
(:mod:`~tflms.simulation.memory`). :mod:`~tflms.simulation.grappler` runs
TensorFlow's own estimate, :mod:`~tflms.simulation.crosscheck` compares the
two, :mod:`~tflms.simulation.plot` draws timelines. Every figure is simulated.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "SIMULATOR": "tflms.simulation.simulator",
        "SimulationResult": "tflms.simulation.simulator",
        "simulate": "tflms.simulation.simulator",
    },
)
