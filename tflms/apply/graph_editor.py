"""Editor for live ``tf.Graph`` / ``FuncGraph`` objects (in-place rewrite).

Swap ops are created with every ambient graph context cleared (control
dependencies, colocation, device and name scopes of whoever is tracing), then
placed explicitly. They carry ``_grappler_do_not_remove`` so Grappler keeps
them, and ``_tflms_swap`` so tflms recognises a rewritten graph.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tflms.errors import UnsupportedGraphError, ValidationError
from tflms.graph.view import SWAP_ATTR

__all__ = ["GraphEditor", "GRAPPLER_KEEP_ATTR"]

GRAPPLER_KEEP_ATTR = "_grappler_do_not_remove"


class GraphEditor:
    """Applies swap-plan edits to a ``tf.Graph`` in place."""

    def __init__(self, graph: tf.Graph):
        if not isinstance(graph, tf.Graph):
            raise UnsupportedGraphError(
                f"apply_plan needs a tf.Graph or FuncGraph, got {type(graph).__name__}."
            )
        if graph.finalized:
            raise UnsupportedGraphError(
                f"Graph {getattr(graph, 'name', '')!r} is finalized (a Session or MonitoredSession "
                "froze it); rewrite it before creating the session."
            )
        self.graph = graph

    # -- queries
    def swap_ops(self) -> list[str]:
        """Names of ops tflms inserted (swap ops and recompute clones).

        Returns:
            The names of the ops under an ``lms/`` scope that carry the tflms
            marker attribute.
        """
        found = []
        for op in self.graph.get_operations():
            if "lms/" in op.name:
                try:
                    op.get_attr(SWAP_ATTR)
                except ValueError:
                    continue
                found.append(op.name)
        return found

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
        try:
            self.graph.get_operation_by_name(name)
        except KeyError:
            return False
        return True

    def device_of(self, op: str) -> str:
        """The device string of ``op``.

        Args:
            op: Name of an existing op.

        Returns:
            The device string, ``""`` when the op has none.
        """
        return self._op(op).device

    def data_inputs(self, op: str) -> list[tuple[str, int]]:
        """``(source op, output index)`` of each data input of ``op``.

        Args:
            op: Name of an existing op.

        Returns:
            One ``(source op, output index)`` pair per data input.
        """
        return [(t.op.name, t.value_index) for t in self._op(op).inputs]

    # -- edits
    @contextlib.contextmanager
    def editing(self):
        """Clear the ambient contexts of whoever is tracing, once for all edits."""
        g = self.graph
        with (
            g.as_default(),
            g.control_dependencies(None),
            g.colocate_with(None, ignore_existing=True),
        ):
            yield

    def add_identity(self, name: str, source: tuple[str, int], device: str, kind: str) -> None:
        """Insert an Identity ``name`` reading ``source`` on ``device`` (see ``Editor``).

        Args:
            name: Name of the new op.
            source: ``(op name, output index)`` of the tensor it reads.
            device: Device string; ``""`` leaves the op unplaced.
            kind: ``"out"`` (swap-out), ``"in"`` (swap-in), ``"gate"`` or ``"hold"``.

        Raises:
            ValidationError: TensorFlow gave the op another name than ``name``.
        """
        tensor = self._op(source[0]).outputs[source[1]]
        attrs = {
            "T": attr_value_pb2.AttrValue(type=tensor.dtype.as_datatype_enum),
            SWAP_ATTR: attr_value_pb2.AttrValue(s=kind.encode()),
            GRAPPLER_KEEP_ATTR: attr_value_pb2.AttrValue(b=True),
        }
        # A trailing "/" makes TensorFlow use the name as given (clashes were
        # ruled out before any edit); device functions of the tracer are skipped.
        op = self.graph._create_op_internal(  # noqa: SLF001
            "Identity", [tensor], name=name + "/", attrs=attrs, compute_device=False
        )
        if op.name != name:
            raise ValidationError(f"Could not create op {name!r}: TensorFlow named it {op.name!r}.")
        if device:
            op._set_device(device)  # noqa: SLF001

    def add_clone(
        self,
        name: str,
        original: str,
        inputs: list[tuple[str, int]],
        device: str,
        *,
        keep: bool = True,
    ) -> None:
        """A copy of op ``original`` called ``name``: same type, attributes, device and
        control inputs, reading ``inputs``; marked as a recomputation and kept by Grappler.

        Args:
            name: Name of the clone.
            original: Name of the op to copy.
            inputs: ``(op name, output index)`` of each data input, in order.
            device: Where the clone runs; ``""``: the original's device.
            keep: Keep the clone from Grappler (``_grappler_do_not_remove``);
                ``False`` for clones reading gates, which Grappler may fuse.

        Raises:
            ValidationError: TensorFlow gave the clone another name than ``name``.
        """
        op = self._op(original)
        attrs = {k: v for k, v in op.node_def.attr.items() if k != "_class"}
        attrs[SWAP_ATTR] = attr_value_pb2.AttrValue(s=b"recompute")
        if keep:
            attrs[GRAPPLER_KEEP_ATTR] = attr_value_pb2.AttrValue(b=True)
        tensors = [self._op(src).outputs[k] for src, k in inputs]
        clone = self.graph._create_op_internal(  # noqa: SLF001 - as for swap ops, see add_identity
            op.type,
            tensors,
            dtypes=[out.dtype for out in op.outputs],
            name=name + "/",
            attrs=attrs,
            op_def=op.op_def,
            compute_device=False,
        )
        if clone.name != name:
            raise ValidationError(
                f"Could not create op {name!r}: TensorFlow named it {clone.name!r}."
            )
        for out, new in zip(op.outputs, clone.outputs, strict=True):
            new.set_shape(out.shape)
        if device or op.device:
            clone._set_device(device or op.device)  # noqa: SLF001
        for control in op.control_inputs:
            clone._add_control_input(control)  # noqa: SLF001

    def reroute(self, consumer: str, input_index: int, source: tuple[str, int]) -> None:
        """Make input ``input_index`` of ``consumer`` read ``source`` (see ``Editor.reroute``).

        Args:
            consumer: Name of the op whose input changes.
            input_index: Position of the data input (0-based).
            source: ``(op name, output index)`` of the tensor to read instead.
        """
        op = self._op(consumer)
        op._update_input(input_index, self._op(source[0]).outputs[source[1]])  # noqa: SLF001

    def add_control(self, src: str, dst: str) -> None:
        """Add a control edge ``src -> dst`` (see ``Editor.add_control``).

        Args:
            src: Op that must run first.
            dst: Op that gets ``src`` as a control input.
        """
        self._op(dst)._add_control_input(self._op(src))  # noqa: SLF001

    # -- helpers
    def _op(self, name: str) -> tf.Operation:
        return self.graph.get_operation_by_name(name)
