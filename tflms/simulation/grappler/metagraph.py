"""Prepare a graph for Grappler: a MetaGraphDef with placement, fetches and shapes.

Ops on ``host_device`` stay on a virtual CPU of that name; every other op
goes to the virtual GPU. Captured variables become ``VarHandleOp`` nodes
that carry their shapes, unknown placeholder dimensions take ``batch_size``
or ``input_shapes``, and the fetches go into the ``train_op`` collection.

Example:
    >>> import tensorflow as tf
    >>> @tf.function
    ... def step(x):
    ...     return tf.reduce_sum(x * 2.0)
    >>> prepared = prepare_metagraph(step.get_concrete_function(tf.TensorSpec([None, 4])).graph,
    ...                              batch_size=8)
    >>> prepared.unknown, len(prepared.fetches)
    ([], 1)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import tensorflow as tf
from tensorflow.core.framework import cpp_shape_inference_pb2, graph_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.ops import handle_data_util

from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.graph.op_signatures import to_var_handle
from tflms.simulation.grappler.devices import VIRTUAL_GPU

__all__ = ["Prepared", "prepare_metagraph", "node_name", "graph_def_with_handles"]

logger = logging.getLogger(__name__)

_RESOURCE = types_pb2.DT_RESOURCE
_HandleShapeAndType = cpp_shape_inference_pb2.CppShapeInferenceResult.HandleShapeAndType
"""What a graph's resource handle data holds per variable (dtype, shape): the same message
whether read from a ``tf.Graph`` or from a GraphDef's attributes."""
_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
HANDLE_DTYPES, HANDLE_SHAPES = "_handle_dtypes", "_handle_shapes"
"""Attributes of a variable's resource placeholder in a GraphDef: its dtype and shape (the
names TensorFlow's function runtime gives its ``_Arg`` nodes; :func:`graph_def_with_handles`)."""
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


@dataclass
class Prepared:
    """A graph ready for Grappler.

    Attributes:
        metagraph: the MetaGraphDef (placed, shaped, fetches in ``train_op``).
        fetches: the nodes the step runs to.
        nodes: number of nodes.
        variable_bytes: bytes of the variables on the GPU.
        reads: names of the ``ReadVariableOp`` nodes.
        unknown: placeholders (and variables) that kept an unknown dimension.
        black_boxes: control-flow and call ops Grappler's simulation takes as one op
            each, not their bodies (``grappler_optimize`` inlines and lowers them).
    """

    metagraph: meta_graph_pb2.MetaGraphDef
    fetches: tuple[str, ...]
    nodes: int = 0
    variable_bytes: int = 0
    reads: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)
    black_boxes: list[str] = field(default_factory=list)


def prepare_metagraph(
    graph,
    fetches=None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    device_kinds: tuple[str, ...] = ("GPU",),
) -> Prepared:
    """Copy ``graph`` into a MetaGraphDef that Grappler can run offline.

    Args:
        graph: a ``tf.Graph``, ``FuncGraph``, ``ConcreteFunction`` or ``GraphDef``.
        fetches: nodes the step runs to (names, tensors or ops); default:
            a FuncGraph's outputs and control outputs, a tf.Graph's
            ``TRAIN_OP`` collection, else the nodes nothing consumes.
        device: name of the virtual GPU.
        host_device: the graph's host device; it stays a virtual CPU.
        batch_size: replaces an unknown leading placeholder dimension.
        input_shapes: full shapes by placeholder name; wins over ``batch_size``.
        device_kinds: the device types ``device`` may name (the memory
            simulation needs a GPU; the optimizer also runs for a CPU).

    Returns:
        A :class:`Prepared`.

    Raises:
        ConfigError: a keyword has an invalid value.
        UnsupportedGraphError: the input is not a graph or is empty.
    """
    _device_spec(device, device_kinds, "device")
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
    shapes = {node_name(key): list(value) for key, value in (input_shapes or {}).items()}
    placeholders = {node.name for node in graph_def.node if node.op == "Placeholder"}
    if set(shapes) - placeholders:
        raise ConfigError(
            f"input_shapes names {sorted(set(shapes) - placeholders)}, which are not "
            f"placeholders of the graph. Its placeholders are {sorted(placeholders)[:10]}."
        )
    prepared = Prepared(meta_graph_pb2.MetaGraphDef(), fetch_names, nodes=len(graph_def.node))
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
            prepared.black_boxes.append(f"{node.op} {node.name!r}")
    prepared.metagraph.graph_def.CopyFrom(graph_def)
    prepared.metagraph.collection_def["train_op"].node_list.value.extend(fetch_names)
    logger.debug("Grappler MetaGraph: %d nodes, fetches %s", len(graph_def.node), fetch_names)
    return prepared


