"""The control edges TensorFlow's automatic control dependencies give a traced step.

When a ``tf.function`` finishes tracing, TensorFlow orders the ops on each
resource as the step created them: a read waits for the resource's last
write, a write for its last write and every read since, and a stateful op
that touches no resource for the one before it. tflms rewrites a step while
it is still being traced, so the step's ``FuncGraph`` holds none of these
edges yet, though the step TensorFlow runs, and optimizes, does.

Grappler's decisions can hang on them: its memory optimizer turns a sum of
3+ inputs into an accumulation in arrival order when an input is live at its
static peak, and that peak comes from a schedule the edges constrain (an
optimizer update that waits for the forward pass's reads of its variable
keeps those reads alive). A check of the step without them reproduced none
of the rewrites the real run made on ``benchmarks/bench_remat.py``'s MLP;
with them it makes the same. :func:`automatic_control_edges` lists the edges
a traced graph is still to get, from its ops' resource inputs, as
TensorFlow's rules derive them.

Example:
    >>> import tensorflow as tf
    >>> v = tf.Variable(1.0)
    >>> seen = {}
    >>> @tf.function
    ... def step():
    ...     value = v.read_value()
    ...     v.assign_add(value)
    ...     seen["edges"] = automatic_control_edges(tf.compat.v1.get_default_graph())
    ...     return value
    >>> _ = step.get_concrete_function()
    >>> [(a.split("/")[-1], b.split("/")[-1]) for a, b in seen["edges"]]
    [('ReadVariableOp', 'AssignAddVariableOp')]
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

__all__ = ["automatic_control_edges", "with_control_edges"]

RESOURCE_READS = frozenset(
    {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "_ReadVariablesOp"}
)
"""Op types that only read every resource they take (TensorFlow's read-only resource ops)."""

ORDER_INSENSITIVE = frozenset(
    {
        "CudnnRNN",
        "CudnnRNNBackprop",
        "CudnnRNNV2",
        "CudnnRNNV3",
        "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3",
        "RestoreV2",
        "SaveV2",
    }
)
"""Stateful op types TensorFlow's automatic control dependencies leave unordered."""

_READ_ONLY_ATTR = "_read_only_resource_inputs"


def automatic_control_edges(graph: tf.Graph) -> list[tuple[str, str]]:
    """``(before, after)`` op names: the control edges TensorFlow gives ``graph`` when its
    tracing ends, less those it already holds.

    Args:
        graph: a ``FuncGraph``, still being traced or not (a finished one holds
            every edge, so none is listed). Any other ``tf.Graph`` (a
            ``tf.compat.v1`` graph, which TensorFlow does not order): no edge.

    Returns:
        The edges in the ops' creation order, each once.
    """
    if not hasattr(graph, "control_outputs"):  # not a FuncGraph
        return []
    last_write: dict[str | None, str] = {}
    reads: dict[str, list[str]] = {}
    edges: list[tuple[str, str]] = []
    for op in graph.get_operations():  # creation order
        wanted: list[str] = []
        resources = _resource_inputs(op)
        for name, read_only in resources:
            if name in last_write:
                wanted.append(last_write[name])
            if read_only:
                reads.setdefault(name, []).append(op.name)
            else:
                wanted.extend(reads.pop(name, ()))
                last_write[name] = op.name
        if not resources and op.op_def is not None and op.op_def.is_stateful:
            if op.type not in ORDER_INSENSITIVE:
                if None in last_write:
                    wanted.append(last_write[None])
                last_write[None] = op.name
        held = {c.name for c in op.control_inputs}
        edges.extend(
            (name, op.name)
            for name in dict.fromkeys(wanted)
            if name != op.name and name not in held
        )
    return edges


def _resource_inputs(op: tf.Operation) -> list[tuple[str, bool]]:
    """``(tensor name, read only)`` for each resource ``op`` takes, once per tensor."""
    try:
        read_only = set(op.get_attr(_READ_ONLY_ATTR))
    except ValueError:
        read_only = set()
    found: dict[str, bool] = {}
    for i, tensor in enumerate(op.inputs):
        if tensor.dtype == tf.resource and tensor.name not in found:
            found[tensor.name] = op.type in RESOURCE_READS or i in read_only
    return list(found.items())


def with_control_edges(
    graph_def: graph_pb2.GraphDef, edges: list[tuple[str, str]]
) -> graph_pb2.GraphDef:
    """``graph_def`` (changed in place, and returned) with the control ``edges`` added, each
    to a node that lacks it (edges between nodes it does not hold are left out)."""
    nodes = {node.name: node for node in graph_def.node}
    for before, after in edges:
        node = nodes.get(after)
        if node is not None and before in nodes and f"^{before}" not in node.input:
            node.input.append(f"^{before}")
    return graph_def
