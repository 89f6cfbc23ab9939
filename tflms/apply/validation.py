"""Contracts a rewritten graph must satisfy (the ``Graph.lint()`` of tflms).

:func:`validate` checks a ``tf.Graph``/``FuncGraph`` or an analysis view,
optionally against the :class:`~tflms.plan.swap_plan.SwapPlan` that was applied:

* the graph is acyclic (TF1 loop back edges aside);
* every swap-out is an Identity on the host device reading its tensor, and
  feeds at least one swap-in;
* every swap-in is an Identity reading a swap-out, placed on its consumers'
  device, and every consumer it serves reads it at the planned input;
* every trigger and wait edge of the plan is present;
* there are no swap ops the plan does not account for;
* no swap keeps Grappler's arithmetic optimizer from a fold it would apply
  to the graph without the plan (:mod:`tflms.graph.grappler_rules`): no
  swapped tensor's producer folds into its one consumer, no op of a fold
  gains a control fanout to a swap op. These are tflms' own rules of what
  Grappler does; the pipeline's check (``LMSConfig.check_rewrites``,
  :mod:`tflms.simulation.grappler.rewrites`) runs Grappler itself on both
  graphs before a plan is applied.
"""

from __future__ import annotations

from itertools import pairwise

import networkx as nx

from tflms.config import LMSConfig
from tflms.errors import UnsupportedGraphError, ValidationError
from tflms.graph.grappler_rules import folds_into_a_consumer, in_a_fold
from tflms.graph.view import assign_levels, build_view
from tflms.plan.entries import SCOPE
from tflms.plan.swap_plan import SwapPlan
from tflms.utils.devices import same_device

__all__ = ["validate"]


def validate(graph, plan: SwapPlan | None = None, *, host_device: str | None = None) -> None:
    """Raise :class:`ValidationError` listing every broken invariant.

    Args:
        graph: a ``tf.Graph``/``FuncGraph`` or an analysis view.
        plan: the plan applied to it; without one only the structural rules
            (acyclic, swap-out -> swap-in pairing, devices) are checked.
        host_device: the host device; defaults to the plan's, else
            ``/device:CPU:0``.

    Example:
        >>> import tensorflow as tf
        >>> g = tf.Graph()
        >>> with g.as_default():
        ...     _ = tf.nn.relu(tf.ones([4, 4]))
        >>> validate(g)  # no swap ops, nothing to complain about
    """
    if isinstance(graph, nx.DiGraph):
        view = graph.copy()
        try:
            assign_levels(view)
        except UnsupportedGraphError as err:
            raise ValidationError(str(err)) from err
    else:
        try:
            view = build_view(graph)
        except UnsupportedGraphError as err:
            raise ValidationError(str(err)) from err
    host = host_device or (plan.config.host_device if plan else LMSConfig().host_device)
    problems = _structural(view, host)
    problems.extend(_blocked_folds(view))
    if plan is not None:
        problems.extend(_against_plan(view, plan))
    if problems:
        shown = "\n  - ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ValidationError(
            f"{len(problems)} invariant(s) broken in {view.graph.get('name')!r}:\n  - {shown}{more}"
        )


def _data_inputs(view: nx.DiGraph, node: str) -> dict[int, tuple[str, int]]:
    inputs = {}
    for pred, edge in view.pred[node].items():
        for out_idx, in_idx in edge.get("tensors", ()):
            inputs[in_idx] = (pred, out_idx)
    return inputs


def _same_placement(a: str, b: str) -> bool:
    return a == b or bool(a and b and same_device(a, b))


def _structural(view: nx.DiGraph, host: str) -> list[str]:
    problems = []
    for name, data in view.nodes(data=True):
        kind = data.get("tflms")
        if not kind:
            continue
        if kind == "recompute":
            problems.extend(_structural_clone(view, name, data, host))
            continue
        if kind == "gate":
            problems.extend(_structural_gate(view, name, data))
            continue
        if kind == "hold":
            problems.extend(_structural_hold(view, name, data))
            continue
        if data["type"] != "Identity":
            problems.append(f"swap op {name} is a {data['type']}, not an Identity")
        inputs = _data_inputs(view, name)
        if len(inputs) != 1:
            problems.append(f"swap op {name} has {len(inputs)} data inputs, expected 1")
            continue
        src, _ = inputs[0]
        if kind == "out":
            if not data["device"] or not same_device(data["device"], host):
                problems.append(
                    f"swap-out {name} is on {data['device']!r}, expected the host {host!r}"
                )
            swap_ins = [s for s in view.succ[name] if view.nodes[s].get("tflms") == "in"]
            if not swap_ins:
                problems.append(f"swap-out {name} feeds no swap-in")
        elif kind == "in":
            if view.nodes[src].get("tflms") != "out":
                problems.append(f"swap-in {name} reads {src}, which is not a swap-out")
            readers = [s for s, e in view.succ[name].items() if e.get("tensors")]
            if not readers:
                problems.append(f"swap-in {name} has no consumer")
            for reader in readers:
                if not _same_placement(view.nodes[reader]["device"], data["device"]):
                    problems.append(
                        f"swap-in {name} is on {data['device']!r} but its consumer {reader} is on "
                        f"{view.nodes[reader]['device']!r}"
                    )
        else:
            problems.append(f"op {name} has an unknown swap kind {kind!r}")
    return problems


