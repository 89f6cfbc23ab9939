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
* Grappler's arithmetic optimizer folds a link ``producer -> consumer`` of
  arithmetic ops (adds into an ``AddN`` tree, chains of one associative op
  reassociated to minimize broadcasts, a common factor hoisted out of an add of
  products, a negation folded into an add) only while the producer's output has
  that one consumer and the producer no control fanout (:func:`foldable_link`).
  A swap-out is one more consumer; a swap-in trigger is a control fanout. Either
  changes which rewrite it applies, hence the float rounding (a transformer's
  attention gradient: ``(c * sub) * softmax`` became ``(c * softmax) * sub``
  once a trigger hung on the inner product, and the weights moved by 3e-8).
  The same holds for chains of element-wise unary ops, which the arithmetic
  optimizer composes into one ``_UnaryOpsComposition`` on the CPU (a GELU
  gradient's ``Neg -> Exp``).
  A control fanout on any op of the chain counts, its root included (a
  LayerNormalization's ``x * g + b`` chain under mixed precision kept its two
  adds once a trigger hung on the last one): :func:`in_a_fold` names them.
* Grappler's constant folding turns every op computable from constants and
  static shapes alone into a constant (a causal attention mask, the ``1/N``
  of a mean's gradient tiled to the batch): such a tensor costs the step no
  work, and a swap or a clone of it (kept from folding) only adds some.
  :func:`folded_to_constants` names them. A ``Reshape``/``ExpandDims``/
  ``Squeeze`` of a variable read shares the variable's buffer
  (:func:`aliases_a_variable`): moving it frees nothing.
* Rules written one Grappler pass at a time miss the next pass, so the
  pipeline also runs Grappler itself on the step with and without each plan
  (:mod:`tflms.simulation.grappler.rewrites`) and *pins* every op it finds
  rewritten differently (:data:`PINNED`, :func:`pinned`): a pinned op counts
  as part of a fold (:func:`in_a_fold`), so no plan moves its output, triggers
  on it, reroutes it (to a swap-in or a clone), recomputes it or hangs an order
  edge on it; only a weight stream still gives it the stream's copy of a
  host weight in place of TensorFlow's own copy. An op only its
  recomputation changed (clones run unfused where the original was fused)
  is kept from recomputation alone (:data:`NOT_RECOMPUTED`). Each lever
  refuses pinned ops as it plans; :func:`tflms.plan.swap_plan.pins_broken`
  checks a whole plan against the pins, and the pipeline refuses a plan
  that breaks one, so a lever that forgets the rule fails loudly instead of
  changing the step's arithmetic.

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

from tflms.utils.devices import device_type as tf_device_type
from tflms.utils.memo import per_view

__all__ = [
    "aliases_a_variable",
    "compute_device_type",
    "foldable_link",
    "folded_to_constants",
    "folds_into_a_consumer",
    "in_a_fold",
    "pinned",
    "PINNED",
    "NOT_RECOMPUTED",
    "removed_at_run_time",
    "absent_from_the_run",
]

PINNED = "grappler_pinned"
"""The view's graph attribute naming the pinned ops (a frozenset; see the module docstring)."""

NOT_RECOMPUTED = "grappler_not_recomputed"
"""The view's graph attribute naming the ops pinned against recomputation only (a frozenset)."""

_ADDS = frozenset({"Add", "AddV2", "AddN"})
_ASSOCIATIVE = frozenset({"Add", "AddV2", "Mul"})
UNARY_COMPOSABLE = frozenset(
    {
        *("Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh"),
        *("Elu", "Exp", "Expm1", "Floor", "Inv", "Log", "Log1p", "Neg", "Reciprocal", "Relu"),
        *("Relu6", "Rint", "Round", "Rsqrt", "Selu", "Sigmoid", "Sin", "Sinh", "Sqrt"),
        *("Square", "Tan", "Tanh"),
    }
)
"""Element-wise unary ops the arithmetic optimizer composes into one
``_UnaryOpsComposition`` kernel, on the CPU only (the kernel has no GPU version)."""

_SHAPE_SOURCES = frozenset({"Const", "HostConst", "Shape", "ShapeN", "Size", "Rank"})
_NOT_FOLDABLE = frozenset(
    {
        *("Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "_Arg", "_Recv", "_HostRecv"),
        *("VarHandleOp", "ReadVariableOp", "ResourceGather", "VariableV2", "Variable"),
        *("IteratorGetNext", "Identity", "IdentityN", "Snapshot", "NoOp"),
    }
)
_VIEW_OPS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity", "Snapshot"})
_VARIABLE_SOURCES = frozenset({"VarHandleOp", "VariableV2", "Variable", "_Recv", "_HostRecv"})
_KEEPING_CONSUMERS = frozenset({"_Retval", "Merge", "RefMerge"})


def pinned(view: nx.DiGraph, name: str, *, recompute: bool = False) -> bool:
    """Whether op ``name`` is pinned: Grappler rewrites the step differently once a plan touches it.

    Args:
        view: the analysis view (its ``PINNED`` and ``NOT_RECOMPUTED`` graph
            attributes, empty by default).
        name: an op of it.
        recompute: ask about recomputing it (``NOT_RECOMPUTED`` counts too).
    """
    if name in view.graph.get(PINNED, ()):
        return True
    return recompute and name in view.graph.get(NOT_RECOMPUTED, ())


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


def absent_from_the_run(view: nx.DiGraph, name: str) -> bool:
    """Whether op ``name`` of ``view`` is not among the ops each step runs.

    Grappler deletes it (:func:`removed_at_run_time`), or it initializes a
    variable and tracing lifts it out of the step (the view's ``initializer``
    attribute, :mod:`tflms.graph.initializers`). A control edge from or to
    such an op orders nothing a step runs, and one from the step to an
    initializer makes the step untraceable.

    Args:
        view: the analysis view.
        name: an op of it.
    """
    return bool(view.nodes[name].get("initializer")) or removed_at_run_time(view, name)


def _data_sources(view: nx.DiGraph, name: str) -> list[str]:
    return [src for src, edge in view.pred[name].items() if edge.get("tensors")]


def foldable_link(view: nx.DiGraph, producer: str, consumer: str) -> bool:
    """Whether Grappler's arithmetic optimizer may fold the link ``producer -> consumer``.

    AddOpsRewrite (adds into adds), MinimizeBroadcasts (a chain of one
    associative op), HoistCommonFactor (an add of multiplications only),
    RemoveNegation (a negation into an add or subtraction) and
    UnaryOpsComposition (element-wise unary ops into one kernel). It folds a link only
    while the producer's output has this one consumer and no control fanout, and
    never inside the clones tflms marks to keep.

    Args:
        view: the analysis view.
        producer: the op whose output the consumer reads.
        consumer: the op reading it.

    Returns:
        True where an extra consumer or control edge on ``producer`` could change
        the rewrite.
    """
    p_type, c_type = view.nodes[producer]["type"], view.nodes[consumer]["type"]
    if p_type in _ADDS and c_type in _ADDS:
        return True
    if p_type in _ASSOCIATIVE and p_type == c_type:
        return True
    if p_type == "Mul" and c_type in _ADDS:
        return all(view.nodes[src]["type"] == "Mul" for src in _data_sources(view, consumer))
    if p_type in UNARY_COMPOSABLE and c_type in UNARY_COMPOSABLE:
        return compute_device_type(view, view.nodes[consumer]) == "CPU"
    return p_type == "Neg" and c_type in _ADDS | {"Sub"}


def folds_into_a_consumer(view: nx.DiGraph, name: str) -> bool:
    """Whether op ``name`` has a single data consumer it may be folded into (see above).

    Such an op must not gain a consumer or a control fanout: not a swapped
    tensor's producer, not a swap-in's trigger.
    """
    readers = [c for c, edge in view.succ[name].items() if edge.get("tensors")]
    return len(readers) == 1 and foldable_link(view, name, readers[0])


def in_a_fold(view: nx.DiGraph, name: str) -> bool:
    """Whether op ``name`` takes part in an arithmetic fold: it folds into its one
    consumer, or an input's producer folds into it (see :func:`foldable_link`).

    Grappler rewrites the whole chain at once; an input of any of its ops
    rerouted to a swap-in or a clone changes the rewrite. A pinned op
    (:func:`pinned`) counts as one.
    """
    if pinned(view, name) or folds_into_a_consumer(view, name):
        return True
    return any(
        folds_into_a_consumer(view, src) and foldable_link(view, src, name)
        for src in _data_sources(view, name)
    )


@per_view
def folded_to_constants(view: nx.DiGraph) -> frozenset[str]:
    """Ops whose outputs Grappler's constant folding computes before the step runs.

    An op folds when it is stateless, outside control flow, not a tflms op, and
    each data input is a constant, a shape op (``Shape``, ``Size``, ``Rank``:
    the step's shapes are static once traced) or another folding op. Identity
    ops are left out (Grappler keeps some of them). Computed once per view
    (:func:`~tflms.utils.memo.per_view`).

    Args:
        view: the analysis view.

    Returns:
        The names of those ops (constants and shape ops included).
    """
    folded: set[str] = set()
    for name in nx.topological_sort(view):
        node = view.nodes[name]
        kind = node["type"]
        if kind in _SHAPE_SOURCES:
            folded.add(name)
            continue
        if (
            kind in _NOT_FOLDABLE
            or node.get("stateful")
            or node.get("control_flow")
            or node.get("tflms")
        ):
            continue
        sources = _data_sources(view, name)
        if sources and all(src in folded for src in sources):
            folded.add(name)
    return frozenset(folded)


def aliases_a_variable(view: nx.DiGraph, name: str) -> bool:
    """Whether op ``name`` is a reshaping view of a variable read (no buffer of its own).

    Args:
        view: the analysis view.
        name: an op of it.

    Returns:
        True for a ``Reshape``/``ExpandDims``/``Squeeze``/``Identity`` chain whose
        first data input is a ``ReadVariableOp`` (or a variable).
    """
    seen = 0
    while view.nodes[name]["type"] in _VIEW_OPS and seen < 16:
        sources = [
            src
            for src, edge in view.pred[name].items()
            if any(i == 0 for _, i in edge.get("tensors", ()))
        ]
        if not sources:
            return False
        name = sources[0]
        if view.nodes[name]["type"] in ("ReadVariableOp", *_VARIABLE_SOURCES):
            return True
        seen += 1
    return False


def compute_device_type(view: nx.DiGraph, node: dict) -> str:
    """The device type (``"GPU"``, ``"CPU"``) ``node`` runs on; unassigned ops use the view's default.

    Args:
        view: The analysis view; its ``compute_device`` and
            ``default_device_type`` graph attributes supply the fallback.
        node: The node's attribute dict (``view.nodes[name]``), not its name.

    Returns:
        The upper-case device type; ``""`` when the device string names no
        type, and ``"GPU"`` when neither the node nor the view says.
    """
    device = node.get("device") or view.graph.get("compute_device") or ""
    if device:
        return (tf_device_type(device) or "").upper()
    return view.graph.get("default_device_type", "GPU")
