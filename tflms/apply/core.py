"""Apply: execute a SwapPlan on a graph - the only step that mutates.

One applier core drives interchangeable *editors*, so every graph
representation gets exactly the same rewrite:

* :class:`tflms.apply.graph_editor.GraphEditor` edits a live ``tf.Graph`` /
  ``FuncGraph`` in place (Keras train functions, ``tf.function``, TF1 graphs);
* :class:`tflms.apply.view_editor.ViewEditor` edits a copy of the networkx view
  (used by the simulator and by property tests);
* :class:`tflms.apply.proto_editor.ProtoEditor` edits ``GraphDef`` /
  ``FunctionDef`` protobufs (SavedModels, frozen graphs).

The core applies a plan's levers in order. For every recomputation it clones
the group's ops (``<op>-lms/recompute``, same type and attributes, reading
the group's clones or the original tensors), reroutes the far consumers to
the clones and adds the trigger edges into the clones that read nothing of
the group. For every swap it inserts ``lms/swapout_<tensor>`` (an Identity
on the host device) fed by the tensor, one swap-in ``<producer>-lms/swapin``
per consumer group (an Identity on the consumers' device; see
:mod:`tflms.plan.entries` for the naming) fed by the swap-out, reroutes the
consumers' inputs - clones among them - to the swap-in and adds the trigger
control edge. Then the serialization chains and the order edges.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from itertools import pairwise
from typing import Protocol

from tflms.apply.validation import original_of
from tflms.errors import AlreadyRewrittenError, ValidationError
from tflms.plan.swap_plan import SwapPlan
from tflms.utils.gc_pause import gc_paused

__all__ = ["Editor", "apply_with", "apply_plan", "apply_to_view", "apply_in_place"]

logger = logging.getLogger(__name__)


class Editor(Protocol):
    """What the applier core needs from a graph representation."""

    def swap_ops(self) -> list[str]:
        """Names of tflms swap ops already in the graph.

        Returns:
            The names of the ops (swap ops and recompute clones) that carry the
            tflms marker attribute; empty for a graph tflms has not rewritten.
        """

    def missing(self, names: set[str]) -> list[str]:
        """Which of ``names`` are not ops of the graph.

        Args:
            names: Op names the plan refers to (function arguments count as ops
                for a ``FunctionDef``).

        Returns:
            The names in ``names`` the graph has no op for, in no particular
            order; empty when the plan matches the graph.
        """

    def device_of(self, op: str) -> str:
        """The device string of ``op``.

        Args:
            op: Name of an existing op.

        Returns:
            The op's requested device as written in the graph (for example
            ``"/device:GPU:0"``), or ``""`` when it has none.
        """

    def has_op(self, name: str) -> bool:
        """Whether an op called ``name`` exists.

        Args:
            name: Op name to look up.

        Returns:
            True if the graph already has an op (or function argument) of that name.
        """

    def add_identity(self, name: str, source: tuple[str, int], device: str, kind: str) -> None:
        """Insert an Identity ``name`` reading ``source`` on ``device``, marked as swap ``kind``.

        Args:
            name: Name of the new op; the caller has checked it is free.
            source: ``(op name, output index)`` of the tensor the Identity reads.
            device: Device string to place the op on; ``""`` leaves it unplaced.
            kind: ``"out"`` for a swap-out (host side), ``"in"`` for a swap-in
                (compute side), ``"gate"`` (what a recompute clone reads
                through) or ``"hold"`` (what keeps a recomputed original's
                readers, see :class:`~tflms.plan.entries.Recompute`); stored
                in the marker attribute.
        """

    def reroute(self, consumer: str, input_index: int, source: tuple[str, int]) -> None:
        """Make input ``input_index`` of ``consumer`` read ``source``.

        Args:
            consumer: Name of the op whose input changes.
            input_index: Position of the data input to change (0-based, control
                inputs not counted).
            source: ``(op name, output index)`` of the tensor to read instead.
        """

    def add_control(self, src: str, dst: str) -> None:
        """Add a control edge ``src -> dst``.

        Args:
            src: Op that must run first.
            dst: Op that gets ``src`` as a control input; an existing edge is kept
                as it is.
        """

    def add_clone(
        self,
        name: str,
        original: str,
        inputs: list[tuple[str, int]],
        device: str,
        *,
        keep: bool = True,
    ) -> None:
        """Insert a copy ``name`` of op ``original`` reading ``inputs``, marked as a recomputation.

        Args:
            name: Name of the clone; the caller has checked it is free.
            original: Name of the op to copy (its type, attributes, device and
                control inputs are kept).
            inputs: ``(op name, output index)`` of each data input of the clone,
                in input order.
            device: Where the clone runs; ``""``: the original's device.
            keep: Keep the clone from Grappler (``_grappler_do_not_remove``);
                ``False`` for clones reading gates, which Grappler may fuse.
        """

    def data_inputs(self, op: str) -> list[tuple[str, int]]:
        """``(source op, output index)`` of each data input of ``op``, in input order.

        Args:
            op: Name of an existing op.

        Returns:
            One ``(source op, output index)`` pair per data input (control inputs
            are left out).
        """

    def editing(self) -> contextlib.AbstractContextManager:
        """Context entered around all edits of one plan.

        Returns:
            A context manager; editors with nothing to set up return
            ``contextlib.nullcontext()``.
        """


def apply_with(editor: Editor, plan: SwapPlan) -> int:
    """Apply ``plan`` through ``editor``; returns the number of ops inserted.

    Args:
        editor: The graph representation to edit (a :class:`Editor`, such as
            ``GraphEditor``, ``ViewEditor`` or ``ProtoEditor``).
        plan: The swap plan, made from this very graph.

    Returns:
        The number of ops inserted: swap-outs, swap-ins and recompute clones.

    Raises:
        AlreadyRewrittenError: the graph already holds tflms swap ops.
        ValidationError: the plan names ops the graph does not have, or an
            op name the plan needs is taken.
    """
    existing = editor.swap_ops()
    if existing:
        raise AlreadyRewrittenError(
            f"Graph {plan.graph_name!r} already holds {len(existing)} tflms swap ops "
            f"(e.g. {sorted(existing)[0]!r}); a plan is applied once per graph. "
            "Plan and apply on the original graph (re-trace the function or reload the model)."
        )
    _check_plan_matches(editor, plan)
    host = plan.config.host_device
    with editor.editing(), gc_paused():
        inserted = _edit(editor, plan, host)
    logger.info(
        "tflms: rewrote %s: %d tensors swapped (%d bytes), %d ops inserted",
        plan.graph_name or "graph",
        len(plan.swaps),
        plan.bytes_swapped,
        inserted,
    )
    return inserted


def _edit(editor: Editor, plan: SwapPlan, host: str) -> int:
    inserted = 0
    for recompute in plan.recomputes:
        inserted += _clone_group(editor, recompute)
    for swap in plan.swaps:
        editor.add_identity(swap.swapout_name, (swap.producer, swap.index), host, "out")
        inserted += 1
        for k, swap_in in enumerate(swap.swap_ins):
            name = swap.swapin_name(k)
            device = editor.device_of(swap_in.consumers[0][0])
            editor.add_identity(name, (swap.swapout_name, 0), device, "in")
            inserted += 1
            for consumer, index in swap_in.consumers:
                editor.reroute(consumer, index, (name, 0))
            if swap_in.trigger is not None:
                editor.add_control(swap_in.trigger, name)
            for op in swap_in.control_inputs:
                editor.add_control(op, name)
        for op in swap.wait_for_swapout:
            editor.add_control(swap.swapout_name, op)
    for chain in plan.serialization:
        for before, after in pairwise(chain):
            editor.add_control(before, after)
    for before, after in plan.order:
        editor.add_control(before, after)
    return inserted


def _clone_group(editor: Editor, recompute) -> int:
    """Clone the ops of one recomputation, reroute its consumers, start it at its trigger.

    With gates (:attr:`~tflms.plan.entries.Recompute.gates`) the first clones
    read their inputs through them and only the gates wait for the trigger
    and are kept from Grappler; the clones are optimized like their originals.
    Without, every clone is kept and the first ones wait for the trigger.
    """
    members = set(recompute.ops)
    wanted = {tensor: recompute.gate_name(i) for i, tensor in enumerate(recompute.gates)}
    gates: dict[tuple[str, int], str] = {}  # what a gate reads now -> the gate

    def gated(read: tuple[str, int], reader: str) -> tuple[str, int]:
        # an earlier group may have rerouted the read to its clone of the tensor
        gate = wanted.get(read) or wanted.get((original_of(read[0]), read[1]))
        if gate is None:
            return read
        if read not in gates:
            editor.add_identity(gate, read, recompute.device or editor.device_of(reader), "gate")
            editor.add_control(recompute.trigger, gate)
            gates[read] = gate
        return gates[read], 0

    reads = {}
    for op in recompute.ops:
        reads[op] = editor.data_inputs(op)
        inputs = [
            (recompute.clone_name(src), k) if src in members else gated((src, k), op)
            for src, k in reads[op]
        ]
        editor.add_clone(recompute.clone_name(op), op, inputs, recompute.device, keep=not wanted)
    for consumer, index, op, k in recompute.consumers:
        editor.reroute(consumer, index, (recompute.clone_name(op), k))
    entries = [
        recompute.clone_name(op)
        for op in recompute.entry_ops(lambda o: [src for src, _ in reads[o]])
    ]
    if recompute.trigger is not None and not wanted:
        for clone in entries:
            editor.add_control(recompute.trigger, clone)
    # each original keeps a reader where its far consumers were (Recompute's doc: holds)
    started = list(gates.values()) or entries
    for op in recompute.control_inputs:
        for name in started:
            editor.add_control(op, name)
    for i, (op, k) in enumerate(recompute.held):
        hold = recompute.hold_name(i)
        editor.add_identity(hold, (op, k), editor.device_of(op), "hold")
        for name in started:
            editor.add_control(hold, name)
    return len(recompute.ops) + len(gates) + len(recompute.held)


def _check_plan_matches(editor: Editor, plan: SwapPlan) -> None:
    needed: set[str] = set()
    for recompute in plan.recomputes:
        needed.update(recompute.ops)
        needed.update(c for c, _, _, _ in recompute.consumers)
        if recompute.trigger is not None:
            needed.add(recompute.trigger)
        needed.update(recompute.control_inputs)
    needed.update(op for edge in plan.order for op in edge)
    for swap in plan.swaps:
        needed.add(swap.producer)
        needed.update(swap.wait_for_swapout)
        for swap_in in swap.swap_ins:
            needed.update(c for c, _ in swap_in.consumers)
            needed.update(swap_in.control_inputs)
            if swap_in.trigger is not None:
                needed.add(swap_in.trigger)
    needed.update(op for chain in plan.serialization for op in chain)
    missing = editor.missing(needed - plan.op_names())  # ops the plan itself inserts
    if missing:
        raise ValidationError(
            f"The plan for {plan.graph_name!r} does not match this graph: {len(missing)} ops it names "
            f"are missing (e.g. {sorted(missing)[:3]}). Make the plan from this very graph."
        )
    taken = sorted(name for name in plan.op_names() if editor.has_op(name))
    if taken:
        raise ValidationError(f"Op names reserved for swap ops are already taken: {taken[:3]}.")


def apply_plan(graph, plan: SwapPlan) -> int:
    """Rewrite a ``tf.Graph``/``FuncGraph`` in place; returns the ops inserted.

    Call it while the graph is still being built (for a ``FuncGraph``: before
    tracing ends), as :class:`tflms.LMSCallback` and :func:`tflms.function` do.

    Args:
        graph: The ``tf.Graph`` or ``FuncGraph`` to rewrite in place.
        plan: The swap plan made from ``graph``.

    Returns:
        The number of ops inserted (swap-outs, swap-ins and recompute clones).

    Raises:
        UnsupportedGraphError: ``graph`` is not a ``tf.Graph`` or is finalized.
        AlreadyRewrittenError: ``graph`` already holds tflms swap ops.
        ValidationError: the plan does not match ``graph``.
    """
    from tflms.apply.graph_editor import GraphEditor

    return apply_with(GraphEditor(graph), plan)


def apply_to_view(view, plan: SwapPlan, *, levels: bool = True):
    """Return a rewritten copy of an analysis view (the input is not changed).

    Args:
        view: The analysis view (``networkx.DiGraph``) the plan was made from.
        plan: The swap plan; its ``host_device`` setting places the swap-outs
            (``"/device:CPU:0"`` when absent).
        levels: Recompute the levels (node ``level``, graph ``depth``);
            ``False`` leaves the copied ones, stale where the plan added ops
            or edges, for a caller that reads no level (the simulator).

    Returns:
        A new view with the swap ops, clones and control edges added and,
        with ``levels``, the levels recomputed.

    Raises:
        AlreadyRewrittenError: ``view`` already holds tflms swap ops.
        ValidationError: the plan does not match ``view``.
    """
    from tflms.apply.view_editor import ViewEditor

    editor = ViewEditor(view, host_device=plan.config.host_device)
    apply_with(editor, plan)
    return editor.finish(levels=levels)


def apply_in_place(view, plan: SwapPlan) -> Callable[[], None]:
    """Rewrite an analysis view itself, levels left stale; returns the function that undoes it.

    For a caller that simulates many plans of one view and reads no level
    (:class:`tflms.simulation.plans.PlanSimulator`): copying the view costs
    more than rewriting it. Until the returned function is called, ``view``
    holds the plan's ops; after, it is the view it was (see
    :class:`~tflms.apply.view_editor.ViewEditor`, ``in_place``). A plan that
    fails to apply is undone before the error propagates.

    Args:
        view: The analysis view the plan was made from, without tflms ops.
        plan: The swap plan.

    Returns:
        A function of no arguments that restores ``view``; call it once.

    Raises:
        AlreadyRewrittenError: ``view`` already holds tflms swap ops.
        ValidationError: the plan does not match ``view``.
    """
    from tflms.apply.view_editor import ViewEditor

    editor = ViewEditor(view, host_device=plan.config.host_device, in_place=True)
    try:
        apply_with(editor, plan)
    except BaseException:
        editor.undo()
        raise
    return editor.undo
