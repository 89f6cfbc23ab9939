"""Analysis: the memory a functional ``While`` loop keeps, read from its body.

A TF2 loop (``While``/``StatelessWhile``) is one op in the outer graph, and its
loop variables look like scalars there: every ``TensorList`` is a ``variant``
handle of no size. Yet the lists are where a recurrent network's memory is.
Differentiating a loop makes TensorFlow add one accumulator list per tensor
the backward pass needs from each iteration (an LSTM keeps its gates, states
and inputs); the forward loop pushes one element per iteration, the gradient
loop pops them in reverse. For a 2-layer LSTM at 256 steps those lists are
most of the step's memory.

:func:`loop_list_bytes` sizes them from the graph alone:

* **Trip count.** A bound is proven from the loop's condition: a ``Less(i, n)``
  of two loop variables where ``i`` starts at 0 and the body returns ``i + 1``
  (TensorFlow's ``maximum_iterations`` counter, and the gradient loop's
  counter against the forward loop's final count). ``n`` must be known before
  the loop runs: a constant, a shape, a reduction of those
  (:func:`static_value`), or the final counter of an earlier loop. Without
  such a bound the lists stay unsized and the loop is reported
  (``unbounded``).
* **What a list holds at the end.** Its element size comes from the op that
  made it (``EmptyTensorList``/``TensorListReserve`` element shape and dtype,
  ``TensorListFromTensor``'s input), the number of elements from what the body
  does to it: ``TensorListPushBack`` adds one per iteration,
  ``TensorListSetItem`` fills reserved slots, ``TensorListPopBack`` empties it,
  a list the body only reads passes through (its storage is the input's).
  Pushing a variable read or a loop-invariant tensor stores a reference to one
  buffer, not a copy: such accumulators cost nothing.

The loop's output lists get these sizes in the view, so the simulator holds
them from the forward loop to the gradient loop that consumes them, as
TensorFlow does. What is not modelled: elements freed one by one as the
gradient loop pops them (the simulator frees a list when its last consumer
ends: an upper bound), the body's per-iteration temporaries, and loops nested
inside a body.

Example:
    >>> import tensorflow as tf
    >>> w = tf.Variable(tf.eye(64))
    >>> @tf.function
    ... def step(x):
    ...     with tf.GradientTape() as tape:
    ...         _, y = tf.while_loop(lambda i, h: i < 100, lambda i, h: (i + 1, tf.tanh(h @ w)),
    ...                              (0, x), maximum_iterations=100)
    ...         loss = tf.reduce_sum(y)
    ...     return tape.gradient(loss, w)
    >>> graph = step.get_concrete_function(tf.TensorSpec([8, 64])).graph
    >>> forward = next(f for f in loop_list_bytes(graph, batch=8).values() if f.list_bytes)
    >>> forward.trips, sorted(forward.list_bytes.values())  # 100 tanh outputs of 8 x 64 float32
    (100, [204800])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework.function_pb2 import FunctionDefLibrary

__all__ = ["LoopLists", "list_op_bytes", "loop_list_bytes", "static_value", "WHILE_TYPES"]

WHILE_TYPES = frozenset({"While", "StatelessWhile"})

_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "Max": np.max,
    "Min": np.min,
    "Sum": np.sum,
    "Prod": np.prod,
}
_BINARY = {"Maximum": np.maximum, "Minimum": np.minimum, "AddV2": np.add, "Sub": np.subtract}
# Ops whose output is a reference to an existing buffer, not a new one.
_ALIASING = frozenset({"ReadVariableOp", "Identity", "Snapshot", "StopGradient"})


@dataclass(frozen=True)
class LoopLists:
    """What one ``While`` op's lists hold when it ends.

    Attributes:
        op: the loop's name.
        trips: proven bound on its iterations, ``None`` when none is known.
        bound: how the bound was found, or why there is none.
        list_bytes: output index -> bytes of new storage its list holds at
            the end of the loop (only lists that hold any).
        elements: output index -> (elements, bytes per element) for every
            list output whose size is known: what a later loop starts from.
        unbounded: output indices of lists that grow each iteration but have
            no trip bound or no element size: their bytes are unknown.
        scratch_bytes: memory the loop holds while it runs and frees at its
            end: iterations in flight at once (TensorFlow runs up to
            ``parallel_iterations`` of them) each with a new term of every
            running sum the body keeps (a weight gradient summed over time).
    """

    op: str
    trips: int | None
    bound: str
    list_bytes: dict[int, int] = field(default_factory=dict)
    elements: dict[int, tuple[int, int]] = field(default_factory=dict)
    unbounded: tuple[int, ...] = ()
    scratch_bytes: int = 0


def static_value(tensor: tf.Tensor, depth: int = 8) -> np.ndarray | None:
    """The value of ``tensor`` if it follows from constants and static shapes, else ``None``.

    ``tf.get_static_value`` plus what it leaves out and loop bounds use: the
    reductions ``Max``/``Min``/``Sum``/``Prod`` and the element-wise
    ``Maximum``/``Minimum``/``AddV2``/``Sub`` of static values (Keras bounds
    an RNN's loop by ``reduce_max`` of the time steps).

    Args:
        tensor: a graph tensor.
        depth: how many such ops deep to look.

    Returns:
        A numpy array, or ``None``.
    """
    value = tf.get_static_value(tensor)
    if value is not None or depth <= 0:
        return value
    op = tensor.op
    if op.type in _REDUCTIONS and len(op.inputs) == 2:
        data, axes = (static_value(t, depth - 1) for t in op.inputs)
        if data is None or axes is None:
            return None
        axis = tuple(int(a) for a in np.atleast_1d(axes))
        keep = bool(op.get_attr("keep_dims"))
        return np.asarray(_REDUCTIONS[op.type](data, axis=axis, keepdims=keep))
    if op.type in _BINARY and len(op.inputs) == 2:
        left, right = (static_value(t, depth - 1) for t in op.inputs)
        if left is None or right is None:
            return None
        return np.asarray(_BINARY[op.type](left, right))
    return None


def loop_list_bytes(
    graph: tf.Graph, *, batch: int | None, library: FunctionDefLibrary | None = None
) -> dict[str, LoopLists]:
    """Size the lists of every ``While`` op of ``graph`` (see the module docstring).

    Args:
        graph: the graph the view is built from (only read).
        batch: the batch size for open first dimensions of element shapes.
        library: ``graph``'s function library, if the caller has it already
            (serializing a large graph again costs time).

    Returns:
        Loop name -> :class:`LoopLists`, for every ``While``/``StatelessWhile``.
    """
    loops = [op for op in graph.get_operations() if op.type in WHILE_TYPES]
    if not loops:
        return {}
    library = library if library is not None else graph.as_graph_def().library
    functions = {f.signature.name: f for f in library.function}
    found: dict[str, LoopLists] = {}
    for op in loops:  # creation order: a forward loop comes before its gradient loop
        found[op.name] = _loop(op, functions, batch, found)
    return found


def list_op_bytes(op: tf.Operation, batch: int | None, loops: Mapping[str, LoopLists]) -> int:
    """New bytes a list op outside loops allocates (0 for any other op).

    ``TensorListFromTensor`` copies its input into aligned elements;
    ``ZerosLike`` of a list of known elements makes a zero tensor for each
    (a loop gradient starts from it).

    Args:
        op: an op of the outer graph.
        batch: the batch size for open first dimensions.
        loops: what :func:`loop_list_bytes` found for the graph's loops.
    """
    if op.type == "TensorListFromTensor":
        return _tensor_bytes(op.inputs[0], batch) or 0
    if op.type == "ZerosLike" and op.inputs[0].dtype == tf.variant:
        start = _list_start(op.inputs[0], batch, dict(loops))
        if start is not None and start[1] is not None:
            return start[0] * start[1]
    return 0


# --------------------------------------------------------------------------- internals


class _Body:
    """The parts of a loop's body ``FunctionDef`` the sizing needs."""

    def __init__(self, fdef):
        self.args = [a.name for a in fdef.signature.input_arg]
        self.index = {name: i for i, name in enumerate(self.args)}
        self.nodes = {n.name: n for n in fdef.node_def}
        self.ret = [fdef.ret[a.name] for a in fdef.signature.output_arg]

    def source(self, ref: str) -> str:
        """The node or argument name ``ref`` (``node:out:i`` or ``arg``) reads, past Identity."""
        for _ in range(64):
            name = ref.split(":", 1)[0]
            node = self.nodes.get(name)
            if node is None or node.op not in ("Identity", "Snapshot") or not node.input:
                return name
            ref = node.input[0]
        return ref.split(":", 1)[0]

    def arg_of(self, ref: str) -> int | None:
        return self.index.get(self.source(ref))

    def invariant(self, k: int) -> bool:
        return k < len(self.ret) and self.arg_of(self.ret[k]) == k

    def fresh(self, ref: str, held: frozenset = frozenset()) -> bool:
        """Whether the tensor ``ref`` is new storage each iteration (not an alias).

        A loop variable's value is what the body returned for it the iteration
        before: storage of its own, unless that tensor is in ``held`` (kept by
        another list already, e.g. an RNN's output sequence holding each ``h``).
        """
        name = self.source(ref)
        if name in self.index:
            k = self.index[name]
            return not self.invariant(k) and self.source(self.ret[k]) not in held
        node = self.nodes.get(name)
        return node is None or node.op not in _ALIASING

    def stored(self, lists: Mapping[int, int], trips: int | None) -> frozenset:
        """Names of body nodes whose output every iteration is kept in some list.

        ``lists`` maps list arguments to their elements at the start: a
        ``TensorListSetItem`` keeps every iteration's value only in a list with
        a slot for each.
        """
        held = set()
        for node in self.nodes.values():
            if node.op not in ("TensorListPushBack", "TensorListSetItem") or not node.input:
                continue
            k = self.arg_of(node.input[0])
            if node.op == "TensorListSetItem" and (
                trips is None or k is None or lists.get(k, 0) < trips
            ):
                continue
            value = node.input[1] if node.op == "TensorListPushBack" else node.input[2]
            if self.source(value) not in self.index:
                held.add(self.source(value))
        return frozenset(held)

    def sums(self, k: int) -> bool:
        """Whether the body returns ``arg k + a new term`` for loop variable ``k``."""
        if k >= len(self.ret) or self.counter_step(k) is not None:
            return False
        node = self.nodes.get(self.source(self.ret[k]))
        if node is None or node.op not in ("AddN", "AddV2", "Add"):
            return False
        return k in [self.arg_of(i) for i in node.input if not i.startswith("^")]

    def counter_step(self, k: int) -> int | None:
        """The constant the body adds to loop variable ``k``, if it does just that."""
        if k >= len(self.ret):
            return None
        node = self.nodes.get(self.source(self.ret[k]))
        if node is None or node.op not in ("AddV2", "Add") or len(node.input) < 2:
            return None
        refs = [i for i in node.input[:2] if not i.startswith("^")]
        args = [self.arg_of(r) for r in refs]
        if args.count(k) != 1:
            return None
        const = self.nodes.get(self.source(refs[1 - args.index(k)]))
        if const is None or const.op != "Const":
            return None
        value = tf.make_ndarray(const.attr["value"].tensor)
        return int(value) if value.size == 1 else None

    def list_uses(self, k: int, held: frozenset = frozenset()) -> set[str]:
        """How the body treats list argument ``k``: ``push``, ``push-alias``, ``set``, ``pop``."""
        uses = set()
        for node in self.nodes.values():
            if node.op == "AddN" and self._accumulates(node, k, held):
                uses.add("set")  # a gradient list: each iteration adds one fresh element
                continue
            if node.op not in ("TensorListPushBack", "TensorListSetItem", "TensorListPopBack"):
                continue
            if not node.input or self.arg_of(node.input[0]) != k:
                continue
            if node.op == "TensorListPopBack":
                uses.add("pop")
            else:
                value = node.input[1] if node.op == "TensorListPushBack" else node.input[2]
                kind = "push" if node.op == "TensorListPushBack" else "set"
                uses.add(kind if self.fresh(value, held) else f"{kind}-alias")
        return uses

    def _accumulates(self, node, k: int, held: frozenset) -> bool:
        """``AddN(list k, list set in this iteration)``: how a list's gradient builds up."""
        refs = [self.source(i) for i in node.input if not i.startswith("^")]
        if self.args[k] not in refs if k < len(self.args) else True:
            return False
        for ref in refs:
            setter = self.nodes.get(ref)
            if setter is not None and setter.op == "TensorListSetItem" and len(setter.input) > 2:
                if self.fresh(setter.input[2], held):
                    return True
        return False


def _loop(op: tf.Operation, library: Mapping, batch, found: dict[str, LoopLists]) -> LoopLists:
    body_name = op.get_attr("body").name
    cond_name = op.get_attr("cond").name
    if body_name not in library or cond_name not in library:
        return LoopLists(op.name, None, "its body or condition is not in the graph's library")
    body, cond = _Body(library[body_name]), _Body(library[cond_name])
    trips, bound = _trip_bound(op, body, cond, found)
    starts = {
        k: _list_start(t, batch, found)
        for k, t in enumerate(op.inputs)
        if t.dtype == tf.variant and k < len(op.outputs)
    }
    held = body.stored({k: s[0] for k, s in starts.items() if s is not None}, trips)
    lists: dict[int, int] = {}
    elements: dict[int, tuple[int, int]] = {}
    unbounded = []
    for k, start in starts.items():
        uses = body.list_uses(k, held)
        if start is None:
            if "push" in uses or "set" in uses:
                unbounded.append(k)
            continue
        count, element = start
        if "pop" in uses:
            count = max(0, count - trips) if trips is not None else 0
            if element is not None:
                elements[k] = (count, element)
            continue
        if "push" in uses or "push-alias" in uses:
            if trips is None or element is None:
                if "push" in uses:
                    unbounded.append(k)
                continue
            count += trips
            if "push" in uses:
                lists[k] = trips * element
        elif "set" in uses and element is not None:
            lists[k] = min(count, trips) * element if trips is not None else count * element
        if element is not None:  # also a list the body only reads: it passes through
            elements[k] = (count, element)
    scratch = 0
    if trips:
        in_flight = min(trips, max(1, op.get_attr("parallel_iterations")))
        summed = sum(
            _tensor_bytes(t, batch) or 0
            for k, t in enumerate(op.inputs)
            if t.dtype not in (tf.variant, tf.resource) and body.sums(k)
        )
        scratch = in_flight * summed
    return LoopLists(op.name, trips, bound, lists, elements, tuple(unbounded), scratch)


def _trip_bound(op, body: _Body, cond: _Body, found) -> tuple[int | None, str]:
    """A bound proven from ``Less(i, n)`` in the condition with ``i`` counting 0, 1, 2..."""
    bounds = []
    for node in cond.nodes.values():
        if node.op != "Less" or len(node.input) < 2:
            continue
        i, n = cond.arg_of(node.input[0]), cond.arg_of(node.input[1])
        if i is None or n is None or body.counter_step(i) != 1:
            continue
        start = static_value(op.inputs[i])
        limit = _known_int(op.inputs[n], found)
        if start is not None and start.size == 1 and limit is not None:
            bounds.append((max(0, limit - int(start)), f"{node.name}: counter < {limit}"))
    if not bounds:
        return None, (
            "no bound found: the condition has no Less(counter, n) with n known before the loop "
            "(pass maximum_iterations= to tf.while_loop)"
        )
    return min(bounds)


def _known_int(tensor: tf.Tensor, found: dict[str, LoopLists]) -> int | None:
    value = static_value(tensor)
    if value is not None and value.size == 1:
        return int(value)
    producer = tensor.op
    facts = found.get(producer.name)
    if facts is not None and facts.trips is not None and tensor.value_index == 0:
        return facts.trips  # an earlier loop's final counter (TensorFlow puts it first)
    return None


def _list_start(t: tf.Tensor, batch, found) -> tuple[int, int | None] | None:
    """(elements, bytes per element or None) of the list ``t`` when the loop starts."""
    op = t.op
    if op.type in ("EmptyTensorList", "TensorListReserve"):
        element = _element_bytes(op.inputs[0], op.get_attr("element_dtype"), batch)
        if op.type == "EmptyTensorList":
            return 0, element
        count = static_value(op.inputs[1])
        return (int(count), element) if count is not None and count.size == 1 else None
    if op.type == "TensorListFromTensor":
        shape = op.inputs[0].shape
        total = _tensor_bytes(op.inputs[0], batch)
        if shape.rank and shape[0] is not None and shape[0] > 0 and total is not None:
            return shape[0], total // shape[0]
        return None
    if op.type == "ZerosLike" and op.inputs[0].dtype == tf.variant:
        return _list_start(op.inputs[0], batch, found)
    facts = found.get(op.name)
    if facts is not None:
        return facts.elements.get(t.value_index)
    return None


def _element_bytes(shape_tensor: tf.Tensor, dtype: tf.DType, batch) -> int | None:
    shape = static_value(shape_tensor)
    if shape is None or shape.ndim != 1 or dtype in (tf.variant, tf.resource, tf.string):
        return None
    dims = [int(d) for d in shape]
    if dims and dims[0] < 0 and batch is not None:
        dims[0] = batch
    if any(d < 0 for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64)) * tf.as_dtype(dtype).size


def _tensor_bytes(t: tf.Tensor, batch) -> int | None:
    shape = t.shape
    if shape.rank is None or t.dtype in (tf.variant, tf.resource, tf.string):
        return None
    dims = list(shape)
    if dims and dims[0] is None and batch is not None:
        dims[0] = batch
    if any(d is None for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64)) * t.dtype.size
