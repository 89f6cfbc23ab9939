"""Peak memory of a graph on a virtual GPU, as Grappler's GraphMemory estimates it.

See :mod:`tflms.simulation.grappler` for what Grappler counts and what not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from types import MappingProxyType

import tensorflow as tf
from tensorflow.core.protobuf import device_properties_pb2

from tflms.errors import UnsupportedGraphError
from tflms.simulation.grappler.devices import (
    SIMULATOR,
    UNLIMITED_BYTES,
    VIRTUAL_GPU,
    VIRTUAL_GPU_BYTES,
    make_cluster,
    make_item,
)
from tflms.simulation.grappler.metagraph import prepare_metagraph, warn_black_boxes

__all__ = ["LiveTensor", "GrapplerPeak", "grappler_peak"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveTensor:
    """One tensor Grappler holds on a device at that device's peak.

    Attributes:
        node: name of the node that produces the tensor.
        output: output index of the tensor on ``node``.
        bytes: size Grappler charged for it (0 for resource handles).
        allocated_ns: simulated start of the producer (whole microseconds).
        deallocated_ns: simulated end of the last consumer, plus 1 ns.
    """

    node: str
    output: int
    bytes: int
    allocated_ns: int
    deallocated_ns: int

    @property
    def name(self) -> str:
        """The tensor name, ``node:output``."""
        return f"{self.node}:{self.output}"


@dataclass(frozen=True)
class GrapplerPeak:
    """Peak memory of a graph as simulated by Grappler's virtual cluster.

    Attributes:
        device: the virtual GPU the compute ops were placed on.
        peak_bytes: simulated peak bytes on ``device``.
        per_device: simulated peak bytes of each virtual device (0 if unused).
        live_tensors: tensors live on ``device`` at its peak, largest first.
        host_live_tensors: tensors live on the host at the host's peak.
        memory_bytes: memory size of the virtual GPU.
        variable_bytes: size of the variables on ``device`` (handles Grappler
            charges 0 bytes for).
        read_variable_bytes: bytes of ``ReadVariableOp`` outputs among
            ``live_tensors`` (copies in Grappler's model, aliases on a GPU).
        fetches: nodes the simulation ran to.
        simulator: which simulator produced the numbers, with its TF version.
    """

    device: str
    peak_bytes: int
    per_device: Mapping[str, int]
    live_tensors: tuple[LiveTensor, ...]
    host_live_tensors: tuple[LiveTensor, ...]
    memory_bytes: int
    variable_bytes: int
    read_variable_bytes: int
    fetches: tuple[str, ...]
    simulator: str = SIMULATOR

    @property
    def fits(self) -> bool:
        """Whether the simulated peak (variables excluded) is below ``memory_bytes``."""
        return self.peak_bytes < self.memory_bytes

    @property
    def peak_with_variables_bytes(self) -> int:
        """The peak with resident variables instead of the copies of their reads."""
        return self.peak_bytes - self.read_variable_bytes + self.variable_bytes

    def to_dict(self) -> dict:
        """The result as plain, JSON-ready Python values."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["per_device"] = dict(self.per_device)
        data["live_tensors"] = [asdict(t) for t in self.live_tensors]
        data["host_live_tensors"] = [asdict(t) for t in self.host_live_tensors]
        data["fetches"] = list(self.fetches)
        return data

    def live_bytes(self, prefix: str = "") -> int:
        """Bytes live on ``device`` at its peak from nodes named ``prefix...``.

        Args:
            prefix: Node-name prefix to select; ``""`` counts every live tensor.

        Returns:
            The summed size, in bytes, of the selected tensors live at the peak.
        """
        return sum(t.bytes for t in self.live_tensors if t.node.startswith(prefix))


def grappler_peak(
    graph_or_graphdef,
    *,
    fetches=None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    gpu_memory_bytes: int = VIRTUAL_GPU_BYTES,
    batch_size: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    allow_unknown_shapes: bool = False,
    slowdown: int = 1,
    gpu_properties: device_properties_pb2.DeviceProperties | None = None,
    cpu_properties: device_properties_pb2.DeviceProperties | None = None,
) -> GrapplerPeak:
    """Simulated peak memory of a graph on a virtual GPU, by Grappler.

    Ops placed on ``host_device`` stay on a virtual CPU of that name; every
    other op (no device, a GPU, a compute stand-in such as ``/device:CPU:1``)
    goes to the virtual GPU ``device``. See the module docstring for what
    Grappler counts and what it does not.

    Args:
        graph_or_graphdef: a ``tf.Graph``, a ``FuncGraph`` (e.g.
            ``step.get_concrete_function(*specs).graph``), a ``ConcreteFunction``
            or a ``GraphDef``.
        fetches: nodes the step runs to (names, tensor names, tensors or ops).
            Default: a FuncGraph's outputs and control outputs (its updates), a
            tf.Graph's ``TRAIN_OP`` collection, else every node nothing consumes.
        device: name of the virtual GPU.
        host_device: the graph's host device; it becomes a virtual CPU.
        gpu_memory_bytes: memory size of the virtual GPU.
        batch_size: replaces an unknown leading dimension of every placeholder.
        input_shapes: full shapes by placeholder name; wins over ``batch_size``.
        allow_unknown_shapes: simulate although a placeholder (or a variable)
            keeps an unknown dimension, which Grappler then sizes as 1.
        slowdown: divide the speed of both virtual devices by this factor, to
            spread sub-microsecond ops over Grappler's 1 us time resolution.
        gpu_properties: the GPU's ``DeviceProperties`` (default
            :func:`virtual_gpu`); ``memory_size`` is set to ``gpu_memory_bytes``.
        cpu_properties: the host's ``DeviceProperties`` (default :func:`virtual_cpu`).

    Returns:
        A :class:`GrapplerPeak`.

    Raises:
        UnsupportedGraphError: the input is not a graph or is empty, Grappler
            rejects it, or a shape stays unknown (see ``allow_unknown_shapes``).
        ConfigError: a keyword has an invalid value (unknown fetch, bad device).

    Example:
        >>> import tensorflow as tf
        >>> from tflms.simulation.grappler import grappler_peak
        >>> @tf.function
        ... def step(x):
        ...     return tf.reduce_sum(tf.nn.relu(x) * 2.0)
        >>> graph = step.get_concrete_function(tf.TensorSpec([None, 1024])).graph
        >>> peak = grappler_peak(graph, batch_size=512)
        >>> peak.peak_bytes // (512 * 1024 * 4)  # x, relu(x) and the product
        3
        >>> peak.device, peak.fits
        ('/device:GPU:0', True)
    """
    prepared = prepare_metagraph(
        graph_or_graphdef, fetches, device, host_device, batch_size, input_shapes
    )
    warn_black_boxes(prepared)
    if prepared.unknown and not allow_unknown_shapes:
        raise UnsupportedGraphError(
            f"Grappler needs static shapes, but {prepared.unknown} have unknown dimensions, "
            "which it would size as 1. Pass batch_size=N for an unknown batch dimension, "
            "input_shapes={'name': [...]} for other placeholders, the FuncGraph rather than "
            "its GraphDef for captured variables, or allow_unknown_shapes=True to accept "
            "the undercount."
        )
    if prepared.unknown:
        logger.warning("Grappler sizes unknown dimensions as 1 for %s", prepared.unknown)
    item = make_item(prepared.metagraph)
    # Grappler refuses (ResourceExhausted) a graph whose peak exceeds the device's memory;
    # simulate on a device large enough for any graph and judge `fits` against the real size.
    cluster = make_cluster(
        device,
        host_device,
        max(gpu_memory_bytes, UNLIMITED_BYTES),
        gpu_properties,
        cpu_properties,
        slowdown,
    )
    try:
        raw = cluster.DeterminePeakMemoryUsage(item)
    except tf.errors.OpError as err:
        raise UnsupportedGraphError(f"Grappler could not simulate the graph: {err}") from err
    finally:
        cluster.Shutdown()
    per_device = {name: max(0, int(usage[0])) for name, usage in raw.items()}
    live = _live(raw, device)
    reads = sum(t.bytes for t in live if t.node in prepared.reads)
    result = GrapplerPeak(
        device=device,
        peak_bytes=per_device.get(device, 0),
        per_device=MappingProxyType(per_device),
        live_tensors=live,
        host_live_tensors=_live(raw, host_device),
        memory_bytes=gpu_memory_bytes,
        variable_bytes=prepared.variable_bytes,
        read_variable_bytes=reads,
        fetches=prepared.fetches,
    )
    logger.debug("grappler_peak: %d live tensors on %s at the peak", len(live), device)
    logger.info(
        "Grappler peak on %s: %d bytes (+%d bytes of variables it does not count); host %d bytes",
        device,
        result.peak_bytes,
        result.variable_bytes,
        per_device.get(host_device, 0),
    )
    return result


def _live(raw, device) -> tuple[LiveTensor, ...]:
    tensors = (
        LiveTensor(str(node), int(output), int(size), int(start), int(end))
        for node, output, size, start, end in raw.get(device, (0, []))[1]
    )
    return tuple(sorted(tensors, key=lambda t: (-t.bytes, t.node, t.output)))
