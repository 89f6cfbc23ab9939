"""Editor for ``GraphDef`` and ``FunctionDef`` protobufs (SavedModels, frozen graphs).

The third editor of :func:`tflms.apply.core.apply_with`: the same plan, the same
applier core, but the edits are made on protobuf messages in place, so a
model can be rewritten without importing it into a session or loading its
variables. Swap ops get exactly the attributes the live-graph editor gives
them (``T``, ``_tflms_swap``, ``_grappler_do_not_remove``, the device).

Tensor names follow each format: ``node:k`` (``node`` for output 0) in a
``GraphDef``; ``node:output_arg:i`` or a bare argument name in a
``FunctionDef`` (see :mod:`tflms.graph.op_signatures`). Plans always use flat
``(op, output index)`` pairs, as the analysis view does.

Example:
    >>> import tensorflow as tf
    >>> from tflms.apply.core import apply_with
    >>> from tflms.plan.swap_plan import Swap, SwapIn, SwapPlan
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
    ...     a = tf.nn.relu(x, name="a")
    ...     b = tf.tanh(a, name="b")
    ...     c = tf.add(b, a, name="c")
    >>> graph_def = g.as_graph_def()
    >>> swap = Swap(tensor="a:0", producer="a", index=0, bytes=256, dtype="float32",
    ...             producer_level=1, device="",
    ...             swap_ins=(SwapIn(consumers=(("c", 1),), trigger="b"),))
    >>> apply_with(ProtoEditor(graph_def), SwapPlan(swaps=(swap,)))
    2
    >>> [n.input for n in graph_def.node if n.name == "c"][0]
    ['b', 'a-lms/swapin']
"""

from __future__ import annotations

import contextlib

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from tflms.apply.graph_editor import GRAPPLER_KEEP_ATTR
from tflms.errors import UnsupportedGraphError, ValidationError
from tflms.graph.op_signatures import OpSignatures, graph_tensor_name, parse_tensor_name
from tflms.graph.view import SWAP_ATTR

__all__ = ["ProtoEditor"]