def _blocked_folds(view: nx.DiGraph) -> list[str]:
    """Folds of Grappler's arithmetic optimizer the swap ops would block (see the module doc)."""
    swap_ops = [n for n, d in view.nodes(data=True) if d.get("tflms") in ("out", "in")]
    if not swap_ops:
        return []
    restored = view.copy()  # the graph as it was: consumers read the producers again
    for name in swap_ops:
        if view.nodes[name]["tflms"] != "in":
            continue
        swap_out = _data_inputs(view, name).get(0)
        source = _data_inputs(view, swap_out[0]).get(0) if swap_out else None
        if source is None:
            continue  # _structural names it
        for reader, edge in view.succ[name].items():
            for _, in_idx in edge.get("tensors", ()):
                tensors = restored.get_edge_data(source[0], reader, {}).get("tensors", [])
                restored.add_edge(
                    source[0],
                    reader,
                    tensors=[*tensors, (source[1], in_idx)],
                    control=restored.get_edge_data(source[0], reader, {}).get("control", False),
                )
    restored.remove_nodes_from(swap_ops)
    problems = []
    for name in swap_ops:
        kind = view.nodes[name]["tflms"]
        if kind == "out":
            for src, _ in _data_inputs(view, name).values():
                if src in restored and folds_into_a_consumer(restored, src):
                    problems.append(
                        f"swap-out {name} adds a consumer to {src}, which Grappler's arithmetic "
                        "optimizer folds into its one consumer: the swap changes the float "
                        "arithmetic of the step"
                    )
        for src, edge in view.pred[name].items():
            if edge.get("control") and src in restored and in_a_fold(restored, src):
                problems.append(
                    f"{src} has a control edge to {name} but takes part in a fold of Grappler's "
                    "arithmetic optimizer: the edge changes the float arithmetic of the step"
                )
    return problems


def original_of(clone: str) -> str:
    """The op a recompute clone copies (``a/b-lms/recompute_2`` -> ``a/b``).

    Args:
        clone: Name of a recompute clone.

    Returns:
        The clone's name with its ``-lms/recompute[_k]`` suffix removed; a name
        without the suffix is returned unchanged.
    """
    return clone.rsplit(f"-{SCOPE}/recompute", 1)[0]


def _structural_clone(view: nx.DiGraph, name: str, data: dict, host: str) -> list[str]:
    original = original_of(name)
    if original not in view:
        return [f"recompute clone {name} has no original op {original}"]
    source = view.nodes[original]
    problems = []
    if data["type"] != source["type"]:
        problems.append(
            f"recompute clone {name} is a {data['type']}, its original a {source['type']}"
        )
    if len(_data_inputs(view, name)) != len(_data_inputs(view, original)):
        problems.append(f"recompute clone {name} has another number of inputs than {original}")
    host_cast = data["type"] == "Cast" and _same_placement(data["device"], host)
    if not _same_placement(data["device"], source["device"]) and not host_cast:
        # (a weight's cast may run on the host: tflms.plan.streams.plan_host_casts)
        problems.append(f"recompute clone {name} is on {data['device']!r}, not with {original}")
    return problems


def _structural_gate(view: nx.DiGraph, name: str, data: dict) -> list[str]:
    problems = []
    if data["type"] != "Identity" or len(_data_inputs(view, name)) != 1:
        problems.append(f"gate {name} is not an Identity of one input")
    readers = [s for s, e in view.succ[name].items() if e.get("tensors")]
    others = [r for r in readers if view.nodes[r].get("tflms") != "recompute"]
    if not readers or others:
        problems.append(f"gate {name} must feed recompute clones only, not {others}")
    return problems


def _structural_hold(view: nx.DiGraph, name: str, data: dict) -> list[str]:
    problems = []
    inputs = _data_inputs(view, name)
    if data["type"] != "Identity" or len(inputs) != 1:
        problems.append(f"hold {name} is not an Identity of one input")
    readers = [s for s, e in view.succ[name].items() if e.get("tensors")]
    if readers:
        problems.append(f"hold {name} must give its tensor to no one, not to {readers}")
    return problems


