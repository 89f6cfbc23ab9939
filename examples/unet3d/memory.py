"""Simulated GPU memory of the seed paper's 3D U-Net training steps, without and with tflms.

There is no GPU here, so peaks are predicted by :func:`tflms.simulate` on a
virtual V100-16GB (every figure says so), with the realistic model: the
tensors and what a TensorFlow GPU process holds beyond them. For each
requested cube size the training step of the paper's model
(:func:`tflms.zoo.isensee2017`) is traced once (batch 1), analysed, simulated
plainly, and auto-tuned to the device (:func:`tflms.autotune`).
"""

from __future__ import annotations

import tflms
from tflms import zoo
from tflms.cost.hardware import get_device
from tflms.errors import PlanInfeasibleError
from tflms.simulation.simulator import SIMULATOR

__all__ = ["train_step_view", "simulate_size", "describe"]


def train_step_view(size: int, *, depth: int, base_filters: int, batch_size: int = 1):
    """The analysis view of one Adam training step of the paper's U-Net at ``size``^3."""
    model = zoo.isensee2017(
        size,
        depth=depth,
        base_filters=base_filters,
        segmentation_levels=min(3, depth - 1),
        batch_size=batch_size,
    )
    return tflms.analyze(model, batch_size=batch_size)


def simulate_size(
    size: int,
    *,
    depth: int,
    base_filters: int,
    device: str = "V100-16GB",
    link: str = "nvlink2",
    timeline_png=None,
) -> dict:
    """Peak at ``size``^3 (batch 1) without LMS and with the plan auto-tuned to ``device``.

    ``depth=5, base_filters=16`` is the seed paper's model.
    """
    view = train_step_view(size, depth=depth, base_filters=base_filters)
    plain = tflms.simulate(view, device=device, link=link)
    budget = get_device(device).memory_bytes
    row = {
        "size": size,
        "voxels": size**3,
        "depth": depth,
        "base_filters": base_filters,
        "model": "isensee2017",
        "accounting": plain.accounting,
        "memory_terms": plain.memory_terms,
        "batch": 1,
        "device": device,
        "link": link,
        "simulator": SIMULATOR,
        "simulated": True,
        "peak_without_lms_bytes": plain.device_peak_bytes,
        "fits_without_lms": plain.device_peak_bytes <= budget,
    }
    try:
        tuned = tflms.autotune(view, device, link=link)
    except PlanInfeasibleError as err:
        row.update(fits_with_lms=False, best_peak_with_lms_bytes=err.best_peak_bytes)
        return row
    row.update(
        lms_needed=tuned.lms_needed,
        peak_with_lms_bytes=tuned.result.device_peak_bytes,
        fits_with_lms=True,
        swaps=len(tuned.plan.swaps),
        bytes_swapped=tuned.plan.bytes_swapped,
        overhead=round(tuned.overhead, 4),
    )
    if timeline_png is not None:
        tuned.result.plot(
            timeline_png,
            budget_bytes=budget,
            title=f"isensee2017 3D U-Net {size}^3, batch 1, one training step "
            f"(simulated, {device}, {link})",
        )
    return row


def describe(result, *, size: int, batch: int, device: str, link: str) -> dict:
    """JSON row for a :class:`tflms.simulation.simulator.SimulationResult` of a planned step."""
    plain = result.baseline or result
    return {
        "size": size,
        "batch": batch,
        "device": device,
        "link": link,
        "simulator": SIMULATOR,
        "simulated": True,
        "peak_without_lms_bytes": plain.device_peak_bytes,
        "peak_with_lms_bytes": result.device_peak_bytes,
        "swaps_out_bytes": result.bytes_swapped_out,
        "overhead": round(result.overhead, 4),
    }