class ProtoEditor:
    """Applies swap-plan edits to a ``GraphDef`` or a ``FunctionDef`` in place.

    Args:
        proto: the ``GraphDef`` or ``FunctionDef`` to edit.
        library: the function library that resolves op types which are
            function names; defaults to a GraphDef's own ``library``. For a
            FunctionDef, pass the library it belongs to.
    """

    def __init__(self, proto, *, library: function_pb2.FunctionDefLibrary | None = None):
        if isinstance(proto, graph_pb2.GraphDef):
            self._container = proto.node
            self._args: dict[str, int] = {}
            library = library if library is not None else proto.library
        elif isinstance(proto, function_pb2.FunctionDef):
            self._container = proto.node_def
            self._args = {arg.name: arg.type for arg in proto.signature.input_arg}
        else:
            raise UnsupportedGraphError(
                f"ProtoEditor edits a GraphDef or a FunctionDef, got {type(proto).__name__}. "
                "For a tf.Graph use tflms.apply_plan."
            )
        self.proto = proto
        self.is_function = isinstance(proto, function_pb2.FunctionDef)
        self._nodes: dict[str, node_def_pb2.NodeDef] = {n.name: n for n in self._container}
        self._signatures = OpSignatures(library)

    # -- queries
    def swap_ops(self) -> list[str]:
        """Names of the nodes tflms inserted.

        Returns:
            The names of the nodes that carry the tflms marker attribute.
        """
        return [name for name, node in self._nodes.items() if SWAP_ATTR in node.attr]

    def missing(self, names: set[str]) -> list[str]:
        """Which of ``names`` are not ops of the graph (see ``Editor.missing``).

        Args:
            names: Op names the plan refers to.

        Returns:
            The names the graph has no op for.
        """
        return [n for n in names if not self.has_op(n)]

    def has_op(self, name: str) -> bool:
        """Whether an op called ``name`` exists (see ``Editor.has_op``).

        Args:
            name: Op name to look up.

        Returns:
            True if the graph has an op of that name.
        """
        return name in self._nodes or name in self._args

    def device_of(self, op: str) -> str:
        """The device string of ``op`` (``""`` for a function argument).

        Args:
            op: Name of an existing op.

        Returns:
            The device string, ``""`` when the op has none.
        """
        node = self._nodes.get(op)
        return node.device if node is not None else ""

    def data_inputs(self, op: str) -> list[tuple[str, int]]:
        """``(source op, flat output index)`` of each data input of ``op``.

        Args:
            op: Name of an existing op.

        Returns:
            One ``(source op, output index)`` pair per data input.

        Raises:
            ValidationError: ``op`` is not a node, or an input name cannot be read.
        """
        return [self._parse(name) for name in self._node(op).input if not name.startswith("^")]

    def add_clone(
        self,
        name: str,
        original: str,
        inputs: list[tuple[str, int]],
        device: str,
        *,
        keep: bool = True,
    ) -> None:
        """A copy of node ``original`` called ``name`` reading ``inputs`` (same op, attributes,
        device and control inputs), marked as a recomputation and kept by Grappler.

        Args:
            name: Name of the clone.
            original: Name of the op to copy.
            inputs: ``(op name, output index)`` of each data input, in order.
            device: Where the clone runs; ``""``: the original's device.
            keep: Keep the clone from Grappler (``_grappler_do_not_remove``);
                ``False`` for clones reading gates, which Grappler may fuse.

        Raises:
            ValidationError: ``original`` or an input's op is not a node of the graph.
        """
        source = self._node(original)
        node = self._container.add()
        node.CopyFrom(source)
        node.name = name
        if device:
            node.device = device
        del node.input[:]
        node.input.extend(self._tensor_name(src, k) for src, k in inputs)
        node.input.extend(c for c in source.input if c.startswith("^"))
        if "_class" in node.attr:
            del node.attr["_class"]
        node.attr[SWAP_ATTR].CopyFrom(attr_value_pb2.AttrValue(s=b"recompute"))
        if keep:
            node.attr[GRAPPLER_KEEP_ATTR].CopyFrom(attr_value_pb2.AttrValue(b=True))
        self._nodes[name] = node

    # -- edits
    def editing(self):
        """Context around all edits of one plan: nothing to set up for a protobuf.

        Returns:
            ``contextlib.nullcontext()``.
        """
        return contextlib.nullcontext()

    def add_identity(self, name: str, source: tuple[str, int], device: str, kind: str) -> None:
        """Insert an Identity ``name`` reading ``source`` on ``device`` (see ``Editor``).

        Args:
            name: Name of the new op.
            source: ``(op name, output index)`` of the tensor it reads.
            device: Device string; ``""`` leaves the op unplaced.
            kind: ``"out"`` (swap-out), ``"in"`` (swap-in), ``"gate"`` or ``"hold"``.

        Raises:
            ValidationError: ``source`` names no node, or an output a function
                argument does not have.
        """
        node = self._container.add()
        node.name = name
        node.op = "Identity"
        node.input.append(self._tensor_name(*source))
        if device:
            node.device = device
        node.attr["T"].CopyFrom(attr_value_pb2.AttrValue(type=self._dtype(*source)))
        node.attr[SWAP_ATTR].CopyFrom(attr_value_pb2.AttrValue(s=kind.encode()))
        node.attr[GRAPPLER_KEEP_ATTR].CopyFrom(attr_value_pb2.AttrValue(b=True))
        self._nodes[name] = node

    def reroute(self, consumer: str, input_index: int, source: tuple[str, int]) -> None:
        """Make input ``input_index`` of ``consumer`` read ``source`` (see ``Editor.reroute``).

        Args:
            consumer: Name of the op whose input changes.
            input_index: Position of the data input (0-based).
            source: ``(op name, output index)`` of the tensor to read instead.

        Raises:
            ValidationError: ``consumer`` is not a node, or has no data input
                ``input_index``.
        """
        node = self._node(consumer)
        data_inputs = sum(1 for name in node.input if not name.startswith("^"))
        if not 0 <= input_index < data_inputs:
            raise ValidationError(
                f"Cannot reroute input {input_index} of {consumer!r}: it has {data_inputs} data inputs."
            )
        node.input[input_index] = self._tensor_name(*source)

    def add_control(self, src: str, dst: str) -> None:
        """Add a control edge ``src -> dst`` (see ``Editor.add_control``).

        Args:
            src: Op that must run first.
            dst: Op that gets ``src`` as a control input.

        Raises:
            ValidationError: ``dst`` is not a node of the graph.
        """
        node = self._node(dst)
        control = f"^{src}"
        if control not in node.input:
            node.input.append(control)

    # -- helpers
    def _node(self, name: str) -> node_def_pb2.NodeDef:
        try:
            return self._nodes[name]
        except KeyError:
            raise ValidationError(f"No node {name!r} in the graph being rewritten.") from None

    def _parse(self, name: str) -> tuple[str, int]:
        """``(op, flat output index)`` of an input string of this graph or function."""
        if not self.is_function:
            return parse_tensor_name(name)
        parts = name.split(":")
        if len(parts) == 1:  # a function argument
            return name, 0
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValidationError(f"Cannot read the FunctionDef input {name!r}.")
        return parts[0], self._signatures.flat_index(self._node(parts[0]), parts[1], int(parts[2]))

    def _tensor_name(self, op: str, index: int) -> str:
        if op in self._args:
            if index:
                raise ValidationError(f"Function argument {op!r} has one output, not {index + 1}.")
            return op
        if not self.is_function:
            return graph_tensor_name(op, index)
        return self._signatures.function_tensor_name(self._node(op), index)

    def _dtype(self, op: str, index: int) -> int:
        if op in self._args:
            return self._args[op]
        node = self._node(op)
        if SWAP_ATTR in node.attr and node.op == "Identity":  # a swap op we made
            return node.attr["T"].type  # (a clone is a copy of its original: its signature)
        return self._signatures.output_dtype(node, index)