def _against_plan(view: nx.DiGraph, plan: SwapPlan) -> list[str]:
    problems = []
    for recompute in plan.recomputes:
        problems.extend(_recompute_against_plan(view, plan, recompute))
    for before, after in plan.order:
        if not (view.has_edge(before, after) and view[before][after]["control"]):
            problems.append(f"order edge {before} -> {after} is missing")
    planned = plan.op_names()
    for name, data in view.nodes(data=True):
        if data.get("tflms") and name not in planned:
            problems.append(f"swap op {name} is not part of the plan")
    for swap in plan.swaps:
        out = swap.swapout_name
        if out not in view:
            problems.append(f"swap-out {out} for {swap.tensor} is missing")
            continue
        if _data_inputs(view, out).get(0) != (swap.producer, swap.index):
            problems.append(f"swap-out {out} does not read {swap.tensor}")
        for op in swap.wait_for_swapout:
            if not (view.has_edge(out, op) and view[out][op]["control"]):
                problems.append(f"{op} does not wait for swap-out {out} (sync mode 1)")
        for k, swap_in in enumerate(swap.swap_ins):
            name = swap.swapin_name(k)
            if name not in view:
                problems.append(f"swap-in {name} for {swap.tensor} is missing")
                continue
            if _data_inputs(view, name).get(0) != (out, 0):
                problems.append(f"swap-in {name} does not read swap-out {out}")
            for consumer, index in swap_in.consumers:
                if consumer not in view:
                    problems.append(f"consumer {consumer} of {name} does not exist")
                elif _data_inputs(view, consumer).get(index) != (name, 0):
                    problems.append(f"input {index} of {consumer} does not read swap-in {name}")
            waits = ([swap_in.trigger] if swap_in.trigger else []) + list(swap_in.control_inputs)
            for op in waits:
                if not (view.has_edge(op, name) and view[op][name]["control"]):
                    problems.append(f"swap-in {name} lacks its control edge from {op}")
    for chain in plan.serialization:
        for before, after in pairwise(chain):
            if not (view.has_edge(before, after) and view[before][after]["control"]):
                problems.append(f"serialization edge {before} -> {after} is missing")
    return problems


def _recompute_against_plan(view: nx.DiGraph, plan: SwapPlan, recompute) -> list[str]:
    """A clone reads the group's clones, or the original tensor or a swap-in of it."""
    problems = []
    clones = {r.clone_name(op): op for r in plan.recomputes for op in r.ops}
    swapped_in = {
        s.swapin_name(k): (s.producer, s.index) for s in plan.swaps for k in range(len(s.swap_ins))
    }
    gated = {r.gate_name(i): t for r in plan.recomputes for i, t in enumerate(r.gates)}

    def meaning(tensor):  # what a tensor stands for: gates, swap-ins and clones by their originals
        src, k = gated.get(tensor[0], tensor)
        src, k = swapped_in.get(src, (src, k))
        return clones.get(src, src), k

    for op, clone in zip(recompute.ops, recompute.clone_names, strict=True):
        if clone not in view:
            problems.append(f"recompute clone {clone} is missing")
            continue
        expected = {i: meaning(src) for i, src in _data_inputs(view, op).items()}
        for index, src in _data_inputs(view, clone).items():
            if src[0] in recompute.ops or meaning(src) != expected.get(index):
                problems.append(
                    f"input {index} of recompute clone {clone} reads {src[0]}:{src[1]}, "
                    f"not {expected.get(index)}"
                )
    for consumer, index, op, k in recompute.consumers:
        read = _data_inputs(view, consumer).get(index)
        if read is None or meaning(read) != (op, k) or read[0] == op:
            problems.append(f"input {index} of {consumer} does not read {recompute.clone_name(op)}")
    for i, tensor in enumerate(recompute.held):
        hold = recompute.hold_name(i)
        if hold not in view or _data_inputs(view, hold).get(0) != tensor:
            problems.append(f"hold {hold} does not read {tensor[0]}:{tensor[1]}")
    for i, tensor in enumerate(recompute.gates):
        gate = recompute.gate_name(i)
        read = _data_inputs(view, gate).get(0) if gate in view else None
        if read is None or meaning(read) != meaning(tensor):
            problems.append(f"gate {gate} does not read {tensor[0]}:{tensor[1]}")
    if recompute.trigger is not None:
        # an original may read a swap-in of another member (a far consumer in the forward pass)
        entries = recompute.entry_ops(
            lambda o: [meaning(s)[0] for s in _data_inputs(view, o).values()]
        )
        started = (
            [recompute.gate_name(i) for i in range(len(recompute.gates))]
            if recompute.gates
            else [recompute.clone_name(op) for op in entries]
        )
        for name in started:
            for op in (recompute.trigger, *recompute.control_inputs):
                edge = view.get_edge_data(op, name) or {}
                if name in view and not edge.get("control"):
                    problems.append(f"{name} lacks its control edge from {op}")
    return problems
