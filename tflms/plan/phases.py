"""Which part of a training step is its forward pass.

* :func:`turn_level`: the level where the backward pass begins (the first
  gradient op that reads another, from the level of the last forward
  activation any gradient op reads on), or, in a graph without one, the level where the most
  bytes are held across.
* :func:`batch_dependent`: the ops whose outputs depend on the step's
  batch (activations), as opposed to those computed from weights and
  constants alone.

Segment checkpointing (:mod:`tflms.plan.segments`) cuts the forward pass
before the turn; recomputation (:mod:`tflms.plan.recompute`) serves the
readers after it.
"""

from __future__ import annotations

import networkx as nx

from tflms.graph.grappler_rules import folded_to_constants
from tflms.graph.view import consumers as tensor_consumers
from tflms.graph.view import is_gradient_op
from tflms.plan.candidates import NEVER_SWAP_PRODUCERS
from tflms.plan.rerun_cost import data_inputs
from tflms.utils.memo import per_view

__all__ = ["turn_level", "batch_dependent", "BATCH_SOURCES"]


@per_view
def turn_level(view: nx.DiGraph) -> int:
    """The end of the forward pass: the first level of a gradient op that reads another
    (:func:`~tflms.graph.view.is_gradient_op`; ops of the batch's shapes aside) from the
    level of the last forward activation a gradient op reads on, else the level where the
    most bytes are held across.

    A gradient's factor computed from forward values alone (a ``Pow``'s ``y * x**(y-1)``,
    a hard-swish's slope) runs as soon as its inputs exist, early in the forward pass;
    taken for the turn, it would make most of the forward pass "backward". The loss's
    own value is the last forward activation the backward pass reads, so the turn is
    looked for from its level on (the loss's reductions run beside the first gradient
    ops; the last such value, in a graph with several losses).

    Args:
        view: the analysis view, with levels.

    Returns:
        The level.
    """
    levels = nx.get_node_attributes(view, "level")
    activations = batch_dependent(view)
    shapes = folded_to_constants(view)  # computed from the batch's shapes alone: run early
    gradients = {
        name
        for name in activations - shapes
        if is_gradient_op(name, view.nodes[name]["type"])
        and view.nodes[name]["type"] not in NEVER_SWAP_PRODUCERS
    }
    # in the chain from the loss's gradient on (not an embedding's indices read early)
    backward = [
        levels[name]
        for name in gradients
        if any(src in gradients for src, _ in data_inputs(view, name))
    ]
    if backward:
        last_forward = _last_forward_read(view, gradients, activations - shapes)
        after = [level for level in backward if level >= last_forward]
        return min(after or backward)
    delta: dict[int, int] = {}
    for name, data in view.nodes(data=True):
        if data["type"] in NEVER_SWAP_PRODUCERS or name not in activations:
            continue
        lp = levels[name]
        for info in data["outputs"]:
            last = max((levels[c] for c, _ in tensor_consumers(view, name, info.index)), default=lp)
            if last > lp + 1 and info.bytes:
                delta[lp + 1] = delta.get(lp + 1, 0) + info.bytes
                delta[last] = delta.get(last, 0) - info.bytes
    best, held, turn = -1, 0, 0
    for level in sorted(delta):
        held += delta[level]
        if held > best:
            best, turn = held, level
    return turn


def _last_forward_read(view: nx.DiGraph, gradients: set[str], activations: frozenset[str]) -> int:
    """The highest level of a forward activation (no gradient op among its ancestors)
    that a gradient op reads; -1 if none."""
    downstream: set[str] = set()  # gradient ops and everything computed from them
    for name in nx.topological_sort(view):
        if name in gradients or any(src in downstream for src, _ in data_inputs(view, name)):
            downstream.add(name)
    last = -1
    for name in gradients:
        for src, _ in data_inputs(view, name):
            if src in activations and src not in downstream:
                last = max(last, view.nodes[src]["level"])
    return last


BATCH_SOURCES = frozenset(
    {
        "Placeholder",
        "PlaceholderV2",
        "PlaceholderWithDefault",
        "_Arg",
        "_Recv",
        "IteratorGetNext",
        "IteratorGetNextSync",
        "OptionalGetValue",
    }
)
"""Ops whose outputs (other than resource handles) are the step's batch."""


@per_view  # the planner asks 3x per plan
def batch_dependent(view: nx.DiGraph) -> frozenset[str]:
    """The ops whose outputs depend on the step's batch.

    The others compute from weights and constants alone (a causal mask, a
    weight's reshape): their tensors are not activations, whenever they run.

    Computed once per view (:func:`~tflms.utils.memo.per_view`).

    Args:
        view: the analysis view.

    Returns:
        Their names.
    """
    found: set[str] = set()
    for name in nx.topological_sort(view):
        data = view.nodes[name]
        if data["type"] in BATCH_SOURCES:
            if any(info.dtype not in ("resource", "variant") for info in data["outputs"]):
                found.add(name)
        elif any(src in found for src, _ in data_inputs(view, name)):
            found.add(name)
    return frozenset(found)
