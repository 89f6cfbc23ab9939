"""``tflms.simulate``: predict the memory peak and step time of a training step.

The simulator answers "will my model fit in my GPU, and what will it cost?"
without a GPU. It runs the analysis view of a training step (optionally
rewritten by a :class:`~tflms.SwapPlan`) through three models, each in its
own module:

* schedule (:mod:`tflms.simulation.schedule`): Grappler's FirstReady order on a
  compute stream, with swap copies on one stream per link direction;
* time (:mod:`tflms.cost.ops`, :mod:`tflms.cost.hardware`): a roofline per op
  on a device preset (V100-16GB, A100-80GB, ...), copies at the link's
  bandwidth (pcie3, nvlink2, ...); a consumer waits for its swap-in;
* memory (:mod:`tflms.simulation.memory`): resident variables, a buffer per output
  from its producer's start to its last consumer's end; by default
  (``accounting="realistic"``) also what a GPU process holds beyond its
  tensors, term by term (:mod:`tflms.cost.gpu_memory`).

Every number it returns is simulated; :attr:`SimulationResult.simulator`
says by what. Counted with Grappler's memory conventions
(``accounting="grappler"``, free copies), the device peak agrees with
Grappler's own estimate (:func:`tflms.simulation.grappler.grappler_peak`) within 3.5% on
ResNet-50, VGG16, a 3D U-Net, a Transformer and an MLP, with and without swap
plans (:mod:`tflms.simulation.crosscheck`, ``benchmarks/results/simulator_fidelity.json``).

Example:
    >>> import tensorflow as tf, tflms
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [256, 1024], name="x")
    ...     h = tf.nn.relu(x, name="h")
    ...     y = tf.tanh(h, name="y")
    ...     z = tf.add(y, h, name="z")
    >>> result = tflms.simulate(tflms.build_view(g), accounting="tensors")
    >>> result.device_peak_bytes // (256 * 1024 * 4)  # x and h, then h and y; z reuses y's buffer
    2
    >>> result.peak_op, result.overhead
    ('h', 0.0)
    >>> real = tflms.simulate(tflms.build_view(g))  # the default: what the GPU holds
    >>> list(real.memory_terms)
    ['driver', 'cuda_context', 'tensorflow_reserve', 'tensors', 'workspace', 'allocator']
    >>> real.memory_terms["tensors"] == result.device_peak_bytes
    True
    >>> sum(real.memory_terms.values()) == real.device_peak_bytes
    True
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx

from tflms.apply.core import apply_to_view
from tflms.cost.gpu_memory import SoftwareStack
from tflms.cost.hardware import DeviceModel, LinkModel
from tflms.cost.target import Target
from tflms.errors import ConfigError
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.allocator import Accounting, Allocator, check_allocator
from tflms.simulation.memory import LiveBuffer, trace_memory
from tflms.simulation.schedule import CompiledGraph, compile_view, first_ready, replayed
from tflms.utils.files import write_atomic
from tflms.utils.units import format_bytes

__all__ = ["simulate", "SimulationResult", "SIMULATOR"]

logger = logging.getLogger(__name__)

SIMULATOR = "tflms.simulate (FirstReady schedule, roofline time model, static tensor sizes)"


@dataclass(frozen=True)
class SimulationResult:
    """What one simulated training step needs and costs.

    Attributes:
        graph_name: name of the simulated graph.
        device: the device preset name; link: the link preset name.
        accounting: ``"realistic"``, ``"tensors"`` (``"tensorflow"``) or
            ``"grappler"`` (see :mod:`tflms.simulation.memory`).
        allocator: ``"exact"`` or ``"bfc"`` (see :mod:`tflms.simulation.allocator`).
        device_peak_bytes: peak device memory, resident variables included.
        host_peak_bytes: peak host memory of swapped tensors and host ops,
            and (under ``"realistic"`` accounting) of the variables kept on
            the host (an offloaded optimizer's state).
        peak_op: the op whose outputs were allocated at the device peak.
        peak_op_type: its type; peak_time_s: when it started.
        variable_bytes: resident variables and optimizer slots on the device.
        host_variable_bytes: resident variables kept on the host (an
            offloaded optimizer's state, weights streamed from there).
        live_at_peak: largest buffers on the device at the peak.
        timeline_ops, timeline_s, timeline_device, timeline_host: one point
            per op in start order: its name, start time, device and host
            bytes in use once it allocated its outputs.
        bytes_swapped_out, bytes_swapped_in: bytes copied device to host and
            back (a tensor swapped in for two consumer groups counts twice).
        swap_outs, swap_ins: number of copies each way.
        step_time_s: predicted step time (end of the last op or copy).
        compute_time_s: busy time of the compute stream.
        copy_time_s: busy time of each copy stream, ``{"d2h": ..., "h2d": ...}``.
        baseline_step_time_s: step time of the graph without swaps.
        overhead: ``step_time_s / baseline_step_time_s - 1`` (0.0 without swaps).
        baseline: the simulation of the graph without swaps, if one was run.
        simulator: which simulator produced the numbers.
        per_sample: tensors with an open batch dimension were sized per
            sample (the view had no batch size): every byte figure is too small.
        memory_terms: under ``accounting="realistic"``, ``device_peak_bytes``
            by term (bytes): ``driver``, ``cuda_context``,
            ``tensorflow_reserve``, ``tensors``, ``workspace``, ``allocator``
            (see :mod:`tflms.cost.gpu_memory`), and ``calibration`` after
            ``tensors`` for a calibrated stack (fitted, not sourced); empty
            otherwise.
        allocator_limit_bytes: under ``"realistic"``, what TensorFlow's
            allocator may hand out on this device (the rest of its memory
            goes to the first three terms).
        stack: under ``"realistic"``, the software stack the terms are for.
    """

    graph_name: str
    device: str
    link: str
    accounting: Accounting
    allocator: Allocator
    device_peak_bytes: int
    host_peak_bytes: int
    peak_op: str
    peak_op_type: str
    peak_time_s: float
    variable_bytes: int
    live_at_peak: tuple[LiveBuffer, ...]
    timeline_ops: tuple[str, ...]
    timeline_s: tuple[float, ...]
    timeline_device: tuple[int, ...]
    timeline_host: tuple[int, ...]
    bytes_swapped_out: int
    bytes_swapped_in: int
    swap_outs: int
    swap_ins: int
    step_time_s: float
    compute_time_s: float
    copy_time_s: dict = field(default_factory=dict)
    baseline_step_time_s: float | None = None
    overhead: float = 0.0
    baseline: SimulationResult | None = field(default=None, repr=False)
    simulator: str = SIMULATOR
    per_sample: bool = False
    memory_terms: dict = field(default_factory=dict)
    allocator_limit_bytes: int | None = None
    stack: str | None = None
    host_variable_bytes: int = 0

    def fits(self, budget_bytes: int) -> bool:
        """Whether the device peak is at most ``budget_bytes``.

        Args:
            budget_bytes: Device memory budget in bytes.

        Returns:
            True if ``device_peak_bytes <= budget_bytes``.
        """
        return self.device_peak_bytes <= budget_bytes

    def summary(self) -> str:
        """A few readable lines: peaks, the op at the peak, time and overhead."""
        lines = [
            f"simulated {self.graph_name or 'graph'} on {self.device} over {self.link} "
            f"({self.accounting} accounting): device peak {format_bytes(self.device_peak_bytes)} "
            f"at {self.peak_op} ({self.peak_op_type}), host peak {format_bytes(self.host_peak_bytes)}",
            f"  step {self.step_time_s * 1e3:.1f} ms (compute {self.compute_time_s * 1e3:.1f} ms)"
            + (
                f", {self.overhead:+.1%} over {self.baseline_step_time_s * 1e3:.1f} ms without swaps"
                if self.baseline_step_time_s
                else ""
            ),
        ]
        if self.swap_outs:
            lines.append(
                f"  swapped {format_bytes(self.bytes_swapped_out)} out in {self.swap_outs} copies, "
                f"{format_bytes(self.bytes_swapped_in)} in in {self.swap_ins} copies"
            )
        if self.baseline is not None:
            lines.append(
                f"  without swaps: device peak {format_bytes(self.baseline.device_peak_bytes)}"
            )
        if self.memory_terms:
            names = {
                "driver": "hidden by the driver",
                "cuda_context": "CUDA context",
                "tensorflow_reserve": "TensorFlow's reserve",
                "tensors": "tensors",
                "calibration": "calibration (fitted, not sourced)",
                "workspace": "cuDNN workspace",
                "allocator": "allocator rounding and fragmentation",
            }
            parts = ", ".join(
                f"{names.get(k, k)} {format_bytes(v)}" for k, v in self.memory_terms.items()
            )
            lines.append(f"  device peak by term ({self.stack} stack): {parts}")
            if self.allocator_limit_bytes is not None:
                lines.append(
                    f"  TensorFlow's allocator may hand out {format_bytes(self.allocator_limit_bytes)}"
                )
        lines.append(
            f"  ({self.simulator}; variables {format_bytes(self.variable_bytes)}"
            + (
                f" on the device, {format_bytes(self.host_variable_bytes)} on the host)"
                if self.host_variable_bytes
                else ")"
            )
        )
        if self.per_sample:
            lines.append(
                "  WARNING: the batch size is unknown, so tensors with an open batch dimension "
                "were sized per sample; build the view with batch_size=N for real sizes"
            )
        return "\n".join(lines)

    def to_dict(self, *, timeline: bool = True) -> dict:
        """JSON-ready values; ``timeline=False`` leaves the per-op points out.

        Args:
            timeline: Include the per-op memory timeline (the bulk of the data).

        Returns:
            A dict of plain JSON values with ``"simulated": True``.
        """
        data = {
            "simulated": True,
            "simulator": self.simulator,
            "graph_name": self.graph_name,
            "device": self.device,
            "link": self.link,
            "accounting": self.accounting,
            "allocator": self.allocator,
            "device_peak_bytes": self.device_peak_bytes,
            "host_peak_bytes": self.host_peak_bytes,
            "peak_op": self.peak_op,
            "peak_op_type": self.peak_op_type,
            "peak_time_s": self.peak_time_s,
            "variable_bytes": self.variable_bytes,
            "host_variable_bytes": self.host_variable_bytes,
            "live_at_peak": [vars(b) for b in self.live_at_peak],
            "bytes_swapped_out": self.bytes_swapped_out,
            "bytes_swapped_in": self.bytes_swapped_in,
            "swap_outs": self.swap_outs,
            "swap_ins": self.swap_ins,
            "step_time_s": self.step_time_s,
            "compute_time_s": self.compute_time_s,
            "copy_time_s": dict(self.copy_time_s),
            "baseline_step_time_s": self.baseline_step_time_s,
            "overhead": self.overhead,
            "per_sample": self.per_sample,
            "memory_terms": dict(self.memory_terms),
            "allocator_limit_bytes": self.allocator_limit_bytes,
            "stack": self.stack,
        }
        if timeline:
            data["timeline"] = {
                "ops": list(self.timeline_ops),
                "time_s": list(self.timeline_s),
                "device_bytes": list(self.timeline_device),
                "host_bytes": list(self.timeline_host),
            }
        if self.baseline is not None:
            data["baseline"] = self.baseline.to_dict(timeline=timeline)
        return data

    def to_json(self, **kwargs) -> str:
        """:meth:`to_dict` as JSON (``timeline`` and ``json.dumps`` keywords pass through).

        Args:
            **kwargs: ``timeline`` (bool, default True) for :meth:`to_dict`; the
                rest go to ``json.dumps``.

        Returns:
            The JSON text.
        """
        timeline = kwargs.pop("timeline", True)
        return json.dumps(self.to_dict(timeline=timeline), **kwargs)

    def save_json(self, path, *, timeline: bool = True) -> None:
        """Write :meth:`to_json` to ``path`` atomically (a temporary file, then a rename).

        Args:
            path: Destination file; missing folders are created.
            timeline: Include the per-op memory timeline.

        Raises:
            OSError: the file cannot be written (the destination is unchanged).
        """
        write_atomic(path, self.to_json(timeline=timeline, indent=1))

    def plot(self, path, *, budget_bytes: int | None = None, title: str | None = None) -> None:
        """Write a PNG memory timeline; see :func:`tflms.simulation.plot.plot_result`.

        Args:
            path: Destination PNG file; missing folders are created.
            budget_bytes: Draw this memory budget as a dashed line; None for none.
            title: Figure title; None for graph, device and link.
        """
        from tflms.simulation.plot import plot_result

        plot_result(self, path, budget_bytes=budget_bytes, title=title)


def simulate(
    view: nx.DiGraph,
    plan: SwapPlan | None = None,
    *,
    device: str | DeviceModel | None = None,
    link: str | LinkModel | None = None,
    accounting: Accounting | None = None,
    allocator: Allocator = "exact",
    baseline: bool | SimulationResult = True,
    order: Sequence[str] | None = None,
    stack: str | SoftwareStack | None = None,
    target: Target | None = None,
) -> SimulationResult:
    """Simulate one training step of ``view``, rewritten by ``plan`` if given.

    Args:
        view: the analysis view (:func:`tflms.build_view`), with or without
            swap ops; tensors are sized with its batch size.
        plan: a swap plan to apply (to a copy) before simulating.
        device: a device preset name (``"V100-16GB"``, ``"A100-80GB"``,
            ``"H100-80GB"``...) or a :class:`~tflms.cost.hardware.DeviceModel`;
            default :data:`tflms.cost.target.DEFAULT_DEVICE`.
        link: a link preset name (``"pcie3"``, ``"pcie4"``, ``"nvlink2"``,
            ``"ideal"``...) or a :class:`~tflms.cost.hardware.LinkModel`;
            default ``"pcie3"``.
        accounting: ``"realistic"``: tensors with TensorFlow's conventions
            (resident variables, aliases) plus what a GPU process holds
            beyond them, term by term (:mod:`tflms.cost.gpu_memory`), so that
            ``device_peak_bytes <= device.memory_bytes`` is the verdict;
            ``"tensors"`` (``"tensorflow"``): the tensors alone; ``"grappler"``:
            Grappler's conventions, to compare with it. Default: ``"realistic"``
            on a GPU preset (``"V100-16GB"``...); ``"tensors"`` on a custom
            ``DeviceModel`` (no measured facts) and with ``allocator="bfc"`` or
            ``order`` (the CPU judge's modes, which replay the CPU's allocator).
        allocator: ``"exact"`` (the bytes of the live tensors, the least any
            allocator needs) or ``"bfc"`` (the chunks TensorFlow's BFC allocator
            hands out when it grows, as on the CPU: requests rounded up, chunks
            up to twice a request; see :mod:`tflms.simulation.allocator`).
        baseline: with a plan, also simulate the graph without it so that
            ``overhead`` and the "before" curve exist; pass an earlier
            result to reuse it, or ``False`` to skip.
        order: op names in the order an executor ran them (from
            :func:`tflms.simulation.measure.measure_cpu_step`): the step is
            then replayed one op at a time in that order
            (:func:`~tflms.simulation.schedule.replayed`) instead of
            FirstReady, to judge liveness and allocator apart from the
            schedule. Step times then are a serial sum, not a prediction.
        stack: the software stack whose non-tensor terms ``"realistic"``
            counts: ``"tf2"`` (TensorFlow 2.x on CUDA 12, the default) or
            ``"tf1"`` (TensorFlow 1.x on CUDA 9/10, the published
            measurements' era; :data:`tflms.cost.gpu_memory.STACKS`), or a
            stack calibrated to real measurements
            (:func:`tflms.cost.gpu_memory.calibrated`), whose fitted extra
            memory is the ``calibration`` term.
        target: device, link, accounting and stack resolved at once
            (:class:`~tflms.cost.target.Target`, e.g. ``config.target()``),
            instead of ``device``, ``link``, ``accounting`` and ``stack``.

    Returns:
        A :class:`SimulationResult`.

    Raises:
        ConfigError: an unknown preset, accounting or allocator.
        UnsupportedGraphError: the graph cannot be scheduled (a cycle).
        ValidationError: the plan does not match the view.
    """
    if target is None:
        if accounting is None and (allocator == "bfc" or order is not None):
            accounting = "tensors"  # the CPU judge's modes replay the CPU's allocator
        target = Target.for_device(device, link, accounting=accounting, stack=stack or "tf2")
    elif device is not None or link is not None or accounting is not None or stack is not None:
        raise ConfigError(
            "simulate() takes a target or device/link/accounting/stack, not both: the target "
            "already names them (build another with Target.for_device(...))."
        )
    device, link, accounting, stack = target.device, target.link, target.accounting, target.stack
    check_allocator(allocator, accounting)
    if plan is not None and not isinstance(plan, SwapPlan):
        raise ConfigError(f"plan must be a tflms.SwapPlan or None, got {type(plan).__name__}.")
    target = view
    if plan is not None and not plan.empty:
        target = apply_to_view(view, plan, levels=False)  # the simulator reads no level
    if order is not None and (isinstance(order, str) or not all(isinstance(o, str) for o in order)):
        raise ConfigError(
            "order must be a sequence of op names (e.g. measure_cpu_step(...).order). "
            f"Received {type(order).__name__}."
        )
    result = _run(target, device, link, accounting, allocator, order, stack)
    before = None
    if isinstance(baseline, SimulationResult):
        before = baseline
    elif baseline and plan is not None and not plan.empty:
        before = _run(view, device, link, accounting, allocator, order, stack)
    return finished(view, result, before)


def finished(
    view: nx.DiGraph, result: SimulationResult, before: SimulationResult | None
) -> SimulationResult:
    """``result`` with the per-sample flag and the baseline ``before`` (if any) set; logged.

    Args:
        view: The view as given to :func:`simulate` (before any plan).
        result: The simulation of ``view`` or of its rewrite.
        before: The simulation without swaps, or None.

    Returns:
        The result :func:`simulate` returns.
    """
    if view.graph.get("unsized_batch") and view.graph.get("batch_size") is None:
        logger.warning(
            "tflms.simulate %s: the batch size is unknown; %d tensors are sized per sample, so "
            "the peak is too small. Build the view with batch_size=N.",
            result.graph_name,
            len(view.graph["unsized_batch"]),
        )
        result = _replace(result, per_sample=True)
    if before is not None:
        overhead = result.step_time_s / before.step_time_s - 1 if before.step_time_s else 0.0
        result = _replace(
            result,
            baseline=before,
            baseline_step_time_s=before.step_time_s,
            overhead=overhead,
        )
    logger.info(
        "tflms.simulate %s: device peak %s, step %.2f ms (%+.1f%%)",
        result.graph_name,
        format_bytes(result.device_peak_bytes),
        result.step_time_s * 1e3,
        result.overhead * 100,
    )
    return result


def _replace(result: SimulationResult, **changes) -> SimulationResult:
    import dataclasses

    return dataclasses.replace(result, **changes)


def _run(
    view: nx.DiGraph, device, link, accounting, allocator, order=None, stack=None
) -> SimulationResult:
    graph = compile_view(view, device=device, link=link, bypass_identity_n=accounting != "grappler")
    return run_compiled(view, graph, accounting, allocator, order, stack)


def run_compiled(
    view: nx.DiGraph, graph: CompiledGraph, accounting, allocator, order=None, stack=None
) -> SimulationResult:
    """Schedule and trace ``graph``, compiled from ``view`` (see :func:`simulate`).

    Args:
        view: The view ``graph`` was compiled from.
        graph: The compiled view; its device and link are the simulation's.
        accounting: As for :func:`simulate`.
        allocator: As for :func:`simulate`.
        order: As for :func:`simulate`.
        stack: A :class:`~tflms.cost.gpu_memory.SoftwareStack` or None for ``"tf2"``.

    Returns:
        The :class:`SimulationResult` (no baseline, no per-sample flag).
    """
    device, link = graph.device, graph.link
    schedule = first_ready(graph) if order is None else replayed(graph, order)
    memory = trace_memory(
        graph, schedule, accounting=accounting, allocator=allocator, stack=stack or "tf2"
    )
    names = graph.names
    peak_index = memory.ops[memory.device_peak_point] if memory.ops else None
    outs = [i for i, kind in enumerate(graph.copy) if kind == "d2h"]
    ins = [i for i, kind in enumerate(graph.copy) if kind == "h2d"]
    logger.debug(
        "simulated %d ops of %s: makespan %.3f ms, lanes %s",
        len(graph),
        view.graph.get("name", ""),
        schedule.makespan * 1e3,
        schedule.lanes,
    )
    return SimulationResult(
        graph_name=str(view.graph.get("name", "")),
        device=device.name,
        link=link.name,
        accounting=accounting,
        allocator=allocator,
        device_peak_bytes=memory.device_peak,
        host_peak_bytes=memory.host_peak,
        peak_op=names[peak_index] if peak_index is not None else "",
        peak_op_type=graph.types[peak_index] if peak_index is not None else "",
        peak_time_s=memory.times[memory.device_peak_point] if memory.ops else 0.0,
        variable_bytes=memory.variable_bytes,
        live_at_peak=memory.live_at_peak,
        timeline_ops=tuple(names[i] for i in memory.ops),
        timeline_s=memory.times,
        timeline_device=memory.device,
        timeline_host=memory.host,
        bytes_swapped_out=sum(sum(t.bytes for t in graph.outputs[i]) for i in outs),
        bytes_swapped_in=sum(sum(t.bytes for t in graph.outputs[i]) for i in ins),
        swap_outs=len(outs),
        swap_ins=len(ins),
        step_time_s=schedule.makespan,
        compute_time_s=schedule.lanes.get("compute", 0.0),
        copy_time_s={lane: schedule.lanes.get(lane, 0.0) for lane in ("d2h", "h2d")},
        memory_terms=dict(memory.terms),
        allocator_limit_bytes=memory.allocator_limit,
        stack=stack.name if memory.terms and stack is not None else None,
        host_variable_bytes=memory.host_variable_bytes,
    )
