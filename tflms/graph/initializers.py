"""Analysis: the ops of a traced step that initialize variables, which no plan may touch.

A variable created while ``tf.function`` traces (Keras builds an optimizer's
slots, a ``LossScaleOptimizer``'s counters, in the first trace of a step when
no distribution strategy built them before) leaves its initializer in the
function graph: the initial value's ops (``<variable>/Initializer/...``), a
``VarIsInitializedOp`` on the variable's handle and an ``If`` that assigns
the initial value on the first call only. When tracing ends, TensorFlow
*lifts* the initial value's ops out of the function, into the eager context
that runs them once; lifting refuses any op that depends, through a data or
a control edge, on the function's inputs (``UnliftableError``). A control
edge into those ops from a step op (a serialization chain, a memory-aware
order edge, a swap's wait) makes the step untraceable, and an edge from them
orders nothing that runs each step.

:func:`initializer_ops` finds them by that structure, not by name: the
data inputs of an ``If``/``StatelessIf`` whose predicate is a
``VarIsInitializedOp``, other than the variable's handle, and everything
they depend on, with the ``VarIsInitializedOp`` itself. The view marks
them (node attribute ``initializer``) and the planner leaves them alone.

Example:
    >>> import tensorflow as tf
    >>> from tflms.graph.view import build_view
    >>> slots, views = [], []
    >>> def step(x):
    ...     if not slots:  # the first trace creates the variable, as Keras builds a slot
    ...         slots.append(tf.Variable(tf.zeros([4], name="zeros"), name="slot"))
    ...     views.append(build_view(tf.compat.v1.get_default_graph(), batch_size=1))
    ...     return x * slots[0]
    >>> _ = tf.function(step, autograph=False).get_concrete_function(tf.ones([4]))
    >>> sorted(initializer_ops(views[0]))
    ['slot/VarIsInitializedOp', 'zeros']
"""

from __future__ import annotations

import networkx as nx

__all__ = ["initializer_ops"]

_CONDS = frozenset({"If", "StatelessIf"})
_HANDLES = frozenset({"Placeholder", "_Arg", "VarHandleOp"})


def initializer_ops(view: nx.DiGraph) -> frozenset[str]:
    """The ops of ``view`` that compute variables' initial values inside a traced function.

    Args:
        view: An analysis view (edges carry ``tensors``).

    Returns:
        The initial values' ops and their ancestors (the variables' handles,
        function inputs, excluded) and the ``VarIsInitializedOp`` that guards
        each; empty for a graph that creates no variable while it is traced.
    """
    found: set[str] = set()
    for name, node in view.nodes(data=True):
        if node["type"] != "VarIsInitializedOp":
            continue
        for cond in view.succ[name]:
            if view.nodes[cond]["type"] not in _CONDS:
                continue
            found.add(name)
            for source, edge in view.pred[cond].items():
                if source == name or not edge.get("tensors"):
                    continue
                if view.nodes[source]["type"] in _HANDLES:
                    continue
                found.add(source)
                found.update(
                    a for a in nx.ancestors(view, source) if view.nodes[a]["type"] not in _HANDLES
                )
    return frozenset(found)
