"""Cross-check the simulator against TensorFlow's own (Grappler) estimate.

:func:`crosscheck` runs one graph (with or without swap ops) through both
simulators and returns the peaks side by side. Like is compared with like:

* ``ours_bytes``: our schedule and time model, Grappler's memory conventions
  (every output a fresh buffer, variable reads included, variables weigh 0,
  whole-microsecond times, buffers freed 1 ns after their last consumer) and
  free transfers (``link="ideal"``), as Grappler has them. This is the number
  that must agree with ``grappler_peak_bytes``.
* ``ours_on_grappler_schedule_bytes``: our memory model replayed on the
  schedule Grappler itself computed (``VirtualCluster.MeasureCosts``). It
  isolates the memory model from the schedule: any difference left is a
  difference in tensor sizes (see ``size_mismatches``).
* ``ours_tensorflow_bytes``: what tflms predicts for a GPU (resident
  variables, ``Identity``/``Reshape`` sharing their input's buffer), to set
  beside ``grappler_peak_with_variables_bytes``, Grappler's peak with the
  variable reads replaced by resident variables. The two differ by design
  where Grappler charges copies that TensorFlow does not make.

Every number is simulated; none comes from a GPU.

Example:
    >>> import tensorflow as tf
    >>> @tf.function
    ... def step(x):
    ...     h = tf.nn.relu(x)
    ...     return tf.reduce_sum(tf.tanh(h) * h)
    >>> graph = step.get_concrete_function(tf.TensorSpec([4096, 256])).graph
    >>> check = crosscheck(graph)
    >>> check.ours_bytes == check.grappler_peak_bytes
    True
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import tensorflow as tf

from tflms.cost.target import DEFAULT_DEVICE
from tflms.errors import UnsupportedGraphError
from tflms.graph.view import build_view
from tflms.simulation import grappler as _grappler
from tflms.simulation.memory import trace_memory
from tflms.simulation.schedule import Schedule, compile_view
from tflms.simulation.simulator import SIMULATOR, simulate

__all__ = ["CrossCheck", "GrapplerTimeline", "crosscheck", "grappler_timeline"]


@dataclass(frozen=True)
class GrapplerTimeline:
    """Grappler's own schedule of a graph on its virtual cluster.

    Attributes:
        ops: ``{node name: (device, start seconds, end seconds)}``.
        sizes: ``{node name: [bytes of each output]}`` as Grappler sized them.
        step_time_s: the makespan Grappler predicts.
    """

    ops: dict
    sizes: dict
    step_time_s: float


@dataclass(frozen=True)
class CrossCheck:
    """Our peaks next to Grappler's for one graph (see the module docstring).

    Attributes:
        graph_name: the graph's name.
        swap_ops: tflms swap ops in the graph.
        grappler_peak_bytes: Grappler's device peak.
        grappler_peak_with_variables_bytes: the same with resident variables
            instead of the variable reads live at the peak.
        ours_bytes: our peak under Grappler's conventions.
        ours_on_grappler_schedule_bytes: our memory model on Grappler's schedule.
        ours_tensorflow_bytes: our peak as tflms predicts it for a GPU.
        size_mismatches: outputs Grappler sized differently from the view.
        size_mismatch_bytes: the sum of those differences (ours minus Grappler's).
        grappler_step_time_s, ours_step_time_s: predicted step times.
        grappler_simulator, simulator: who computed what.
    """

    graph_name: str
    swap_ops: int
    grappler_peak_bytes: int
    grappler_peak_with_variables_bytes: int
    ours_bytes: int
    ours_on_grappler_schedule_bytes: int
    ours_tensorflow_bytes: int
    size_mismatches: int
    size_mismatch_bytes: int
    grappler_step_time_s: float
    ours_step_time_s: float
    grappler_simulator: str = _grappler.SIMULATOR
    simulator: str = SIMULATOR

    @property
    def relative_error(self) -> float:
        """``ours_bytes / grappler_peak_bytes - 1``."""
        return self.ours_bytes / self.grappler_peak_bytes - 1 if self.grappler_peak_bytes else 0.0

    @property
    def schedule_free_error(self) -> float:
        """``ours_on_grappler_schedule_bytes / grappler_peak_bytes - 1``."""
        if not self.grappler_peak_bytes:
            return 0.0
        return self.ours_on_grappler_schedule_bytes / self.grappler_peak_bytes - 1

    @property
    def tensorflow_vs_grappler(self) -> float:
        """``ours_tensorflow_bytes / grappler_peak_with_variables_bytes - 1``."""
        reference = self.grappler_peak_with_variables_bytes
        return self.ours_tensorflow_bytes / reference - 1 if reference else 0.0

    def to_dict(self) -> dict:
        """JSON-ready values, the relative errors included."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            simulated=True,
            relative_error=self.relative_error,
            schedule_free_error=self.schedule_free_error,
            tensorflow_vs_grappler=self.tensorflow_vs_grappler,
        )
        return data


