"""Scheduling a graph as TensorFlow runs it: nodes Grappler removes are bypassed.

:func:`tflms.graph.grappler_rules.removed_at_run_time` says which nodes
Grappler's dependency optimizer deletes before a step runs (an ``IdentityN``
of several inputs: Keras passes all gradients through one, in front of the
optimizer updates). :func:`bypass` rewires a compiled graph around such a
node, so its consumers wait only for the inputs they read.
"""

from __future__ import annotations

__all__ = ["bypass"]


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
