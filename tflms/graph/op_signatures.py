"""Op signatures of protobuf graphs: output layouts, dtypes, tensor names.

A ``GraphDef`` names a tensor ``node:k`` with ``k`` the *flat* output index;
a ``FunctionDef`` names it ``node:output_arg:i`` (the ``i``-th tensor of the
named output argument), and a function argument by its bare name. Converting
between the two needs the op's ``OpDef`` (from TensorFlow's op registry, or
from the function library when the op type is a function name) and the
node's attributes, as ``ComputeArgRange`` in TensorFlow's
``node_def_util.cc`` does. :class:`OpSignatures` does exactly that, without
importing anything into a ``tf.Graph``.

Example:
    >>> from tensorflow.core.framework import node_def_pb2
    >>> sigs = OpSignatures()
    >>> node = node_def_pb2.NodeDef(name="split", op="Split")
    >>> node.attr["num_split"].i = 3
    >>> node.attr["T"].type = 1  # DT_FLOAT
    >>> sigs.output_layout(node)
    (('output', 0, 1), ('output', 1, 1), ('output', 2, 1))
    >>> sigs.function_tensor_name(node, 2), parse_tensor_name("split:2")
    ('split:output:2', ('split', 2))
"""

from __future__ import annotations

from tensorflow.core.framework import function_pb2, node_def_pb2, op_def_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from tflms.errors import UnsupportedGraphError

__all__ = [
    "OpSignatures",
    "parse_tensor_name",
    "graph_tensor_name",
    "unknown_op_types",
    "reachable_functions",
    "called_functions",
    "to_var_handle",
]


def parse_tensor_name(name: str) -> tuple[str, int]:
    """``"op:3"`` -> ``("op", 3)``; ``"op"`` -> ``("op", 0)`` (GraphDef naming).

    Args:
        name: A GraphDef tensor name (``"op"`` or ``"op:k"``); a control input
            (``"^op"``) is not expected.

    Returns:
        ``(op name, output index)``; a name whose suffix after the last ``:``
        is not a number is taken whole, with index 0.
    """
    op, _, index = name.rpartition(":")
    if op and index.isdigit():
        return op, int(index)
    return name, 0


def graph_tensor_name(op: str, index: int) -> str:
    """GraphDef input string of output ``index`` of ``op`` (``op`` for index 0, as TF writes).

    Args:
        op: Name of the producing op.
        index: Flat output index (0-based).

    Returns:
        ``op`` for index 0, else ``"op:index"``.
    """
    return op if index == 0 else f"{op}:{index}"


class OpSignatures:
    """Resolves the ``OpDef`` of nodes: registered ops and library functions.

    Args:
        library: a ``FunctionDefLibrary`` whose function names may be used as
            op types (direct function calls). ``None``: registered ops only.
    """

    def __init__(self, library: function_pb2.FunctionDefLibrary | None = None):
        self._functions = (
            {f.signature.name: f.signature for f in library.function} if library else {}
        )

    def op_def(self, op_type: str) -> op_def_pb2.OpDef | None:
        """The ``OpDef`` of ``op_type``, or ``None`` if it is neither registered nor a function.

        Args:
            op_type: A registered op type (``"MatMul"``) or the name of a function
                of the library this instance was made with.

        Returns:
            The function's signature when ``op_type`` names a library function
            (these shadow registered ops), else the registered ``OpDef``, else None.
        """
        found = self._functions.get(op_type)
        return found if found is not None else op_def_registry.get(op_type)

    def output_layout(self, node: node_def_pb2.NodeDef) -> tuple[tuple[str, int, int], ...]:
        """``(output_arg, i, dtype enum)`` for each flat output of ``node``.

        Args:
            node: The node; its attributes fix the number and types of
                list-valued outputs.

        Returns:
            One ``(output_arg name, index within the arg, dtype enum)`` per flat
            output, in output order.

        Raises:
            UnsupportedGraphError: the op type is unknown, or an attribute the
                layout depends on is missing.
        """
        op_def = self.op_def(node.op)
        if op_def is None:
            raise UnsupportedGraphError(
                f"Node {node.name!r} has op type {node.op!r}, which is neither registered in this "
                "TensorFlow nor a function of the model's library (a custom op?). Load the library "
                "that registers it, e.g. `tflms analyze --op-library path/to/_custom_ops.so SRC`."
            )
        layout = []
        for arg in op_def.output_arg:
            for i, dtype in enumerate(_arg_types(arg, node, op_def)):
                layout.append((arg.name, i, dtype))
        return tuple(layout)

    def output_dtype(self, node: node_def_pb2.NodeDef, index: int) -> int:
        """dtype enum of flat output ``index`` of ``node``.

        Args:
            node: The node.
            index: Flat output index (0-based, across all output args).

        Returns:
            The ``DataType`` enum value of that output.

        Raises:
            UnsupportedGraphError: the op type is unknown, or ``node`` has no
                output ``index``.
        """
        return self._output(node, index)[2]

    def function_tensor_name(self, node: node_def_pb2.NodeDef, index: int) -> str:
        """FunctionDef name ``node:output_arg:i`` of flat output ``index``.

        Args:
            node: The node.
            index: Flat output index (0-based, across all output args).

        Returns:
            The name a ``FunctionDef`` uses for that output, ``"node:arg:i"``.

        Raises:
            UnsupportedGraphError: the op type is unknown, or ``node`` has no
                output ``index``.
        """
        arg, i, _ = self._output(node, index)
        return f"{node.name}:{arg}:{i}"

    def flat_index(self, node: node_def_pb2.NodeDef, arg: str, i: int) -> int:
        """Flat output index of ``node:arg:i`` (inverse of :meth:`function_tensor_name`).

        Args:
            node: The node.
            arg: Name of one of its output args.
            i: Index within that output arg.

        Returns:
            The flat output index (0-based, across all output args).

        Raises:
            UnsupportedGraphError: the op type is unknown, or ``node`` has no
                output ``arg:i``.
        """
        for k, (name, j, _) in enumerate(self.output_layout(node)):
            if name == arg and j == i:
                return k
        raise UnsupportedGraphError(
            f"Node {node.name!r} ({node.op}) has no output {arg}:{i}; the FunctionDef is corrupt."
        )

    def _output(self, node, index):
        layout = self.output_layout(node)
        if not 0 <= index < len(layout):
            raise UnsupportedGraphError(
                f"Node {node.name!r} ({node.op}) has {len(layout)} outputs; output {index} "
                "does not exist."
            )
        return layout[index]


