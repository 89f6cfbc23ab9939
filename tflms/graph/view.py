"""Analysis: a networkx view of a TensorFlow graph.

:func:`build_view` reads a ``tf.Graph`` or ``FuncGraph`` (never mutating it)
and returns a ``networkx.DiGraph`` with one node per op, of plain Python
values: what the planner and the simulator work on.

Node attributes:
    ``type`` (op type), ``device`` (as assigned, ``""`` if unassigned),
    ``placement`` (``"compute"``, ``"host"`` or ``"other"``, relative to the
    config's devices), ``outputs`` (a tuple of :class:`TensorInfo`),
    ``level`` (Kahn generation over data and control edges, as TFLMS v2),
    ``control_flow`` (the op is a control-flow op or sits inside a TF1
    while/cond context), ``functions`` (names of functions the op calls),
    ``stateful``, ``tflms`` (``"out"``/``"in"`` for tflms' swap ops, else ``None``),
    ``initializer`` (the op computes a variable's initial value in a function
    being traced, which TensorFlow lifts out of the step: no plan touches it,
    :mod:`tflms.graph.initializers`),
    ``loop`` (``While`` ops only: a :class:`~tflms.graph.loops.LoopLists`),
    ``body`` (``While`` ops only: one iteration of its body as a view, for its
    ops' costs; ``None`` where the body cannot be imported),
    ``equation`` (``Einsum`` ops only: its equation),
    ``variable_bytes`` (a traced step's variable placeholders only: the bytes
    of the variable behind the handle, from its handle data, so that a
    variable read only inside a called function - an optimizer's update
    behind a loss-scale ``cond`` - is still counted where it lives). A
    loop's ``variant`` outputs are sized by the lists they hold at its end
    (the per-iteration tensors kept for the gradient, see
    :mod:`tflms.graph.loops`), ``TensorListFromTensor`` by its copy, a cuDNN
    RNN's reserve space by an estimate (:mod:`tflms.graph.cudnn_rnn`).

Edge attributes: ``tensors``, the ``(output_index, input_index)`` pairs
carried from source to destination; ``control``, a control edge is there.

Graph attributes:
    ``compute_device`` and ``default_device_type`` (where unassigned ops run:
    ``"GPU"`` or ``"CPU"``), ``batch_size`` (for unknown first dims, or
    ``None``), ``batch_source``, ``unknown_dims`` (tensors with unknown
    non-batch dims, counted as 1), ``unsized_batch`` (unknown first dims no
    batch size resolved), ``control_flow_ops``, ``unbounded_loops`` (loops
    whose growing lists have no trip bound or element size),
    ``estimated_reserve_space`` (cuDNN RNN ops whose reserve space is an
    estimate, :mod:`tflms.graph.cudnn_rnn`), ``depth``, ``returns`` (a traced
    function's results: the ops whose outputs it returns and its control
    outputs, sorted; ``None`` for a ``tf.Graph`` and for a function still being
    traced, whose results are not known yet).

Example:
    >>> import tensorflow as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
    ...     y = tf.nn.relu(tf.matmul(x, tf.ones([64, 64])), name="y")
    >>> view = build_view(g, batch_size=8)
    >>> view.nodes["y"]["level"], view.nodes["y"]["outputs"][0].bytes
    (3, 2048)
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from typing import NamedTuple

import networkx as nx
import tensorflow as tf
from tensorflow.python.ops import handle_data_util

from tflms.config import LMSConfig
from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.graph import cudnn_rnn, loops
from tflms.graph.graph_def import graph_from_function_def
from tflms.graph.initializers import initializer_ops
from tflms.utils.devices import DeviceMatcher, canonical, default_compute_type, same_device
from tflms.utils.gc_pause import gc_paused

__all__ = [
    "BATCH_RULE",
    "TensorInfo",
    "build_view",
    "resolve_batch",
    "require_batch_size",
    "consumers",
    "assign_levels",
    "CONTROL_FLOW_TYPES",
    "SWAP_ATTR",
    "CLONE_KINDS",
    "is_gradient_op",
]

logger = logging.getLogger(__name__)

SWAP_ATTR = "_tflms_swap"
"""Attribute set on every op tflms inserts: ``b"out"`` or ``b"in"`` (swaps),
``b"recompute"`` (a recompute clone), ``b"gate"`` (what a clone reads through)
or ``b"hold"`` (the reader a recomputed original keeps; both in
:class:`tflms.plan.entries.Recompute`)."""

CLONE_KINDS = frozenset({"recompute", "gate", "hold"})
"""Kinds of tflms ops a recomputation inserts: they read tensors as ordinary ops do (a
swap-in may feed a clone as it feeds an original)."""

_GRADIENT_SCOPES = ("gradients", "gradient_tape")
_GRADIENT_OP = re.compile(r"Grad(Grad)?(V\d+)?$|Backprop")


def is_gradient_op(name: str, op_type: str) -> bool:
    """Whether an op computes gradients: by its scope (``gradients``, ``gradient_tape``
    or a numbered variant, as ``tf.gradients`` and ``tf.GradientTape`` name them) or by
    its type (``ReluGrad``, ``FusedBatchNormGradV3``, ``Conv2DBackpropInput``, ...).

    Args:
        name: the op's name.
        op_type: its type.

    Returns:
        ``True`` for a gradient op (``StopGradient`` is not one).
    """
    scopes = name.split("/")[:-1]
    return any(s == g or s.startswith(g + "_") for s in scopes for g in _GRADIENT_SCOPES) or bool(
        _GRADIENT_OP.search(op_type)
    )


FUNCTIONAL_CONTROL_FLOW = frozenset(
    {"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase", "For"}
)
V1_CONTROL_FLOW = frozenset(
    {
        "Switch",
        "RefSwitch",
        "Merge",
        "RefMerge",
        "Enter",
        "RefEnter",
        "Exit",
        "RefExit",
        "NextIteration",
        "RefNextIteration",
        "LoopCond",
        "ControlTrigger",
    }
)
CONTROL_FLOW_TYPES = FUNCTIONAL_CONTROL_FLOW | V1_CONTROL_FLOW


class TensorInfo(NamedTuple):
    """Static facts about one op output.

    Attributes:
        name: tensor name, ``"op:index"``.
        index: output index.
        dtype: dtype name (``"float32"``, ``"resource"``, ...).
        shape: static shape as traced; ``None`` entries are unknown dims;
            ``None`` for an unknown rank.
        bytes: estimated size with the batch dimension resolved and other
            unknown dims counted as 1.
        is_ref: the tensor is a TF1 reference type.
    """

    name: str
    index: int  # type: ignore[assignment]  # shadows tuple.index; public field name
    dtype: str
    shape: tuple | None
    bytes: int
    is_ref: bool = False

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


BATCH_RULE = (
    "the batch size unknown first dimensions are sized for: LMSConfig.batch_size when set (the "
    "user's word wins, also as the tflms command's --batch-size); else the batch the front "
    "end knows (the argument: the batch fit feeds, a traced step's static leading "
    "dimension); else the most "
    "common leading dimension of the graph's inputs (its input signature); else unknown, which "
    "the planners refuse (tensor sizes would be per sample)"
)
"""The one rule for the batch size, applied by :func:`resolve_batch` and :func:`build_view`."""


def resolve_batch(
    config: LMSConfig, *known: tuple[int | None, str | None]
) -> tuple[int, str] | None:
    """The batch size and its source by :data:`BATCH_RULE`, before the graph is read.

    Args:
        config: its ``batch_size`` wins when set.
        *known: ``(batch size or None, where it came from)`` pairs the front
            end knows, most trusted first; the first with a size is taken.

    Returns:
        ``(batch size, source)``, or None when neither the config nor the
        front end knows it (the graph's input signature decides then).

    Example:
        >>> resolve_batch(LMSConfig(batch_size=8), (16, "fit"))
        (8, 'LMSConfig.batch_size')
        >>> resolve_batch(LMSConfig(), (None, "fit"), (16, "the traced step"))
        (16, 'the traced step')
        >>> resolve_batch(LMSConfig()) is None
        True
    """
    if config.batch_size is not None:
        return config.batch_size, "LMSConfig.batch_size"
    for size, source in known:
        if size:  # None or a zero-length traced dimension says nothing
            return size, source or "argument"
    return None


def build_view(
    graph: tf.Graph,
    *,
    config: LMSConfig | None = None,
    batch_size: int | None = None,
    batch_source: str | None = None,
) -> nx.DiGraph:
    """Build the analysis view of ``graph``.

    Args:
        graph: a ``tf.Graph`` or ``FuncGraph``. It is only read.
        config: supplies the compute/host devices (for ``placement``) and the
            batch size; defaults to ``LMSConfig()``.
        batch_size: the batch size for unknown first dimensions the caller
            knows (the batch ``fit`` feeds, a traced step's leading
            dimension); ``config.batch_size`` wins over it
            (:data:`BATCH_RULE`).
        batch_source: where ``batch_size`` came from (the view's
            ``batch_source``; default ``"argument"``).

    Returns:
        The annotated ``networkx.DiGraph`` described in the module docstring.

    Raises:
        UnsupportedGraphError: ``graph`` is not a TensorFlow graph, or its
            data and control edges form a cycle that is not a TF1 loop.
    """
    if not isinstance(graph, tf.Graph):
        raise UnsupportedGraphError(
            f"build_view needs a tf.Graph or FuncGraph, got {type(graph).__name__}. "
            "For a tf.function, pass fn.get_concrete_function(...).graph."
        )
    config = config or LMSConfig()
    with gc_paused():
        return _build(graph, config, batch_size, batch_source)


def _captured_devices(graph: tf.Graph, matcher: DeviceMatcher) -> dict[str, str]:
    """The device of each variable a function graph captures, by its placeholder's name.

    A traced step reads variables through placeholders with no device of
    their own; the variable lives where its handle was made (an optimizer
    built on the host keeps its slots there, :mod:`tflms.keras.offload`; a
    model built under :func:`tflms.keras.weights_on_host` its weights).
    """
    devices = {}
    for external, internal in getattr(graph, "captures", ()):
        if internal.dtype == tf.resource and getattr(external, "device", ""):
            devices[internal.op.name] = external.device
    if matcher.compute is not None and not same_device(matcher.compute, matcher.host):
        return devices  # the step runs elsewhere: what lives on the host is the host's
    if len({canonical(d) for d in devices.values()}) < 2:
        return {}  # one device holds every variable (a CPU-only run): they are the step's
    return devices


def _placement(matcher: DeviceMatcher, device: str, captured: str | None) -> str:
    """An op's placement; a captured variable's is its handle's when that is the host."""
    if captured is not None and matcher.placement(captured) == "host":
        return "host"
    return matcher.placement(device)


def _colocate_with_resources(view: nx.DiGraph, host_handles: set[str]) -> None:
    """Place the ops reading a host variable's handle on the host, as TensorFlow's placer does.

    An op taking a resource input runs on the resource's device whatever its
    own device string says (soft placement in functions): the reads of a
    weight kept on the host are host ops, whose outputs cross to the device.
    """
    for handle in host_handles:
        for consumer, data in view.succ[handle].items():
            node = view.nodes[consumer]
            if data["tensors"] and not node["control_flow"] and not node["functions"]:
                node["placement"] = "host"  # (a call or a loop may read several devices)


def _build(graph: tf.Graph, config: LMSConfig, batch_size, batch_source) -> nx.DiGraph:
    matcher = DeviceMatcher(compute=config.device, host=config.host_device)
    ops = graph.get_operations()
    configured = resolve_batch(config, (batch_size, batch_source or "argument"))
    batch, batch_source = _signature_batch(graph, ops, configured)

    # One serialized GraphDef gives names, inputs, control inputs and attrs far
    # faster than per-op Python API calls; shapes and dtypes come from the ops.
    graph_def = graph.as_graph_def()
    node_defs = graph_def.node
    if len(node_defs) != len(ops) or any(
        n.name != op.name for n, op in zip(node_defs, ops, strict=True)
    ):
        by_name = {node.name: node for node in node_defs}
        node_defs = [by_name[op.name] for op in ops]
    view = nx.DiGraph(name=getattr(graph, "name", "graph"))
    unknown_dims: list[str] = []
    unsized_batch: list[str] = []
    captured = _captured_devices(graph, matcher)
    control_flow_ops: list[str] = []
    edges: dict[tuple[str, str], dict] = {}
    for op, node_def in zip(ops, node_defs, strict=True):
        name = node_def.name
        outputs = tuple(
            _tensor_info(t, i, name, batch, unknown_dims, unsized_batch)
            for i, t in enumerate(op.outputs)
        )
        in_cf = op.type in CONTROL_FLOW_TYPES or op._get_control_flow_context() is not None  # noqa: SLF001
        if in_cf:
            control_flow_ops.append(op.name)
        view.add_node(
            name,
            type=node_def.op,
            device=node_def.device,
            placement=_placement(matcher, node_def.device, captured.get(name)),
            outputs=outputs,
            control_flow=in_cf,
            functions=_called_functions(node_def) if node_def.op in _CALLS_FUNCTIONS else (),
            stateful=op._is_stateful,  # noqa: SLF001
            tflms=node_def.attr[SWAP_ATTR].s.decode() if SWAP_ATTR in node_def.attr else None,
        )
        if node_def.op == "Einsum":  # what its kernel transposes (tflms.cost.temporaries)
            view.nodes[name]["equation"] = node_def.attr["equation"].s.decode()
        if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource:
            held = _variable_bytes(op.outputs[0])
            if held:
                view.nodes[name]["variable_bytes"] = held
        in_idx = 0
        for source in node_def.input:
            if source.startswith("^"):
                edge = edges.setdefault((source[1:], name), {"tensors": [], "control": False})
                edge["control"] = True
                continue
            src, _, index = source.rpartition(":")
            if not src or not index.isdigit():
                src, index = source, "0"
            edge = edges.setdefault((src, name), {"tensors": [], "control": False})
            edge["tensors"].append((int(index), in_idx))
            in_idx += 1
    view.add_edges_from((u, v, data) for (u, v), data in edges.items())
    lifted = initializer_ops(view)
    for name, node in view.nodes(data=True):
        node["initializer"] = name in lifted
    _colocate_with_resources(
        view, {n for n in captured if n in view and view.nodes[n]["placement"] == "host"}
    )
    unbounded_loops = _size_lists(view, graph, ops, batch, graph_def.library)

    view.graph.update(
        compute_device=config.device or "",
        default_device_type=default_compute_type(config.device),
        batch_size=batch,
        batch_source=batch_source,
        unknown_dims=unknown_dims,
        unsized_batch=unsized_batch,
        control_flow_ops=control_flow_ops,
        unbounded_loops=unbounded_loops,
        returns=_returns(graph),
    )
    assign_levels(view)
    logger.debug(
        "view of %s: %d ops, %d edges, depth %d, batch %s (%s)",
        view.graph["name"],
        view.number_of_nodes(),
        view.number_of_edges(),
        view.graph["depth"],
        batch,
        batch_source,
    )
    return view


def _returns(graph: tf.Graph) -> tuple[str, ...] | None:
    """The ops whose outputs a traced function returns, and its control outputs, or ``None``.

    A ``tf.Graph`` has no results of its own (a session fetches what it is
    asked for), and a ``FuncGraph`` gets its results only once its Python
    function has returned: neither is known then.
    """
    outputs = list(getattr(graph, "outputs", None) or ())
    control = list(getattr(graph, "control_outputs", None) or ())
    if not outputs and not control:
        return None
    return tuple(sorted({t.op.name for t in outputs} | {op.name for op in control}))


def require_batch_size(view: nx.DiGraph, *, fix: str, reason: str | None = None) -> None:
    """Refuse a view whose tensors could only be sized per sample.

    Planning and simulating judge bytes (``min_tensor_bytes``, memory
    budgets); with an open batch dimension and no batch size those bytes
    would be per sample, silently tens of times too small.

    Args:
        view: an analysis view.
        fix: how to pass the batch size, e.g. ``"LMSConfig(batch_size=N)"``.
        reason: why no batch size was found, if known.

    Raises:
        ConfigError: some tensor has an open first dimension and the view has
            no batch size.
    """
    unsized = view.graph.get("unsized_batch") or ()
    if unsized and view.graph.get("batch_size") is None:
        raise ConfigError(
            f"The batch size of {view.graph.get('name') or 'the graph'} is unknown: "
            f"{len(unsized)} tensors (e.g. {unsized[0]!r}) have an open first dimension, so "
            "their sizes, min_tensor_bytes and any memory budget would be judged per sample. "
            f"Pass the batch size each step sees: {fix}."
            + (f" (No batch size found: {reason}.)" if reason else "")
        )


def assign_levels(view: nx.DiGraph) -> None:
    """Set each node's ``level`` (Kahn generation) and the graph's ``depth``.

    TF1 loops close a cycle through ``NextIteration``; those back edges are
    ignored for levelling, as TFLMS did.

    Args:
        view: The analysis view; changed in place (node attribute ``level``,
            graph attribute ``depth`` = number of levels).

    Raises:
        UnsupportedGraphError: the graph has any other cycle.
    """
    back_edges = [
        (u, v)
        for u, v in view.edges
        if view.nodes[u]["type"] in ("NextIteration", "RefNextIteration")
    ]
    dag = (
        view.edge_subgraph([e for e in view.edges if e not in set(back_edges)])
        if back_edges
        else view
    )
    depth = 0
    try:
        for level, generation in enumerate(nx.topological_generations(dag)):
            for node in generation:
                view.nodes[node]["level"] = level
            depth = level + 1
    except nx.NetworkXUnfeasible as err:
        cycle = nx.find_cycle(dag)
        raise UnsupportedGraphError(
            f"The graph has a cycle through {[u for u, _ in cycle][:8]}; tflms needs an acyclic "
            "graph (TF1 loops are fine, they close through NextIteration)."
        ) from err
    for _, data in view.nodes(data=True):  # isolated by back-edge removal
        data.setdefault("level", 0)
    view.graph["depth"] = depth


def consumers(view: nx.DiGraph, node: str, index: int) -> list[tuple[str, int]]:
    """``(consumer, input_index)`` pairs reading output ``index`` of ``node``.

    Args:
        view: The analysis view.
        node: Name of the producing node.
        index: Its output index.

    Returns:
        One ``(consumer node, input index)`` pair per data edge reading that
        output; control edges are not included.
    """
    found = []
    for succ, edge in view.succ[node].items():
        for out_idx, in_idx in edge.get("tensors", ()):
            if out_idx == index:
                found.append((succ, in_idx))
    return found


# --------------------------------------------------------------------------- internals


def _size_lists(view: nx.DiGraph, graph: tf.Graph, ops, batch, library) -> list[str]:
    """Give loop and ``TensorListFromTensor`` outputs the bytes their lists hold.

    Returns the loops whose growing lists could not be sized, each logged.
    """
    found = loops.loop_list_bytes(graph, batch=batch, library=library)
    estimated = []
    for op in ops:
        if op.type in ("TensorListFromTensor", "ZerosLike") and op.outputs[0].dtype == tf.variant:
            _resize(view, op.name, 0, loops.list_op_bytes(op, batch, found))
        elif op.type in cudnn_rnn.CUDNN_RNN_TYPES:
            nbytes = cudnn_rnn.reserve_space_bytes(op, batch)
            if nbytes is not None:
                _resize(view, op.name, cudnn_rnn.RESERVE_SPACE_INDEX, nbytes)
                estimated.append(op.name)
    view.graph["estimated_reserve_space"] = estimated
    unbounded = []
    variables = _captured_variables(graph) if found else {}
    for name, facts in found.items():
        view.nodes[name]["loop"] = facts
        view.nodes[name]["body"] = _body_view(
            graph.get_operation_by_name(name), variables, batch, library
        )
        for index, nbytes in facts.list_bytes.items():
            _resize(view, name, index, nbytes)
        if facts.unbounded:
            unbounded.append(name)
            logger.warning(
                "Loop %s keeps %d lists that grow each iteration but cannot be sized (%s); "
                "the simulator counts them as empty, so its peak is too low.",
                name,
                len(facts.unbounded),
                facts.bound if facts.trips is None else "element shapes unknown",
            )
    return unbounded


def _captured_variables(graph: tf.Graph) -> dict[str, tf.Variable]:
    """Placeholder op name -> the variable a ``FuncGraph`` captured through it."""
    by_handle = {id(v.handle): v for v in getattr(graph, "variables", ())}
    found = {}
    for external, internal in getattr(graph, "captures", ()):
        variable = by_handle.get(id(external))
        if variable is not None:
            found[internal.op.name] = variable
    return found


def _body_view(op: tf.Operation, variables: dict, batch, library) -> nx.DiGraph | None:
    """One iteration of a loop's body as a view (its ops' costs), or ``None`` if it can't be read."""
    fdef = next((f for f in library.function if f.signature.name == op.get_attr("body").name), None)
    if fdef is None:
        return None
    resources = {}
    for k, t in enumerate(op.inputs):
        variable = variables.get(t.op.name) if t.dtype == tf.resource else None
        if variable is not None:
            resources[k] = (variable.dtype.as_datatype_enum, variable.shape.as_proto())
    try:
        body = graph_from_function_def(fdef, library, resources=resources)
    except UnsupportedGraphError as err:
        logger.debug("body of %s not read: %s", op.name, err)
        return None
    return _build(body, LMSConfig(), batch, "the loop's graph")


def _resize(view: nx.DiGraph, name: str, index: int, nbytes: int) -> None:
    outputs = list(view.nodes[name]["outputs"])
    outputs[index] = outputs[index]._replace(bytes=nbytes)
    view.nodes[name]["outputs"] = tuple(outputs)


_CALLS_FUNCTIONS = FUNCTIONAL_CONTROL_FLOW | {
    "PartitionedCall",
    "StatefulPartitionedCall",
    "SymbolicGradient",
    "RemoteCall",
}


def _called_functions(node_def) -> tuple[str, ...]:
    names = []
    for attr in node_def.attr.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        elif attr.HasField("list"):
            names.extend(f.name for f in attr.list.func)
    return tuple(names)


@functools.lru_cache(maxsize=64)
def _dtype_facts(dtype: tf.DType) -> tuple[str, int, bool]:
    """(name, bytes per element, is_ref) of a dtype; 0 bytes for handles and strings."""
    base = dtype.base_dtype
    if base in (tf.resource, tf.variant, tf.string):
        size = 0
    else:
        try:
            size = base.size
        except (TypeError, AttributeError):  # types without a fixed size
            size = 0
    return base.name, size, dtype._is_ref_dtype  # noqa: SLF001


def _variable_bytes(handle: tf.Tensor) -> int:
    """Bytes of the variable behind a function's resource placeholder (0 when unknown)."""
    data = handle_data_util.get_resource_handle_data(handle)
    if data is None or not data.is_set or not data.shape_and_type:
        return 0
    shape_and_type = data.shape_and_type[0]
    dims = [d.size for d in shape_and_type.shape.dim]
    if shape_and_type.shape.unknown_rank or any(d < 0 for d in dims):
        return 0
    count = 1
    for d in dims:
        count *= d
    return count * tf.dtypes.as_dtype(shape_and_type.dtype).size


def _tensor_info(
    t: tf.Tensor,
    index: int,
    op_name: str,
    batch: int | None,
    unknown_dims: list,
    unsized_batch: list,
) -> TensorInfo:
    dtype_name, size, is_ref = _dtype_facts(t.dtype)
    name = f"{op_name}:{index}"
    dims, unknown_rank = t._shape  # noqa: SLF001 - one C call, no TensorShape objects
    n = 1
    if unknown_rank:
        dims = None
        unknown_dims.append(name)
    else:
        dims = tuple(dims)
        for d in dims[1:]:
            n *= 1 if d is None else d
        if None in dims[1:]:
            unknown_dims.append(name)
        if dims and dims[0] is None:
            if batch is None:
                unsized_batch.append(name)
            else:
                n *= batch
        elif dims:
            n *= dims[0]
    return TensorInfo(name, index, dtype_name, dims, n * size, is_ref)


def _signature_batch(graph: tf.Graph, ops, configured) -> tuple[int | None, str]:
    if configured is not None:
        return configured
    inputs = getattr(graph, "inputs", None)
    if inputs:
        candidates = [t for t in inputs if t.dtype not in (tf.resource, tf.variant)]
    else:
        candidates = [
            t for op in ops if op.type in ("Placeholder", "PlaceholderV2") for t in op.outputs
        ]
    known = Counter(
        t.shape[0]
        for t in candidates
        if t.shape.rank and t.shape[0] is not None and t.shape.rank >= 1
    )
    if known:
        return known.most_common(1)[0][0], "input signature"
    return None, "unknown"
