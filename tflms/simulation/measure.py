"""Measure a training step on the CPU: TensorFlow's allocator peak and the executor's op order.

The only real execution these machines can give is TensorFlow's own executor
on the CPU. TensorFlow 2.21 keeps allocator statistics for ``CPU:0``
(``tf.config.experimental.get_memory_info`` returns the bytes in use and the
peak since ``reset_memory_stats``) when its CPU allocator is the BFC allocator,
and its profiler records when each op started. :func:`measure_cpu_step` runs a
step several times and returns both, so that the simulator can be judged three ways (see ``docs/simulator.md``):

* its own prediction (FirstReady schedule) against the measured peak: the
  whole model, schedule included;
* the same graph replayed in the measured op order
  (``simulate(view, order=m.order)``): liveness and allocator only;
* with ``allocator="bfc"``: TensorFlow's chunk rounding and splitting too.

Which CPU: TensorFlow keeps CPU allocator statistics only where oneDNN is on
(by default, CPUs with AVX-512-class features). On any other x86-64 CPU start
the measuring process with ``TF_ENABLE_ONEDNN_OPTS=1``
(:func:`tflms.utils.cpu.measurement_env`): the same allocator, so its peaks are
comparable with those measured on a oneDNN CPU. ``TF_CPU_ALLOCATOR_USE_BFC=true``
also gives statistics, from the plain BFC allocator, whose small-tensor
placement differs (see :mod:`tflms.utils.cpu`).

What no CPU run can show: GPU-only allocations (cuDNN workspaces, cuBLAS
handles, NCCL buffers), the GPU allocator's fragmentation over many steps,
and the order of a GPU stream (the CPU executor sends ops it estimates as
expensive to a thread pool, so its order depends on run-time cost estimates
and varies between processes; a GPU executor runs all kernels inline in
ready order, which is what FirstReady models).

Example:
    >>> import tensorflow as tf
    >>> w = tf.Variable(tf.ones((256, 256)))
    >>> @tf.function
    ... def step(x):
    ...     return tf.reduce_sum(tf.nn.relu(x @ w) @ w)
    >>> m = measure_cpu_step(step, tf.ones((512, 256)), runs=2, profile=False)
    >>> m.peak_bytes >= 2 * 512 * 256 * 4  # two (512, 256) float32 results at once
    True
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass

from tflms.errors import ConfigError
from tflms.utils.cpu import BFC_VARIABLE, ONEDNN_VARIABLE

__all__ = ["CPUMeasurement", "measure_cpu_step", "ops_in_start_order"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CPUMeasurement:
    """What TensorFlow's CPU executor and allocator did running one step.

    Attributes:
        peaks_bytes: the allocator's peak bytes in use during each measured
            run (statistics reset before each), resident tensors included.
        resident_bytes: bytes in use just before the last measured run
            (variables, optimizer slots, the inputs).
        order: op names in the order the executor started them in the
            profiled run (empty without ``profile``).
        profiled_peak_bytes: the peak of the profiled run (``None`` without
            ``profile``); the order belongs to this run.
        inter_op_threads: TensorFlow's inter-op thread setting during the runs
            (0: TensorFlow's default, one per core).
    """

    peaks_bytes: tuple[int, ...]
    resident_bytes: int
    order: tuple[str, ...]
    profiled_peak_bytes: int | None
    inter_op_threads: int

    @property
    def peak_bytes(self) -> int:
        """The median peak of the measured runs."""
        return int(statistics.median(self.peaks_bytes))

    def to_dict(self) -> dict:
        """JSON-ready fields (the op order as its length only)."""
        return {
            "peak_bytes": self.peak_bytes,
            "peaks_bytes": list(self.peaks_bytes),
            "resident_bytes": self.resident_bytes,
            "profiled_peak_bytes": self.profiled_peak_bytes,
            "ops_in_order": len(self.order),
            "inter_op_threads": self.inter_op_threads,
        }


def measure_cpu_step(
    fn, *args, runs: int = 3, warmup: int = 2, profile: bool = True, device: str = "CPU:0"
) -> CPUMeasurement:
    """Run ``fn(*args)`` on the CPU and measure its allocator peak (and op order).

    Args:
        fn: a ``tf.function`` (or any callable running TensorFlow ops), e.g.
            ``tf.function(model.train_step, jit_compile=False)``. It runs
            ``warmup + runs`` times, plus once more under the profiler, so it
            must be safe to repeat (a training step changes the weights, which
            does not change its memory).
        *args: its arguments (tensors already on the device, so that their
            copy is not part of the step).
        runs: measured runs (their median is :attr:`CPUMeasurement.peak_bytes`).
        warmup: unmeasured runs first (tracing, allocator growth, kernel
            caches).
        profile: also run once under ``tf.profiler`` to record the op order.
        device: the device whose allocator is read.

    Returns:
        A :class:`CPUMeasurement`.

    Raises:
        ConfigError: ``runs`` < 1 or ``warmup`` < 0, or the device keeps no
            memory statistics.
    """
    import tensorflow as tf

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"runs must be a whole number >= 1. Received runs={runs!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be a whole number >= 0. Received warmup={warmup!r}.")
    try:
        tf.config.experimental.get_memory_info(device)
    except (ValueError, tf.errors.OpError) as err:
        if "CPU" in device.upper():
            why = (
                "TensorFlow keeps CPU allocator statistics only where oneDNN is on, which "
                "it turns on by itself only on AVX-512-class CPUs. Start the process with "
                f"{ONEDNN_VARIABLE}=1 (oneDNN's allocator, comparable with the published "
                f"figures; tflms.utils.cpu.measurement_env()) or {BFC_VARIABLE}=true (the "
                "plain BFC allocator) and run again."
            )
        else:
            why = "Measure on 'CPU:0' (TensorFlow >= 2.16)."
        raise ConfigError(f"{device} keeps no allocator statistics ({err}). {why}") from err
    for _ in range(warmup):
        fn(*args)
    peaks = []
    resident = 0
    for _ in range(runs):
        tf.config.experimental.reset_memory_stats(device)
        resident = tf.config.experimental.get_memory_info(device)["current"]
        fn(*args)
        peaks.append(int(tf.config.experimental.get_memory_info(device)["peak"]))
    order: tuple[str, ...] = ()
    profiled = None
    if profile:
        logdir = tempfile.mkdtemp(prefix="tflms-measure-")
        try:
            tf.profiler.experimental.start(logdir)
            try:
                tf.config.experimental.reset_memory_stats(device)
                fn(*args)
                profiled = int(tf.config.experimental.get_memory_info(device)["peak"])
            finally:
                tf.profiler.experimental.stop()
            order = ops_in_start_order(logdir)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
    result = CPUMeasurement(
        peaks_bytes=tuple(peaks),
        resident_bytes=int(resident),
        order=order,
        profiled_peak_bytes=profiled,
        inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
    )
    logger.info(
        "measured on %s: peak %d bytes (runs %s), %d ops in order",
        device,
        result.peak_bytes,
        peaks,
        len(order),
    )
    return result


def ops_in_start_order(logdir: str) -> tuple[str, ...]:
    """Op names in the order they started, from a ``tf.profiler`` trace of the host.

    Args:
        logdir: the folder given to ``tf.profiler.experimental.start``.

    Returns:
        Names as the graph has them (the profiler's ``name:Type`` labels are
        cut at the colon), earliest start first; every occurrence is kept.

    Raises:
        ConfigError: the folder holds no ``.xplane.pb`` trace.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        raise ConfigError(
            f"No profiler trace (*.xplane.pb) under {logdir}: run the step between "
            "tf.profiler.experimental.start(logdir) and stop()."
        )
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                label = metadata[event.metadata_id].name
                events.append((line.timestamp_ns * 1000 + event.offset_ps, label.split(":")[0]))
    events.sort()
    return tuple(name for _, name in events)
