"""Scheduling a graph as TensorFlow runs it: nodes Grappler removes are bypassed, dead ones pruned.

:func:`tflms.graph.grappler_rules.removed_at_run_time` says which nodes
Grappler's dependency optimizer deletes before a step runs (an ``IdentityN``
of several inputs: Keras passes all gradients through one, in front of the
optimizer updates). :func:`bypass` rewires a compiled graph around such a
node, so its consumers wait only for the inputs they read.

:func:`dead_at_run_time` says which ops of a traced function never run:
TensorFlow prunes a function body to what its results, its control outputs
and its stateful ops need (``PruneFunctionBody``, and Grappler's pruning of
what no fetch needs), so a branch nothing reads is never computed. Gradients
make such branches: ``tf.nn.silu``'s custom gradient also computes the
gradient with respect to its constant ``beta`` (``Square(x) * sigmoid * (1 -
sigmoid)``, an activation-sized ``Square`` and three products per
activation), hard-swish's ``relu6(x + 3) / 6`` the gradient with respect to
its constant divisor. A diffusion U-Net's swish gradients were predicted at
+23% of the peak TensorFlow's CPU allocator reached, from those tensors alone.
"""

from __future__ import annotations

from collections import deque

import networkx as nx

__all__ = ["bypass", "dead_at_run_time", "prune"]


def dead_at_run_time(view: nx.DiGraph) -> frozenset[str]:
    """Ops of a traced function that TensorFlow prunes: nothing it keeps depends on them.

    Kept are the function's results and control outputs (the view's
    ``returns``), its stateful ops (variable reads and updates, stateful
    random ops, calls and loops) other than its arguments, TF1 control-flow
    ops, and every op any of these depends on through data or control edges.

    Args:
        view: an analysis view (:func:`tflms.build_view`).

    Returns:
        The names of the ops that never run; empty where the view does not
        know the function's results (a ``tf.Graph``, or a function analysed
        while it was being traced), since any op might then be fetched.

    Example:
        >>> import tensorflow as tf, tflms
        >>> @tf.function
        ... def f(x):
        ...     unused = tf.square(x, name="unused")
        ...     return tf.identity(x * 2.0, name="y")
        >>> view = tflms.build_view(f.get_concrete_function(tf.ones([4])).graph)
        >>> sorted(dead_at_run_time(view))
        ['unused']
    """
    returns = view.graph.get("returns")
    if returns is None:
        return frozenset()
    keep = {n for n in returns if n in view}
    for name, node in view.nodes(data=True):
        if node.get("control_flow") or (
            node.get("stateful") and node["type"] not in ("Placeholder", "_Arg")
        ):
            keep.add(name)
    todo = deque(keep)
    while todo:
        for p in view.pred[todo.popleft()]:
            if p not in keep:
                keep.add(p)
                todo.append(p)
    return frozenset(n for n in view if n not in keep)


def prune(i, inputs, consumers, outputs) -> None:
    """Make node ``i`` of a compiled graph read and hold nothing (a pruned op).

    It keeps its place among its successors (they are pruned too) but no
    input waits for it to be read and its outputs weigh 0 bytes. The lists
    are :func:`~tflms.simulation.schedule.compile_view`'s, changed in place.
    """
    for p, k, _ in inputs[i]:
        consumers[(p, k)] = [c for c in consumers.get((p, k), ()) if c != i]
    inputs[i] = []
    outputs[i] = tuple(info._replace(bytes=0) for info in outputs[i])


def bypass(view, names, index, i, inputs, consumers, preds_count, succs, outputs) -> None:
    """Rewire the data consumers of node ``i`` (an IdentityN) to its inputs' producers.

    The node keeps its place in the schedule (control successors still wait for it)
    but reads and holds nothing: its outputs weigh 0 bytes. The lists are
    :func:`~tflms.simulation.schedule.compile_view`'s, changed in place.

    Args:
        view: the analysis view the graph was compiled from.
        names, index: op names by index, and the inverse map.
        i: the node to bypass.
        inputs: ``(producer, output, input index)`` per op.
        consumers: ``{(producer, output): [consumer, ...]}``.
        preds_count, succs: dependency counts and successor lists.
        outputs: the :class:`~tflms.graph.view.TensorInfo` tuples per op.
    """
    source = {in_idx: (p, k) for p, k, in_idx in inputs[i]}
    preds_of: dict[int, set[int]] = {}
    for j in list(succs[i]):
        reads = [(pos, t) for pos, t in enumerate(inputs[j]) if t[0] == i]
        if not reads:
            continue
        for pos, (_, out_idx, in_idx) in reads:
            p, k = source[out_idx]
            inputs[j][pos] = (p, k, in_idx)
            consumers.setdefault((p, k), []).append(j)
            known = preds_of.setdefault(j, {index[q] for q in view.pred[names[j]]})
            if p not in known:
                known.add(p)
                succs[p].append(j)
                preds_count[j] += 1
        # j may succeed i only through an IdentityN bypassed before (no edge in the view)
        if not (view.get_edge_data(names[i], names[j]) or {}).get("control"):
            succs[i].remove(j)
            preds_count[j] -= 1
    for out_idx in range(len(outputs[i])):
        consumers.pop((i, out_idx), None)
    for p, k, _ in inputs[i]:
        consumers[(p, k)] = [c for c in consumers.get((p, k), ()) if c != i]
    inputs[i] = []
    outputs[i] = tuple(info._replace(bytes=0) for info in outputs[i])