def warn_black_boxes(prepared: Prepared) -> None:
    """Warn that a simulation takes ``prepared``'s control-flow and call ops as one op each.

    Only where Grappler *simulates* the graph (peak, timeline):
    :func:`~tflms.simulation.grappler.optimize.grappler_optimize` inlines and
    lowers them itself.
    """
    if prepared.black_boxes:
        logger.warning(
            "Grappler simulates %d op(s) as one op each, not their bodies (%s%s); run "
            "grappler_optimize first to inline them",
            len(prepared.black_boxes),
            ", ".join(prepared.black_boxes[:3]),
            ", ..." if len(prepared.black_boxes) > 3 else "",
        )


def graph_def_with_handles(graph: tf.Graph) -> graph_pb2.GraphDef:
    """``graph.as_graph_def()`` whose variable placeholders keep their variables' dtype and shape.

    ``as_graph_def`` drops what a resource placeholder knows of its variable,
    so Grappler offline would not know any weight's shape. TensorFlow's
    function runtime gives each ``_Arg`` of a variable ``_handle_dtypes`` and
    ``_handle_shapes``; this GraphDef carries the same attributes, and
    :func:`prepare_metagraph` reads them. Shapes decide rewrites (a sum of
    three tensors becomes one ``AddN`` only when their shapes provably
    agree), so a Grappler check of a GraphDef without them misses rewrites
    that the step's real run makes.

    Args:
        graph: a ``tf.Graph`` or ``FuncGraph``.

    Returns:
        The GraphDef.
    """
    graph_def, handles, _ = _source(graph)
    for node in graph_def.node:
        data = handles.get(node.name)
        if data is not None:
            node.attr[HANDLE_DTYPES].list.type.append(data.dtype)
            node.attr[HANDLE_SHAPES].list.shape.add().CopyFrom(data.shape)
    return graph_def


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
            names = [node_name(t) for t in graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)]
        return graph.as_graph_def(), handles, tuple(dict.fromkeys(names))
    if isinstance(graph, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(graph)
        handles = {
            node.name: _HandleShapeAndType(
                dtype=node.attr[HANDLE_DTYPES].list.type[0],
                shape=node.attr[HANDLE_SHAPES].list.shape[0],
            )
            for node in graph_def.node
            if node.op == "Placeholder"
            and HANDLE_DTYPES in node.attr
            and HANDLE_SHAPES in node.attr
            and len(node.attr[HANDLE_DTYPES].list.type) == 1
            and len(node.attr[HANDLE_SHAPES].list.shape) == 1
        }
        return graph_def, handles, ()
    raise UnsupportedGraphError(
        "Grappler needs a tf.Graph, a FuncGraph, a ConcreteFunction or a GraphDef. "
        f"Received a {type(graph).__name__}: {graph!r:.60}. Pass for example "
        "`step.get_concrete_function(*specs).graph` for a @tf.function `step`."
    )


def _fetch_names(fetches, names) -> tuple[str, ...]:
    if isinstance(fetches, (str, tf.Tensor, tf.Operation)):
        fetches = [fetches]
    fetch_names = tuple(dict.fromkeys(node_name(f) for f in fetches))
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


def node_name(fetch) -> str:
    """The node name of a fetch (``"^a"``, ``"a:1"``, a tensor or an op -> ``"a"``).

    Args:
        fetch: A node or tensor name (control inputs ``"^a"`` allowed), a
            ``tf.Tensor`` or a ``tf.Operation``.

    Returns:
        The node name, without ``^`` and output index.

    Raises:
        ConfigError: ``fetch`` is empty or of another type.
    """
    if isinstance(fetch, (tf.Tensor, tf.Operation)):
        fetch = fetch.name
    if not isinstance(fetch, str) or not fetch:
        raise ConfigError(
            "A fetch or input name must be a node or tensor name, a tf.Tensor or a "
            f"tf.Operation. Received {fetch!r}."
        )
    return fetch.lstrip("^").split(":")[0]


def _sinks(graph_def) -> tuple[str, ...]:
    consumed = {node_name(name) for node in graph_def.node for name in node.input}
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


def _device_spec(name, kinds: str | tuple[str, ...], keyword: str) -> tf.DeviceSpec:
    kinds = (kinds,) if isinstance(kinds, str) else kinds
    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError, AttributeError) as err:
        raise ConfigError(
            f"{keyword}={name!r} is not a device name ({err}). Use e.g. '/device:{kinds[0]}:0'."
        ) from err
    if (spec.device_type or "").upper() not in kinds:
        raise ConfigError(
            f"{keyword} must name a {' or '.join(kinds)} device, e.g. '/device:{kinds[0]}:0'. "
            f"Received {keyword}={name!r}."
        )
    return spec
