"""Release waits: a re-run starts after the backward tensors that die before it are freed.

A recomputation group starts at its trigger, an op of the backward pass. A
tensor the backward pass makes is often read by an op on the way to that
trigger (the gradient chain's next op) and by *side readers* nothing soon
needs (the bias gradient and the weight gradient reading a loss's
backprop). TensorFlow's executor runs ready ops in no fixed order, and a
side reader queued behind the re-run keeps its tensor alive beside the
re-run's tensors. Measured on ``benchmarks/bench_remat.py``'s GPT stack
(TensorFlow's CPU allocator, two inter-op threads): the loss's 64 MiB
backprop stayed alive through the last block's re-run in one step of two or
three, adding 45 MiB to the step's peak, under ``keras.RematScope`` and
tflms alike.

:func:`release_waits` makes each group also wait for those side readers
(:attr:`~tflms.plan.entries.Recompute.control_inputs`): for every tensor of
the backward pass that an op before the trigger reads, and whose every
reader can run by the trigger's level, the re-run waits for the readers
that are not before the trigger (and that no re-run triggered earlier waits
for already). Readers through an alias (a ``Reshape`` of the tensor shares
its buffer) count as readers of the tensor.

The waits change when ops run, never what they compute, and nothing else:
only the heavy side readers are waited for (:data:`WAITABLE`: the bias and
weight gradients above), and never one that takes part in a fold of
Grappler's arithmetic optimizer, a stateful one, one that reads the group's
own clones, or one that reads or makes an input of a sum of 3+ inputs
(:data:`~tflms.plan.candidates.ORDER_SENSITIVE`: ordering the two decides
which buffer the sum reuses). So Grappler's rewrite, a sum's order and
TensorFlow's ordering of the step's state stay as they are, and no edge
closes a cycle (a side reader's level is at most the trigger's, below every
op the re-run feeds).

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> from tflms.plan.entries import Recompute
    >>> v = nx.DiGraph(name="loss")
    >>> def op(name, kind, *ins, nbytes=1 << 20):
    ...     out = TensorInfo(f"{name}:0", 0, "float32", (nbytes // 4,), nbytes)
    ...     v.add_node(name, type=kind, device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    >>> op("h", "Relu"); op("logits", "MatMul", "h")
    >>> op("backprop", "SparseSoftmaxCrossEntropyWithLogits", "logits", nbytes=64 << 20)
    >>> op("dh", "MatMul", "backprop"); op("dbias", "BiasAddGrad", "backprop", nbytes=4)
    >>> op("dh2", "ReluGrad", "dh", "h")
    >>> assign_levels(v)
    >>> group = Recompute(ops=("h",), consumers=(("dh2", 1, "h", 0),), trigger="dh",
    ...                   trigger_level=v.nodes["dh"]["level"])
    >>> [g.control_inputs for g in release_waits(v, (group,), turn=2, min_bytes=1)]
    [('dbias',)]
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from tflms.cost.ops import ALIAS_OPS, DENSE_OPS
from tflms.graph.grappler_rules import in_a_fold
from tflms.graph.view import consumers as tensor_consumers
from tflms.plan.candidates import WEIGHT_GRADIENT_OPS, order_sensitive
from tflms.plan.entries import Recompute

__all__ = ["release_waits", "WAITABLE", "buffer_readers", "beside_a_sum"]

WAITABLE = DENSE_OPS | WEIGHT_GRADIENT_OPS
"""The side readers a re-run may wait for: matrix products, convolutions and weight
gradients, which Grappler never removes or folds away. A control edge out of a small
reduction or a shape op (a bias-like gradient's ``Sum``, a ``BroadcastGradientArgs``)
keeps Grappler from simplifying it: seen on KerasHub's GPT-2, BERT and Llama, whose
steps were then rewritten differently and trained up to 3e-7 apart."""


def release_waits(
    view: nx.DiGraph, groups: tuple[Recompute, ...], *, turn: int, min_bytes: int
) -> tuple[Recompute, ...]:
    """``groups`` with the side readers their re-runs wait for (see the module doc).

    Args:
        view: the analysis view the groups were planned on, with levels.
        groups: recomputation groups.
        turn: the level where the backward pass starts
            (:func:`~tflms.plan.phases.turn_level`): only its tensors are weighed.
        min_bytes: smaller tensors are not waited for.

    Returns:
        The groups, each with its :attr:`~tflms.plan.entries.Recompute.control_inputs`.
    """
    levels = nx.get_node_attributes(view, "level")
    waited: set[str] = set()  # by a re-run triggered earlier, which this one comes after
    found: dict[int, tuple[str, ...]] = {}
    timed = [(levels[g.trigger], i) for i, g in enumerate(groups) if g.trigger is not None]
    for bound, i in sorted(timed):
        group = groups[i]
        before = nx.ancestors(view, group.trigger) | {group.trigger}
        rerouted = {c for c, _, _, _ in group.consumers}
        waits: set[str] = set()
        for op in before:
            if levels[op] < turn:
                continue
            for info in view.nodes[op]["outputs"]:
                if info.bytes < max(min_bytes, 1):
                    continue
                readers = buffer_readers(view, op, info.index)
                side = readers - before
                if side and len(side) < len(readers) and _may_wait(view, side, bound, rerouted):
                    waits |= side
        found[i] = tuple(sorted(waits - waited))
        waited |= waits
    return tuple(
        dataclasses.replace(g, control_inputs=found[i]) if found.get(i) else g
        for i, g in enumerate(groups)
    )


def buffer_readers(view: nx.DiGraph, op: str, index: int) -> set[str]:
    """The readers of ``op:index`` and of the aliases that share its buffer."""
    found: set[str] = set()
    todo = [(op, index)]
    while todo:
        producer, k = todo.pop()
        for reader, slot in tensor_consumers(view, producer, k):
            if reader in found:
                continue
            found.add(reader)
            if view.nodes[reader]["type"] in ALIAS_OPS and slot == 0:
                todo.append((reader, 0))
    return found


def _may_wait(view: nx.DiGraph, side: set[str], bound: int, rerouted: set[str]) -> bool:
    """Whether a re-run triggered at level ``bound`` may wait for every op of ``side``."""
    for reader in side:
        data = view.nodes[reader]
        if (
            data["type"] not in WAITABLE
            or data["level"] > bound
            or reader in rerouted
            or data["stateful"]
            or data["control_flow"]
            or data.get("tflms")
            or in_a_fold(view, reader)
            or beside_a_sum(view, reader)
        ):
            return False
    return True


def beside_a_sum(view: nx.DiGraph, reader: str) -> bool:
    """Whether ``reader`` reads, or makes, a tensor a sum of 3+ inputs reads: ordering
    the two, or a control edge out of an input's producer, decides which input buffer
    the sum reuses, hence its summation order."""
    tensors = [(reader, info.index) for info in view.nodes[reader]["outputs"]]
    for src, edge in view.pred[reader].items():
        tensors += [(src, k) for k, _ in edge.get("tensors", ())]
    return any(
        order_sensitive(view, c) for src, k in tensors for c, _ in tensor_consumers(view, src, k)
    )
