"""Grappler bridge: TensorFlow's own GPU memory simulator and optimizer, offline.

There is no GPU on our machines, so TensorFlow's Grappler is the independent
reference for GPU peak memory. :func:`grappler_peak` places a graph on a
virtual GPU (``VirtualCluster``, ``DeterminePeakMemoryUsage``) and
:func:`grappler_optimize` runs Grappler's default optimizer pipeline on it, as
TensorFlow would on a GPU machine. Both build the same MetaGraph: fetches
registered as ``train_op``, ops placed on ``host_device`` kept on a virtual
CPU, every other op on the virtual GPU, captured variables turned into
``VarHandleOp`` nodes that carry their shapes. Every number is simulated.

How Grappler counts (read from the TF sources, measured on TF 2.21 and checked
by ``tests/tflms/test_grappler.py``):

* Schedule: the analytical cost model times each op; a FirstReady scheduler
  runs ready ops in order of readiness (ties by name). ``GraphMemory`` then
  charges every output a fresh buffer from its producer's start until 1 ns
  after its last *data* consumer ends (control edges never extend a life).
* Resolution: times are whole microseconds. Ops shorter than 1 us start "at
  once", so on tiny graphs the peak approaches the sum of all tensors; use
  tensors of about 1 MB or more, or ``slowdown=100``.
* The next op starts exactly when its predecessor ends, so its outputs overlap
  the predecessor's dying inputs for 1 ns: the peak includes them.
* Check by hand: a training step of L layers ``relu(h @ W)`` (activations of
  A bytes, weights of W bytes, loss ``sum``, SGD) peaks at exactly
  (L + 4) A + (L - 1) W + 4 L + 8 bytes: the input and the L ReLU outputs kept
  for the backward pass, the upstream gradient, the first ReluGrad, the last
  pre-activation (the overlap above); the reads of W_1..W_L-1; scalars.
* Shapes: a placeholder dimension left unknown is sized as 1 (Grappler feeds a
  fake tensor of that size), so the peak is silently too small. Hence
  ``batch_size`` / ``input_shapes``, and an error while one stays unknown.
* Inputs and constants: allocated at time 0, freed after their last consumer.
* Variables and optimizer slots are not persistent memory there: a resource
  handle weighs 0 bytes and each ``ReadVariableOp`` output is a new buffer from
  the read to its last consumer. Reads need only the handle, so they run at
  time 0: an Adam slot read for the update at the end is charged the whole
  step, and a weight whose read is dead at the peak is not counted at all.
  :attr:`GrapplerPeak.variable_bytes` and
  :attr:`GrapplerPeak.peak_with_variables_bytes` correct for this.
* Identity is a copy, on either device (a new buffer, the input kept until it
  ends), yet costs no time, and neither do ``_Send``/``_Recv``: transfers are
  free, so Grappler says nothing about swap overhead. Across devices the source
  tensor lives on its device until the remote consumer ends, and the ``_Recv``
  buffer is charged on the receiving device only for its own instant: one
  swapped tensor of A bytes costs the host 2 A (``_Recv`` buffer + Identity).
* Swapping: routing an activation through an Identity on the host and back
  saves nothing without a trigger (the swap-in runs as soon as the data is
  there) and saves exactly A with a control edge from a late backward op.
* Only the fan-in of the fetches is simulated. Function calls and functional
  control flow (``PartitionedCall``, ``While``...) are black boxes: run
  ``grappler_peak(grappler_optimize(g))`` to inline them first (the item is
  otherwise simulated unoptimized: no folding, fusion or layout change).
* Grappler's dependency optimizer deletes Identity ops, even across devices
  and with a control trigger, unless they carry ``_grappler_do_not_remove``
  (honoured: ``GrapplerItem::NodesToPreserve``). It skips graphs under 4 nodes
  unless ``min_graph_nodes=-1``, which :func:`grappler_optimize` sets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2
from tensorflow.core.protobuf import config_pb2, device_properties_pb2, meta_graph_pb2
from tensorflow.python.grappler import cluster as gcluster
from tensorflow.python.grappler import item as gitem
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.ops import handle_data_util

from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.proto_ops import to_var_handle

__all__ = [
    "GIB",
    "SIMULATOR",
    "LiveTensor",
    "GrapplerPeak",
    "grappler_peak",
    "grappler_optimize",
    "virtual_gpu",
    "virtual_cpu",
]

logger = logging.getLogger(__name__)

GIB = 1 << 30
_UNLIMITED = 1 << 50  # 1 PiB: the virtual device size that never refuses a graph
SIMULATOR = f"grappler VirtualCluster + GraphMemory.InferStatically (TF {tf.__version__})"
_RESOURCE = types_pb2.DT_RESOURCE
_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
_BLACK_BOXES = (
    "PartitionedCall",
    "StatefulPartitionedCall",
    "While",
    "StatelessWhile",
    "If",
    "StatelessIf",
    "Case",
    "StatelessCase",
)


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
        """Bytes live on ``device`` at its peak from nodes named ``prefix...``."""
        return sum(t.bytes for t in self.live_tensors if t.node.startswith(prefix))


def virtual_gpu(memory_bytes: int = 16 * GIB) -> device_properties_pb2.DeviceProperties:
    """Properties of a V100-like virtual GPU: 80 SMs at 1530 MHz, 900 GB/s.

    Args:
        memory_bytes: device memory; Grappler only compares the peak with it.

    Returns:
        A ``DeviceProperties`` proto of type ``GPU``.
    """
    return device_properties_pb2.DeviceProperties(
        type="GPU",
        vendor="NVIDIA",
        model="virtual V100",
        frequency=1530,  # MHz
        num_cores=80,
        environment={"architecture": "7.0"},
        num_registers=65536,
        l1_cache_size=128 << 10,
        l2_cache_size=6 << 20,
        shared_memory_size_per_multiprocessor=96 << 10,
        memory_size=memory_bytes,
        bandwidth=900_000_000,  # KB/s
    )


def virtual_cpu(memory_bytes: int = 256 * GIB) -> device_properties_pb2.DeviceProperties:
    """Properties of a virtual host: 20 cores at 2600 MHz, 100 GB/s.

    Args:
        memory_bytes: host memory size.

    Returns:
        A ``DeviceProperties`` proto of type ``CPU``.
    """
    return device_properties_pb2.DeviceProperties(
        type="CPU", frequency=2600, num_cores=20, memory_size=memory_bytes, bandwidth=100_000_000
    )


def grappler_peak(
    graph_or_graphdef,
    *,
    fetches=None,
    device: str = "/device:GPU:0",
    host_device: str = "/device:CPU:0",
    gpu_memory_bytes: int = 16 * GIB,
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
        >>> from tflms.grappler import grappler_peak
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
    prepared = _prepare(graph_or_graphdef, fetches, device, host_device, batch_size, input_shapes)
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
    item = _item(prepared.metagraph)
    # Grappler refuses (ResourceExhausted) a graph whose peak exceeds the device's memory;
    # simulate on a device large enough for any graph and judge `fits` against the real size.
    cluster = _cluster(
        device,
        host_device,
        max(gpu_memory_bytes, _UNLIMITED),
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


def grappler_optimize(
    graph_or_graphdef,
    *,
    fetches=None,
    device: str = "/device:GPU:0",
    host_device: str = "/device:CPU:0",
    gpu_memory_bytes: int = 16 * GIB,
    batch_size: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    config: config_pb2.ConfigProto | None = None,
    optimizers: Iterable[str] | None = None,
) -> graph_pb2.GraphDef:
    """Run Grappler's optimizer pipeline offline, as on a machine with a GPU.

    The MetaGraph is built as for :func:`grappler_peak` (same placement, same
    fetches kept), so the result shows what TensorFlow would run: inserted
    Identity ops survive only with ``_grappler_do_not_remove``, function calls
    are inlined, and the layout optimizer may add NHWC/NCHW transposes on the
    GPU. Feed the result to :func:`grappler_peak` for the optimized peak.

    Args:
        graph_or_graphdef: as for :func:`grappler_peak`.
        fetches: as for :func:`grappler_peak`; Grappler never removes them.
        device: name of the virtual GPU.
        host_device: the graph's host device; it becomes a virtual CPU.
        gpu_memory_bytes: memory size of the virtual GPU.
        batch_size: as for :func:`grappler_peak` (optional here).
        input_shapes: as for :func:`grappler_peak` (optional here).
        config: a ``ConfigProto`` whose ``graph_options.rewrite_options`` steer
            Grappler. Default: TensorFlow's defaults with ``min_graph_nodes=-1``.
        optimizers: names of the only optimizers to run, e.g. ``["dependency"]``.

    Returns:
        The optimized ``GraphDef``, its nodes placed on ``device``/``host_device``.

    Raises:
        UnsupportedGraphError: the input is not a graph or is empty, or
            Grappler rejects it.
        ConfigError: a keyword has an invalid value.

    Example:
        >>> import tensorflow as tf
        >>> from tflms.grappler import grappler_optimize
        >>> @tf.function
        ... def step(x):
        ...     return tf.reduce_sum(tf.identity(tf.nn.relu(x), name="copy"))
        >>> graph = step.get_concrete_function(tf.TensorSpec([8, 8])).graph
        >>> sorted(node.op for node in grappler_optimize(graph).node)
        ['Const', 'Identity', 'Placeholder', 'Relu', 'Sum']
        >>> "copy" in {node.name for node in grappler_optimize(graph).node}
        False
    """
    prepared = _prepare(graph_or_graphdef, fetches, device, host_device, batch_size, input_shapes)
    options = config_pb2.ConfigProto()
    if config is None:
        options.graph_options.rewrite_options.min_graph_nodes = -1
    else:
        options.CopyFrom(config)
    if optimizers is not None:
        rewrite = options.graph_options.rewrite_options
        del rewrite.optimizers[:]
        rewrite.optimizers.extend(optimizers)
    cluster = _cluster(device, host_device, gpu_memory_bytes, None, None, 1)
    try:
        optimized = tf_optimizer.OptimizeGraph(
            options, prepared.metagraph, verbose=False, cluster=cluster
        )
    except tf.errors.OpError as err:
        raise UnsupportedGraphError(f"Grappler could not optimize the graph: {err}") from err
    finally:
        cluster.Shutdown()
    logger.info("Grappler optimized %d nodes into %d", prepared.nodes, len(optimized.node))
    return optimized


# --------------------------------------------------------------------------- MetaGraph


@dataclass
class _Prepared:
    metagraph: meta_graph_pb2.MetaGraphDef
    fetches: tuple[str, ...]
    nodes: int = 0
    variable_bytes: int = 0
    reads: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)


def _prepare(graph, fetches, device, host_device, batch_size, input_shapes) -> _Prepared:
    """Copy the graph into a MetaGraphDef that Grappler can run offline."""
    _device_spec(device, "GPU", "device")
    host = _device_spec(host_device, "CPU", "host_device")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
    ):
        raise ConfigError(f"batch_size must be a positive int. Received batch_size={batch_size!r}.")
    graph_def, handles, default_fetches = _source(graph)
    if not graph_def.node:
        raise UnsupportedGraphError(
            "The graph has no nodes, so Grappler has nothing to simulate. Pass the graph of "
            "a traced step, e.g. `step.get_concrete_function(*specs).graph`."
        )
    names = {node.name for node in graph_def.node}
    fetch_names = _fetch_names(fetches, names) if fetches is not None else default_fetches
    fetch_names = fetch_names or _sinks(graph_def)
    shapes = {_node_name(key): list(value) for key, value in (input_shapes or {}).items()}
    placeholders = {node.name for node in graph_def.node if node.op == "Placeholder"}
    if set(shapes) - placeholders:
        raise ConfigError(
            f"input_shapes names {sorted(set(shapes) - placeholders)}, which are not "
            f"placeholders of the graph. Its placeholders are {sorted(placeholders)[:10]}."
        )
    prepared = _Prepared(meta_graph_pb2.MetaGraphDef(), fetch_names, nodes=len(graph_def.node))
    for node in graph_def.node:
        on_host = _is_host(node.device, host)
        node.device = host_device if on_host else device
        if node.op == "Placeholder" and node.attr["dtype"].type == _RESOURCE:
            if node.name in handles:
                _to_var_handle(node, handles[node.name])
            else:
                prepared.unknown.append(f"{node.name} (a variable of unknown shape)")
        elif node.op == "Placeholder":
            _set_shape(node, shapes.get(node.name), batch_size, prepared.unknown)
        if node.op in _VARIABLE_OPS and not on_host:
            prepared.variable_bytes += _shape_bytes(
                node.attr["dtype"].type, node.attr["shape"].shape
            )
        if node.op == "ReadVariableOp":
            prepared.reads.add(node.name)
        if node.op in _BLACK_BOXES:
            logger.warning(
                "Grappler simulates %s %r as one op, not its body; run grappler_optimize first "
                "to inline it",
                node.op,
                node.name,
            )
    prepared.metagraph.graph_def.CopyFrom(graph_def)
    prepared.metagraph.collection_def["train_op"].node_list.value.extend(fetch_names)
    logger.debug("Grappler MetaGraph: %d nodes, fetches %s", len(graph_def.node), fetch_names)
    return prepared


def _source(graph):
    """(GraphDef copy, variable handle data by placeholder name, default fetches)."""
    if isinstance(graph, tf.types.experimental.ConcreteFunction):
        graph = graph.graph
    if isinstance(graph, tf.Graph):
        handles = {}
        for op in graph.get_operations():
            if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource:
                data = handle_data_util.get_resource_handle_data(op.outputs[0])
                if data is not None and data.is_set and data.shape_and_type:
                    handles[op.name] = data.shape_and_type[0]
        if hasattr(graph, "control_outputs"):  # a FuncGraph
            names = [t.op.name for t in graph.outputs] + [op.name for op in graph.control_outputs]
        else:
            names = [_node_name(t) for t in graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)]
        return graph.as_graph_def(), handles, tuple(dict.fromkeys(names))
    if isinstance(graph, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(graph)
        return graph_def, {}, ()
    raise UnsupportedGraphError(
        "Grappler needs a tf.Graph, a FuncGraph, a ConcreteFunction or a GraphDef. "
        f"Received a {type(graph).__name__}: {graph!r:.60}. Pass for example "
        "`step.get_concrete_function(*specs).graph` for a @tf.function `step`."
    )


def _fetch_names(fetches, names) -> tuple[str, ...]:
    if isinstance(fetches, (str, tf.Tensor, tf.Operation)):
        fetches = [fetches]
    fetch_names = tuple(dict.fromkeys(_node_name(f) for f in fetches))
    if not fetch_names:
        raise ConfigError("fetches=[] fetches nothing. Pass None to fetch the graph's sinks.")
    missing = [name for name in fetch_names if name not in names]
    if missing:
        raise ConfigError(
            f"fetches {missing} are not nodes of the graph, whose {len(names)} nodes include "
            f"{sorted(names)[:5]}. Pass existing node or tensor names, e.g. "
            f"fetches=[{sorted(names)[-1]!r}]."
        )
    return fetch_names


def _node_name(fetch) -> str:
    if isinstance(fetch, (tf.Tensor, tf.Operation)):
        fetch = fetch.name
    if not isinstance(fetch, str) or not fetch:
        raise ConfigError(
            "A fetch or input name must be a node or tensor name, a tf.Tensor or a "
            f"tf.Operation. Received {fetch!r}."
        )
    return fetch.lstrip("^").split(":")[0]


def _sinks(graph_def) -> tuple[str, ...]:
    consumed = {_node_name(name) for node in graph_def.node for name in node.input}
    return tuple(node.name for node in graph_def.node if node.name not in consumed)


def _set_shape(node, shape, batch_size, unknown) -> None:
    proto = node.attr["shape"].shape
    if shape is not None:
        proto.Clear()
        for size in shape:
            proto.dim.add().size = -1 if size is None else int(size)
    elif batch_size is not None and not proto.unknown_rank and proto.dim and proto.dim[0].size < 0:
        proto.dim[0].size = batch_size
    if proto.unknown_rank or any(dim.size < 0 for dim in proto.dim):
        described = (
            "<unknown rank>"
            if proto.unknown_rank
            else [None if dim.size < 0 else dim.size for dim in proto.dim]
        )
        unknown.append(f"{node.name} {described}")


def _to_var_handle(node, data) -> None:
    """Turn a captured-variable placeholder into a VarHandleOp carrying its shape."""
    to_var_handle(node, data.dtype, data.shape)


def _shape_bytes(dtype: int, shape) -> int:
    if shape.unknown_rank or any(dim.size < 0 for dim in shape.dim):
        return 0
    count = 1
    for dim in shape.dim:
        count *= dim.size
    return count * tf.as_dtype(dtype).size


def _is_host(node_device: str, host: tf.DeviceSpec) -> bool:
    if not node_device:
        return False
    spec = tf.DeviceSpec.from_string(node_device)
    return (spec.device_type or "").upper() == host.device_type.upper() and (
        spec.device_index or 0
    ) == (host.device_index or 0)


def _device_spec(name, kind: str, keyword: str) -> tf.DeviceSpec:
    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError, AttributeError) as err:
        raise ConfigError(
            f"{keyword}={name!r} is not a device name ({err}). Use e.g. '/device:{kind}:0'."
        ) from err
    if (spec.device_type or "").upper() != kind:
        raise ConfigError(
            f"{keyword} must name a {kind} device, e.g. '/device:{kind}:0'. "
            f"Received {keyword}={name!r}."
        )
    return spec


# --------------------------------------------------------------------------- Grappler


def _cluster(device, host_device, memory_bytes, gpu_properties, cpu_properties, slowdown):
    if isinstance(slowdown, bool) or not isinstance(slowdown, int) or slowdown < 1:
        raise ConfigError(f"slowdown must be an int >= 1. Received slowdown={slowdown!r}.")
    gpu = device_properties_pb2.DeviceProperties()
    gpu.CopyFrom(gpu_properties or virtual_gpu())
    gpu.memory_size = memory_bytes
    cpu = device_properties_pb2.DeviceProperties()
    cpu.CopyFrom(cpu_properties or virtual_cpu())
    for props in (gpu, cpu):
        if props.frequency:
            props.frequency = max(1, props.frequency // slowdown)
        if props.bandwidth:
            props.bandwidth = max(1, props.bandwidth // slowdown)
    return gcluster.Cluster(
        devices=[
            device_properties_pb2.NamedDevice(name=device, properties=gpu),
            device_properties_pb2.NamedDevice(name=host_device, properties=cpu),
        ]
    )


def _item(metagraph):
    try:
        return gitem.Item(metagraph)
    except (tf.errors.OpError, ValueError) as err:
        raise UnsupportedGraphError(
            f"Grappler could not build an item from the graph: {err}. Check that every "
            "placeholder has a dtype and a shape."
        ) from err


def _live(raw, device) -> tuple[LiveTensor, ...]:
    tensors = (
        LiveTensor(str(node), int(output), int(size), int(start), int(end))
        for node, output, size, start, end in raw.get(device, (0, []))[1]
    )
    return tuple(sorted(tensors, key=lambda t: (-t.bytes, t.node, t.output)))
