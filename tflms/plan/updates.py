"""Update waits: a variable is written once the step has done with its reads of it.

A ``ReadVariableOp``'s output is the variable's own buffer, and an update that
finds that buffer still shared writes into a new one: TensorFlow copies the
variable on write (``PrepareToUpdateVariable``), and the old buffer lives on
until the read's last reader ends. Keras's weight decay is such an update.
``var.assign_sub(var * lr * wd)`` waits for nothing of the backward pass, so
TensorFlow's executor runs it as the step starts, while the forward pass's
reads of the weights are held for the backward pass (the input gradient of a
``MatMul`` reads its weight again): the step holds every decayed weight twice
until its layer's gradient is made. A ``tf.profiler`` memory trace of
``benchmarks/bench_remat.py``'s residual MLP under AdamW shows 16 of its
8 MiB kernels copied this way at the step's peak, 128 of its 650 MiB (the
simulator counts these copies: :mod:`tflms.simulation.memory`).

:func:`update_waits` returns control edges that make each variable's first
update of the step, and the update's own reads of the variable (the decay's
``var`` in ``var * lr * wd``), wait for the backward pass's readers of the
step's *held* reads: the reads made before the update (TensorFlow's
automatic control dependencies run a variable's reads and writes in the
order the step created them; a step still being traced gets those edges
when its tracing ends, so the creation order is what counts) whose values
the forward and backward passes read. The update then runs after the
weight's last use and writes in place, and its temporaries
(``var * lr * wd`` is weight-sized) are made then too.

The edges change when ops run, never what they compute: TensorFlow already
orders every read of a variable before the update, so each read sees the
value it saw. Only matrix products and convolutions of the backward pass are
waited for (they read a weight last: a forward reader feeds the loss they
wait for; a weight read by anything else there keeps its order), never one
in a fold of Grappler's arithmetic optimizer or one that reads or makes an
input of a sum of 3+ inputs (as :mod:`tflms.plan.release`: without that
rule, the 8-block MLP of ``benchmarks/bench_remat.py``, whose down
projections' input gradients read the residual stream's gradient sum,
trained to a different result in each of three processes), and no edge closes a cycle: a reader that an update of the step precedes is
never waited for. A forward matmul gains no edge: a control edge out of it
would stop Grappler's remapper from fusing it with its bias add.

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph(name="decay")
    >>> def op(name, kind, *ins, dtype="float32", control=()):
    ...     out = TensorInfo(f"{name}:0", 0, dtype, (1024,), 4096)
    ...     v.add_node(name, type=kind, device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=kind.endswith("VariableOp"),
    ...                tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    ...     for src in control:
    ...         v.add_edge(src, name, tensors=[], control=True)
    >>> op("w", "_Arg", dtype="resource"); op("x", "_Arg")
    >>> op("read", "ReadVariableOp", "w"); op("y", "MatMul", "x", "read")
    >>> op("gradients/dy", "TanhGrad", "y"); op("gradients/dx", "MatMul", "gradients/dy", "read")
    >>> op("decay_read", "ReadVariableOp", "w", control=("read",))
    >>> op("scaled", "Mul", "decay_read")
    >>> op("decay", "AssignSubVariableOp", "w", "scaled", control=("read", "decay_read"))
    >>> assign_levels(v)
    >>> update_waits(v)  # the decay and its read wait for the weight's backward matmul
    (('gradients/dx', 'decay'), ('gradients/dx', 'decay_read'))
"""

from __future__ import annotations

import networkx as nx

from tflms.cost.ops import ALIAS_OPS, DENSE_OPS, updates_a_variable
from tflms.graph.grappler_rules import in_a_fold
from tflms.plan.phases import turn_level
from tflms.plan.release import beside_a_sum, buffer_readers

__all__ = ["update_waits", "WAITABLE"]

WAITABLE = DENSE_OPS
"""The backward readers an update may wait for: the matrix products and convolutions that
read weights (see :data:`tflms.plan.release.WAITABLE` for why never smaller ops)."""

_MAX_TAIL = 4096
"""An update whose descendants exceed this many ops is left alone (the cycle check's bound)."""


