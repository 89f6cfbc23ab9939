"""Which variable each resource argument of a saved function reads.

Inside a saved ``FunctionDef`` a variable is a bare ``DT_RESOURCE`` argument:
nothing in the function says the variable's shape, so shape inference leaves
every weight read - and every activation computed from one - unsized. The
SavedModel does know: a TF2 SavedModel's object graph lists, for each
concrete function, the objects bound to its captured inputs (the last
arguments), and a variable object records its dtype and shape. Functions
called from other functions (or from a TF1 graph holding ``VarHandleOp``
nodes) inherit what their callers know, through ``PartitionedCall`` /
``StatefulPartitionedCall`` nodes and direct calls.

Example:
    >>> from tensorflow.core.protobuf import meta_graph_pb2
    >>> resource_arguments(meta_graph_pb2.MetaGraphDef())
    {}
"""

from __future__ import annotations

from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from tflms.graph.op_signatures import parse_tensor_name

__all__ = ["resource_arguments", "VariableInfo"]

VariableInfo = tuple  # (dtype enum, TensorShapeProto)
_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


def resource_arguments(
    meta_graph: meta_graph_pb2.MetaGraphDef,
) -> dict[str, dict[int, VariableInfo]]:
    """``{function name: {argument index: (dtype enum, TensorShapeProto)}}``.

    Only resource arguments whose variable could be determined are listed.

    Args:
        meta_graph: The SavedModel's MetaGraphDef (its object graph supplies
            the bound variables; calls propagate them into nested functions).

    Returns:
        The known resource arguments per library function; functions with
        none are left out.
    """
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    known: dict[str, dict[int, VariableInfo]] = {}
    objects = meta_graph.object_graph_def
    for name, saved in objects.concrete_functions.items():
        fdef = library.get(name)
        if fdef is None or not saved.bound_inputs:
            continue
        first = len(fdef.signature.input_arg) - len(saved.bound_inputs)
        for k, node_id in enumerate(saved.bound_inputs):
            node = objects.nodes[node_id] if node_id < len(objects.nodes) else None
            if node is not None and node.WhichOneof("kind") == "variable":
                known.setdefault(name, {})[first + k] = (node.variable.dtype, node.variable.shape)
    _propagate(meta_graph.graph_def.node, None, library, known)
    changed = True
    while changed:  # each round reaches one more level of nested calls
        changed = any(
            [_propagate(fdef.node_def, fdef, library, known) for fdef in library.values()]
        )
    return {name: args for name, args in known.items() if args}


def _propagate(nodes, caller, library, known) -> bool:
    """Pass what ``caller`` knows about its resources on to the functions it calls."""
    sources: dict[str, VariableInfo] = {
        node.name: (node.attr["dtype"].type, node.attr["shape"].shape)
        for node in nodes
        if node.op == "VarHandleOp"
    }
    if caller is not None:
        args = known.get(caller.signature.name, {})
        for i, arg in enumerate(caller.signature.input_arg):
            if i in args:
                sources[arg.name] = args[i]
    if not sources:
        return False
    changed = False
    for node in nodes:
        callee = _callee(node, library)
        if callee is None:
            continue
        data_inputs = [name for name in node.input if not name.startswith("^")]
        target = known.setdefault(callee.signature.name, {})
        for j, name in enumerate(data_inputs[: len(callee.signature.input_arg)]):
            if callee.signature.input_arg[j].type != types_pb2.DT_RESOURCE or j in target:
                continue
            source = name.split(":")[0] if caller is not None else parse_tensor_name(name)[0]
            if source in sources:
                target[j] = sources[source]
                changed = True
    return changed


def _callee(node, library):
    if node.op in library:
        return library[node.op]
    if node.op in _CALL_OPS and "f" in node.attr:
        return library.get(node.attr["f"].func.name)
    return None