def _attr(node, op_def, name: str):
    if name in node.attr:
        return node.attr[name]
    for attr in op_def.attr:
        if attr.name == name and attr.HasField("default_value"):
            return attr.default_value
    raise UnsupportedGraphError(
        f"Node {node.name!r} ({node.op}) lacks attribute {name!r}, which sizes its outputs; "
        "the graph is incomplete or corrupt."
    )


def _arg_types(arg: op_def_pb2.OpDef.ArgDef, node, op_def) -> list[int]:
    if arg.type_list_attr:
        return list(_attr(node, op_def, arg.type_list_attr).list.type)
    if arg.type != types_pb2.DT_INVALID:
        dtype = arg.type
    elif arg.type_attr:
        dtype = _attr(node, op_def, arg.type_attr).type
    else:
        raise UnsupportedGraphError(f"Op {op_def.name!r} has an output argument without a type.")
    count = _attr(node, op_def, arg.number_attr).i if arg.number_attr else 1
    return [dtype] * count


def called_functions(node: node_def_pb2.NodeDef, library_names) -> list[str]:
    """Functions ``node`` calls: its op type if a library function, plus ``func`` attrs.

    Args:
        node: A ``NodeDef``.
        library_names: Container of the library's function names (anything
            supporting ``in``); an op type in it is a function call.

    Returns:
        The function names, op type first, then those of ``func`` and
        ``list(func)`` attributes in attribute order; may repeat a name.
    """
    names = [node.op] if node.op in library_names else []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return [n for n in names if n]


def reachable_functions(nodes, library: function_pb2.FunctionDefLibrary) -> list[str]:
    """Names of library functions that ``nodes`` call, directly or transitively.

    Args:
        nodes: Iterable of ``NodeDef`` to start from.
        library: The library the calls resolve in; names not in it are skipped.

    Returns:
        Each reachable function name once, in discovery order.
    """
    by_name = {f.signature.name: f for f in library.function}
    seen: dict[str, None] = {}
    stack = [f for node in nodes for f in called_functions(node, by_name)]
    while stack:
        name = stack.pop()
        if name in seen or name not in by_name:
            continue
        seen[name] = None
        stack.extend(f for node in by_name[name].node_def for f in called_functions(node, by_name))
    return list(seen)


def unknown_op_types(nodes, signatures: OpSignatures) -> dict[str, list[str]]:
    """``{op type: [node names]}`` for op types TensorFlow does not know.

    Args:
        nodes: Iterable of ``NodeDef``.
        signatures: Resolves op types (registry and library functions).

    Returns:
        The unknown op types with the names of the nodes using them; empty
        when every op type is known.
    """
    unknown: dict[str, list[str]] = {}
    for node in nodes:
        if signatures.op_def(node.op) is None:
            unknown.setdefault(node.op, []).append(node.name)
    return unknown


def to_var_handle(node: node_def_pb2.NodeDef, dtype: int, shape) -> None:
    """Turn a resource placeholder into a ``VarHandleOp`` that carries a variable's shape.

    Shape inference then gives every ``ReadVariableOp`` of it the variable's
    shape, which a bare resource placeholder (a function argument or a
    captured variable) lacks. The node keeps its name; nothing runs.

    Args:
        node: the ``Placeholder`` node, edited in place.
        dtype: the variable's dtype enum.
        shape: its ``TensorShapeProto``.
    """
    node.op = "VarHandleOp"
    node.ClearField("input")
    node.ClearField("attr")
    node.attr["dtype"].type = dtype
    node.attr["shape"].shape.CopyFrom(shape)
    node.attr["container"].s = b""
    node.attr["shared_name"].s = node.name.encode()
