"""Import ``GraphDef`` and ``FunctionDef`` protobufs into ``tf.Graph`` for analysis.

:func:`tflms.build_view` reads a ``tf.Graph``. A protobuf graph is imported
into a fresh one with ``tf.graph_util.import_graph_def``, which validates the
nodes and runs shape inference - and nothing else: no op runs, no variable is
restored, no Python of the model's author is called.

A ``FunctionDef`` is first turned into a ``GraphDef`` (as TensorFlow's
``function_def_to_graph`` does, but without needing the functions registered
in a graph): its arguments become placeholders with the shapes the function
records, its tensor names ``node:output_arg:i`` become ``node:k``. Resource
arguments whose variable is known become ``VarHandleOp`` nodes carrying the
variable's dtype and shape, so every weight read is sized; node and argument
names are kept, so the view's op names are the function's node names.

Example:
    >>> import tensorflow as tf
    >>> v = tf.Variable(tf.ones([4, 16]))
    >>> @tf.function(input_signature=[tf.TensorSpec([2, 4])])
    ... def f(x):
    ...     return tf.nn.relu(x @ v)
    >>> cf = f.get_concrete_function()
    >>> fdef = cf.function_def
    >>> resource = {1: (v.dtype.as_datatype_enum, v.shape.as_proto())}
    >>> g = graph_from_function_def(fdef, cf.graph.as_graph_def().library, resources=resource)
    >>> [op.outputs[0].shape.as_list() for op in g.get_operations() if op.type == "MatMul"]
    [[2, 16]]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, types_pb2, versions_pb2
from tensorflow.python.framework import versions

from tflms.errors import UnsupportedGraphError
from tflms.graph.op_signatures import (
    OpSignatures,
    reachable_functions,
    to_var_handle,
    unknown_op_types,
)

__all__ = [
    "graph_from_graph_def",
    "graph_from_function_def",
    "function_to_graph_def",
    "check_known_ops",
]

logger = logging.getLogger(__name__)


def check_known_ops(nodes, library: function_pb2.FunctionDefLibrary | None, where: str) -> None:
    """Raise :class:`UnsupportedGraphError` naming every op type TensorFlow does not know.

    Args:
        nodes: the ``NodeDef`` messages to check.
        library: functions whose names are valid op types.
        where: what the nodes belong to, for the message (``"function f"``).
    """
    unknown = unknown_op_types(nodes, OpSignatures(library))
    if unknown:
        listed = "; ".join(
            f"{op!r} (node {names[0]!r}{f' and {len(names) - 1} more' if len(names) > 1 else ''})"
            for op, names in sorted(unknown.items())
        )
        raise UnsupportedGraphError(
            f"The {where} uses op types that this TensorFlow ({tf.__version__}) does not "
            f"register: {listed}. They are custom ops: load the shared library that defines "
            "them, e.g. `tflms analyze --op-library path/to/_custom_ops.so SRC`, or use the "
            "TensorFlow build the model was exported with."
        )


def graph_from_graph_def(graph_def: graph_pb2.GraphDef, *, where: str = "graph") -> tf.Graph:
    """A new ``tf.Graph`` holding ``graph_def`` with its original node names.

    Args:
        graph_def: The graph to import (its library functions come along).
        where: What the graph is, for error messages (for example
            ``"function 'f'"``); ``"graph"`` by default.

    Returns:
        A fresh ``tf.Graph`` whose op names are the node names of ``graph_def``
        (imported with an empty name scope).

    Raises:
        UnsupportedGraphError: an op type is unknown, or TensorFlow rejects
            the graph (bad input names, type mismatches...).
    """
    check_known_ops(graph_def.node, graph_def.library, where)
    for name in reachable_functions(graph_def.node, graph_def.library):
        fdef = next(f for f in graph_def.library.function if f.signature.name == name)
        check_known_ops(
            fdef.node_def, graph_def.library, f"function {name!r} (called by the {where})"
        )
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as err:
        raise UnsupportedGraphError(
            f"TensorFlow cannot import the {where}: {_first_line(err)}. The file is "
            "inconsistent (a node reads a missing tensor or a wrong type); re-export the model."
        ) from err
    return graph


def function_to_graph_def(
    fdef: function_pb2.FunctionDef,
    library: function_pb2.FunctionDefLibrary,
    *,
    resources: Mapping[int, tuple[int, object]] | None = None,
) -> graph_pb2.GraphDef:
    """A ``GraphDef`` equivalent of the body of ``fdef`` (see the module docstring).

    Args:
        fdef: the function.
        library: the library it belongs to (function-call op types, nested calls).
        resources: ``{argument index: (dtype enum, TensorShapeProto)}`` of
            the variables behind resource arguments.

    Returns:
        A new ``GraphDef``: one ``Placeholder`` per function argument (a
        ``VarHandleOp`` for a resource argument listed in ``resources``), the
        body's nodes with their inputs renamed to GraphDef form, and the
        library functions the body reaches.

    Raises:
        UnsupportedGraphError: an op type is unknown or a tensor name is invalid.
    """
    where = f"function {fdef.signature.name!r}"
    check_known_ops(fdef.node_def, library, where)
    signatures = OpSignatures(library)
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(
        versions_pb2.VersionDef(
            producer=versions.GRAPH_DEF_VERSION,
            min_consumer=versions.GRAPH_DEF_VERSION_MIN_CONSUMER,
        )
    )
    resources = resources or {}
    input_shapes = fdef.attr["_input_shapes"].list.shape if "_input_shapes" in fdef.attr else ()
    for i, arg in enumerate(fdef.signature.input_arg):
        node = graph_def.node.add(name=arg.name, op="Placeholder")
        node.attr["dtype"].type = arg.type
        shapes = fdef.arg_attr[i].attr["_output_shapes"].list.shape if i in fdef.arg_attr else ()
        if shapes:
            node.attr["shape"].shape.CopyFrom(shapes[0])
        elif i < len(input_shapes) and arg.type != types_pb2.DT_RESOURCE:
            node.attr["shape"].shape.CopyFrom(input_shapes[i])
        if arg.type == types_pb2.DT_RESOURCE and i in resources:
            to_var_handle(node, *resources[i])

    flat = {arg.name: f"{arg.name}:0" for arg in fdef.signature.input_arg}
    for node in fdef.node_def:
        for k, (arg, i, _) in enumerate(signatures.output_layout(node)):
            flat[f"{node.name}:{arg}:{i}"] = f"{node.name}:{k}"
    body = graph_def.node
    body.extend(fdef.node_def)
    for node in body[len(fdef.signature.input_arg) :]:
        for j, name in enumerate(node.input):
            if name.startswith("^"):
                continue
            try:
                node.input[j] = flat[name]
            except KeyError:
                raise UnsupportedGraphError(
                    f"Node {node.name!r} of {where} reads {name!r}, which is neither an argument "
                    "nor an output of a node: the FunctionDef is corrupt."
                ) from None
    needed = set(reachable_functions(fdef.node_def, library))
    graph_def.library.function.extend(f for f in library.function if f.signature.name in needed)
    graph_def.library.gradient.extend(g for g in library.gradient if g.function_name in needed)
    return graph_def


def graph_from_function_def(
    fdef: function_pb2.FunctionDef,
    library: function_pb2.FunctionDefLibrary,
    *,
    resources: Mapping[int, tuple[int, object]] | None = None,
) -> tf.Graph:
    """A new ``tf.Graph`` holding the body of ``fdef`` (see :func:`function_to_graph_def`).

    Args:
        fdef: The function whose body to import.
        library: The library ``fdef`` belongs to (function-call op types and
            nested calls are looked up there).
        resources: ``{argument index: (dtype enum, TensorShapeProto)}`` of the
            variables behind resource arguments; None when the function has no
            resource arguments to type.

    Returns:
        A fresh ``tf.Graph`` holding the body, with placeholders for the
        function's arguments.

    Raises:
        UnsupportedGraphError: an op type is unknown, a tensor name is invalid,
            or TensorFlow rejects the resulting graph.
    """
    graph_def = function_to_graph_def(fdef, library, resources=resources)
    return graph_from_graph_def(graph_def, where=f"function {fdef.signature.name!r}")


def _first_line(err: Exception) -> str:
    text = getattr(err, "message", None) or str(err)
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__
