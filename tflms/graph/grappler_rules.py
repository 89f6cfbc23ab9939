"""What Grappler changes in a graph before TensorFlow runs it, as far as tflms must know.

TensorFlow hands every graph to Grappler before running it. tflms rewrites the
graph as written, but simulates and plans for the graph as run, so the rules it
relies on live here.

* Grappler's dependency optimizer deletes ``Identity`` and ``IdentityN`` nodes
  it can prove safe (``DependencyOptimizer::SafeToRemoveIdentity``): not a
  fetch, not reading a variable or a ``_Recv``, and for several inputs no
  consumer that is a function return value or a ``Merge``. Keras' optimizers
  pass every gradient through one ``IdentityN`` in front of the updates; once
  it is gone each update runs as soon as its own gradient exists. tflms leaves
  single-input ``Identity`` ops alone (they cost no memory and their removal
  moves no op); it bypasses multi-input ``IdentityN`` nodes
  (:func:`removed_at_run_time`), which do.

Example:
    >>> import networkx as nx
    >>> v = nx.DiGraph()
    >>> for name, kind in (("g1", "MatMul"), ("g2", "MatMul"), ("ids", "IdentityN")):
    ...     v.add_node(name, type=kind, tflms=None, placement="compute")
    >>> v.add_edge("g1", "ids", tensors=[(0, 0)], control=False)
    >>> v.add_edge("g2", "ids", tensors=[(0, 1)], control=False)
    >>> removed_at_run_time(v, "ids"), removed_at_run_time(v, "g1")
    (True, False)
"""

from __future__ import annotations

import networkx as nx

__all__ = ["removed_at_run_time"]

_VARIABLE_SOURCES = frozenset({"VarHandleOp", "VariableV2", "Variable", "_Recv", "_HostRecv"})
_KEEPING_CONSUMERS = frozenset({"_Retval", "Merge", "RefMerge"})


def removed_at_run_time(view: nx.DiGraph, name: str) -> bool:
    """Whether Grappler deletes op ``name`` of ``view`` before the graph runs (see above).

    Args:
        view: the analysis view.
        name: an op of it.

    Returns:
        True for an ``IdentityN`` of several data inputs, none from a variable or a
        ``_Recv``, that tflms did not insert, with no control edge in or out, no
        ``Merge``/``_Retval`` consumer and its producers and consumers placed where it
        is (tflms keeps the node whenever Grappler might: a stricter rule than
        Grappler's own edge count).
    """
    node = view.nodes[name]
    if node["type"] != "IdentityN" or node.get("tflms"):
        return False
    preds, succs = view.pred[name], view.succ[name]
    if any(edge.get("control") for edge in (*preds.values(), *succs.values())):
        return False  # Grappler counts forwarded control edges and may keep the node
    inputs = sum(len(edge.get("tensors", ())) for edge in preds.values())
    placement = node.get("placement")
    return (
        inputs > 1
        and all(view.nodes[src]["type"] not in _VARIABLE_SOURCES for src in preds)
        and all(view.nodes[c]["type"] not in _KEEPING_CONSUMERS for c in succs)
        and all(view.nodes[n].get("placement") == placement for n in (*preds, *succs))
    )