def grappler_timeline(
    graph,
    *,
    device: str = _grappler.VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
    slowdown: int = 1,
) -> GrapplerTimeline:
    """Grappler's schedule and tensor sizes for ``graph`` on its virtual cluster.

    The graph is prepared exactly as :func:`tflms.simulation.grappler.grappler_peak`
    prepares it (placement, fetches, variable shapes).

    Args:
        graph: a ``tf.Graph`` or ``FuncGraph``.
        device: the virtual GPU.
        host_device: the virtual host.
        batch_size: replaces an unknown leading placeholder dimension.
        slowdown: divide the virtual devices' speed by this factor (as for
            :func:`tflms.simulation.grappler.grappler_peak`).

    Returns:
        A :class:`GrapplerTimeline`.
    """
    prepared = _grappler.prepare_metagraph(graph, None, device, host_device, batch_size, None)
    _grappler.warn_black_boxes(prepared)
    item = _grappler.make_item(prepared.metagraph)
    cluster = _grappler.make_cluster(
        device, host_device, _grappler.VIRTUAL_GPU_BYTES, slowdown=slowdown, timeline=True
    )
    try:
        _, run_time, step_stats = cluster.MeasureCosts(item)
    except tf.errors.OpError as err:
        raise UnsupportedGraphError(f"Grappler could not schedule the graph: {err}") from err
    finally:
        cluster.Shutdown()
    ops, sizes = {}, {}
    for dev in step_stats.dev_stats:
        for stats in dev.node_stats:
            start = stats.all_start_nanos * 1e-9
            ops[stats.node_name] = (dev.device, start, start + stats.op_end_rel_nanos * 1e-9)
            sizes[stats.node_name] = [
                out.tensor_description.allocation_description.allocated_bytes
                for out in stats.output
            ]
    return GrapplerTimeline(ops=ops, sizes=sizes, step_time_s=float(run_time))


def crosscheck(
    graph, *, batch_size: int | None = None, config=None, slowdown: int = 1
) -> CrossCheck:
    """Simulate ``graph`` with tflms and with Grappler and compare the peaks.

    Args:
        graph: a ``tf.Graph``/``FuncGraph``, with or without tflms swap ops
            (rewrite a fresh trace with :func:`tflms.apply_plan` first).
        batch_size: sizes an unknown batch dimension, for both simulators
            (``config.batch_size`` wins: :data:`tflms.graph.view.BATCH_RULE`).
        config: an :class:`~tflms.LMSConfig` naming the host device.
        slowdown: slow Grappler's virtual devices down by this factor. Grappler
            keeps whole microseconds, so ops shorter than 1 us start "at once"
            and their buffers pile up; our times differ from Grappler's, so on
            graphs of tiny ops use e.g. ``slowdown=100`` to compare schedules
            rather than rounding artifacts.

    Returns:
        A :class:`CrossCheck`.
    """
    view = build_view(graph, config=config, batch_size=batch_size)
    batch_size = view.graph["batch_size"]  # by the batch rule (config first): both sides alike
    host = config.host_device if config is not None else "/device:CPU:0"
    peak = _grappler.grappler_peak(
        graph, batch_size=batch_size, host_device=host, slowdown=slowdown
    )
    timeline = grappler_timeline(graph, batch_size=batch_size, host_device=host, slowdown=slowdown)
    ours = simulate(view, link="ideal", accounting="grappler")
    realistic = simulate(view, link="ideal")

    scheduled = view.subgraph([n for n in view if n in timeline.ops]).copy()
    compiled = compile_view(scheduled, device=DEFAULT_DEVICE, link="ideal", bypass_identity_n=False)
    start = [timeline.ops[name][1] for name in compiled.names]
    end = [timeline.ops[name][2] for name in compiled.names]
    order = tuple(sorted(range(len(compiled)), key=lambda i: (start[i], end[i], compiled.names[i])))
    replay = trace_memory(
        compiled,
        Schedule(order=order, start=start, end=end, lanes={}, makespan=max(end, default=0.0)),
        accounting="grappler",
    )

    mismatches, mismatch_bytes = 0, 0
    for name, data in view.nodes(data=True):
        theirs = timeline.sizes.get(name)
        if theirs is None or data["type"] in ("Placeholder", "VarHandleOp"):
            continue
        for info, size in zip(data["outputs"], theirs, strict=False):
            if info.bytes != size:
                mismatches += 1
                mismatch_bytes += info.bytes - size
    return CrossCheck(
        graph_name=str(view.graph.get("name", "")),
        swap_ops=sum(1 for _, d in view.nodes(data=True) if d.get("tflms")),
        grappler_peak_bytes=peak.peak_bytes,
        grappler_peak_with_variables_bytes=peak.peak_with_variables_bytes,
        ours_bytes=ours.device_peak_bytes,
        ours_on_grappler_schedule_bytes=replay.device_peak,
        ours_tensorflow_bytes=realistic.device_peak_bytes,
        size_mismatches=mismatches,
        size_mismatch_bytes=mismatch_bytes,
        grappler_step_time_s=timeline.step_time_s,
        ours_step_time_s=realistic.step_time_s,
    )
