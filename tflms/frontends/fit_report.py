"""Whether a plan made without a memory budget fits the GPU it will run on, and what to set.

With ``memory_budget`` the auto-tuner searches for a plan that fits. Without
one, the planner applies fixed options, which may leave a step far above the
GPU's memory (GPT-2 small at batch 15 on a V100-16GB: 27.65 GiB, simulated) or
swap much more than needed. Where the GPU is known, the front ends say so at
the start of training: :func:`visible_gpu_preset` names the preset of the
first visible GPU, :func:`fit_report` simulates the plan on it.

Example:
    >>> preset_for_gpu_name("Tesla V100-SXM2-16GB"), preset_for_gpu_name("NVIDIA A100-SXM4-80GB")
    ('V100-16GB', 'A100-80GB')
    >>> preset_for_gpu_name("NVIDIA GeForce RTX 4090") is None
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflms.cost.hardware import DEVICES, get_device
from tflms.cost.target import DEFAULT_LINK
from tflms.utils.units import format_bytes

__all__ = ["FitReport", "fit_report", "preset_for_gpu_name", "visible_gpu_preset"]


def preset_for_gpu_name(name: str) -> str | None:
    """The device preset of a GPU named as TensorFlow names it, or ``None``.

    Args:
        name: ``tf.config.experimental.get_device_details(gpu)["device_name"]``,
            e.g. ``"Tesla V100-SXM2-16GB"`` or ``"NVIDIA H100 80GB HBM3"``.

    Returns:
        A key of :data:`tflms.cost.hardware.DEVICES` whose model and memory size
        the name gives; ``None`` for any other GPU.
    """
    upper = name.upper()
    memory = re.search(r"(\d+)\s*GB", upper)
    for preset in DEVICES:
        model, size = preset.split("-")
        if re.search(rf"\b{model}\b", upper) and memory and f"{memory.group(1)}GB" == size:
            return preset
    return None


def visible_gpu_preset() -> str | None:
    """The preset of the first GPU TensorFlow sees (``None``: no GPU, or one without a preset)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    return preset_for_gpu_name(str(details.get("device_name", "")))


@dataclass(frozen=True)
class FitReport:
    """A plan simulated on a device preset (every figure simulated).

    Attributes:
        preset: the device preset.
        fits: whether the predicted peak is within the device's memory.
        peak_bytes: the predicted peak (realistic accounting).
        capacity_bytes: the device's memory.
        overhead: the predicted step-time overhead of the plan.
        message: one paragraph for the log, with what to set.
    """

    preset: str
    fits: bool
    peak_bytes: int
    capacity_bytes: int
    overhead: float
    message: str


def fit_report(view, plan, preset: str, *, stack="tf2", link: str = DEFAULT_LINK) -> FitReport:
    """Simulate ``plan`` on ``preset`` and say whether it fits and what to set.

    Args:
        view: the analysis view the plan was made from.
        plan: the plan (possibly empty).
        preset: a device preset (``"V100-16GB"``...).
        stack: the software stack (see :func:`tflms.simulate`).
        link: the host link.

    Returns:
        A :class:`FitReport`.
    """
    from tflms.simulation.simulator import simulate

    device = get_device(preset)
    result = simulate(view, plan, device=preset, link=link, stack=stack)
    peak, capacity = int(result.device_peak_bytes), int(device.memory_bytes)
    fits = peak <= capacity
    name = plan.graph_name or "the train step"
    where = f"{name} is predicted at {format_bytes(peak)} on a {preset} ({format_bytes(capacity)}; "
    where += f"simulated, step time {result.overhead:+.0%} over no swaps)"
    if fits:
        message = f"tflms: {where}: it fits."
    else:
        message = (
            f"tflms: {where}: it does not fit, so it would run out of memory. Set "
            f"memory_budget={preset!r} and tflms tunes swaps, recomputation and op order to "
            "fit (or says no plan can), or lower the batch size."
        )
    return FitReport(preset, fits, peak, capacity, result.overhead, message)