def update_waits(
    view: nx.DiGraph, avoid: frozenset[str] = frozenset()
) -> tuple[tuple[str, str], ...]:
    """``(reader, update op)`` control edges (see the module doc), sorted.

    Args:
        view: the analysis view of a training step, with levels.
        avoid: ops that the plan these edges join makes other ops wait for (its
            triggers): an update that precedes one of them is left alone, since
            the op may start a re-run or a swap-in that a waited reader needs.

    Returns:
        The edges; empty for a step that writes no variable while a read of it
        is held by a matrix product or convolution.
    """
    levels = nx.get_node_attributes(view, "level")
    turn = turn_level(view)
    position = {name: i for i, name in enumerate(view)}  # the ops' creation order
    proposals: list[tuple[set[str], set[str]]] = []  # (readers waited for, ops that wait)
    tails: set[str] = set()
    for users in _variable_users(view).values():
        writes = [u for u in users if updates_a_variable(view.nodes[u]["type"])]
        if not writes:
            continue
        first = min(writes, key=position.__getitem__)
        reads = [u for u in users if position[u] < position[first] and u not in writes]
        held, own = _split_reads(view, first, reads)
        readers = set().union(*(buffer_readers(view, r, 0) for r in held)) if held else set()
        readers = {r for r in readers if view.nodes[r]["type"] not in ALIAS_OPS}
        late = {r for r in readers if levels[r] >= turn}  # the forward readers come before
        if not late or not all(_may_wait(view, r) for r in late):
            continue
        readers = late
        waiting = {first, *own}
        tail = _descendants(view, waiting)
        if tail is None or readers & tail or avoid & (tail | waiting):
            continue
        tails |= tail
        proposals.append((readers, waiting))
    edges = {
        (reader, op)
        for readers, waiting in proposals
        if not readers & tails  # no update of the step precedes a waited reader: no cycle
        for reader in readers
        for op in waiting
    }
    return tuple(sorted(edges))


def _variable_users(view: nx.DiGraph) -> dict[tuple[str, int], list[str]]:
    """``{(handle op, output index): ops reading or writing that resource}``."""
    found: dict[tuple[str, int], list[str]] = {}
    for name, data in view.nodes(data=True):
        kind = data["type"]
        if kind != "ReadVariableOp" and not updates_a_variable(kind):
            continue
        for src, edge in view.pred[name].items():
            outputs = view.nodes[src].get("outputs") or ()
            for k, _ in edge.get("tensors", ()):
                if k < len(outputs) and outputs[k].dtype == "resource":
                    found.setdefault((src, k), []).append(name)
    return found


def _split_reads(view: nx.DiGraph, update: str, reads: list[str]):
    """``(held reads, the update's own reads)`` of ``reads``: a read is the update's own
    when every reader of its value leads to the update within a few ops."""
    held, own = set(), set()
    for read in reads:
        readers = buffer_readers(view, read, 0)
        if readers and all(_leads_to(view, r, update) for r in readers):
            own.add(read)
        else:
            held.add(read)
    return held, own


def _leads_to(view: nx.DiGraph, op: str, target: str, hops: int = 4) -> bool:
    frontier = {op}
    for _ in range(hops):
        if target in frontier:
            return True
        frontier = {s for f in frontier for s in view.succ[f]}
    return target in frontier


def _descendants(view: nx.DiGraph, ops: set[str]) -> set[str] | None:
    """Every op after ``ops``; None past :data:`_MAX_TAIL`."""
    seen: set[str] = set()
    todo = list(ops)
    while todo:
        for s in view.succ[todo.pop()]:
            if s not in seen:
                seen.add(s)
                if len(seen) > _MAX_TAIL:
                    return None
                todo.append(s)
    return seen


def _may_wait(view: nx.DiGraph, reader: str) -> bool:
    data = view.nodes[reader]
    return not (
        data["type"] not in WAITABLE
        or data["stateful"]
        or data["control_flow"]
        or data.get("tflms")
        or in_a_fold(view, reader)
        or beside_a_sum(view, reader)
    )
