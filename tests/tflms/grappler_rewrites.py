"""Whether a plan changes what Grappler does to a step: the arithmetic TensorFlow runs.

TensorFlow hands every graph to Grappler before running it, and several of
Grappler's rewrites apply only to a tensor with a single consumer: the
arithmetic optimizer's stages (adds folded into an ``AddN`` tree, broadcasts
minimized, common factors hoisted, ...) and the remapper's fusions
(``MatMul + BiasAdd + Relu`` into one ``_FusedMatMul``, ...). A swap-out adds
a consumer and a recompute clone moves some, so a plan can stop a rewrite:
the step then runs other arithmetic (other float rounding, and on a GPU an
unfused intermediate that costs memory and time).

:func:`grappler_structure` runs Grappler's default pipeline offline on a
virtual device of the step's type (as :func:`grappler_optimize` does) and
reduces the result to what decides the arithmetic: for every op Grappler keeps
or creates, its type, its non-internal attributes, its data inputs and its
device type. tflms' own ops are read through (a swap-in stands for the tensor
it carries, a recompute clone for the op it re-runs), and constants are named
by their value (Grappler keeps one of several equal constants under whichever
name sorts first, which moves with the other names of the graph). Control
inputs are left out: they order ops, they compute nothing.
:func:`compare_rewrites` lists the ops whose structure differs with the plan.

What it cannot see: rewrites of a device kind this TensorFlow build lacks (a
CPU-only build applies no GPU-only fusion, so a GPU step's fusions are checked
only where ``tensorflow[and-cuda]`` is installed), and run-time choices inside
kernels (which buffer an ``AddN`` reuses: see
:data:`tflms.plan.candidates.ORDER_SENSITIVE`).

Example:
    >>> import tensorflow as tf
    >>> @tf.function
    ... def step(x):
    ...     y = x + 1.0
    ...     return tf.reduce_sum((y + x) + 2.0)
    >>> graph = step.get_concrete_function(tf.TensorSpec([8, 8])).graph
    >>> same = compare_rewrites(graph.as_graph_def(), graph.as_graph_def(), device="/device:CPU:0")
    >>> same.agree, same.differences
    (True, ())
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from tensorflow.core.framework import graph_pb2

from tflms.graph.view import SWAP_ATTR
from tflms.plan.entries import SCOPE
from tflms.simulation.grappler import VIRTUAL_GPU, grappler_optimize

__all__ = [
    "Difference",
    "RewriteCheck",
    "compare_rewrites",
    "grappler_structure",
    "structure_of",
]

_RECOMPUTE_SUFFIX = f"-{SCOPE}/recompute"
_COMMUTATIVE = frozenset(
    {"Add", "AddV2", "Mul", "Maximum", "Minimum", "LogicalAnd", "LogicalOr", "Equal", "NotEqual"}
)
"""Two-input ops whose result does not depend on the order of their inputs, bit for bit
(Grappler orders them by input name, and a constant's name can move)."""

Structure = dict[str, tuple]
"""Op name -> ``(type, attributes, data inputs, device type)`` after Grappler."""


@dataclass(frozen=True)
class Difference:
    """One op Grappler treats differently with the plan.

    Attributes:
        op: the op's name (in the original graph, or as Grappler made it).
        before: its structure without the plan (``None``: Grappler did not keep it).
        after: its structure with the plan (``None``: Grappler did not keep it).
    """

    op: str
    before: tuple | None
    after: tuple | None

    def mentions(self) -> set[str]:
        """The op and every op it reads, on either side: where the cause lies."""
        names = {self.op}
        for side in (self.before, self.after):
            if side is not None:
                names.update(name.split(":")[0] for name in side[2] if not name.startswith("="))
        return names

    def describe(self) -> str:
        """``op: Type(inputs) -> Type(inputs)`` on one line."""

        def show(side):
            if side is None:
                return "(not kept)"
            return f"{side[0]}({', '.join(side[2])})"

        return f"{self.op}: {show(self.before)} -> {show(self.after)}"


@dataclass(frozen=True)
class RewriteCheck:
    """What :func:`compare_rewrites` found.

    Attributes:
        differences: the ops whose structure differs, by name.
        ops: how many ops Grappler kept without the plan.
    """

    differences: tuple[Difference, ...]
    ops: int

    @property
    def agree(self) -> bool:
        """Grappler rewrites the step the same way with and without the plan."""
        return not self.differences

    def summary(self, limit: int = 5) -> str:
        """One line per difference (at most ``limit``)."""
        if self.agree:
            return f"Grappler's rewrites agree with and without the plan ({self.ops} ops)"
        lines = [d.describe() for d in self.differences[:limit]]
        more = len(self.differences) - limit
        if more > 0:
            lines.append(f"... and {more} more")
        return (
            f"Grappler rewrites {len(self.differences)} op(s) differently with the plan:\n  "
            + "\n  ".join(lines)
        )


def grappler_structure(
    graph_def: graph_pb2.GraphDef,
    *,
    fetches: Sequence[str] | None = None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
) -> Structure:
    """Grappler's optimized form of ``graph_def``, reduced to what decides the arithmetic.

    Args:
        graph_def: a step's graph, with or without tflms' ops.
        fetches: the nodes the step runs to (default: as :func:`grappler_optimize`).
        device: the compute device; its type (GPU or CPU) selects Grappler's
            device-specific rewrites.
        host_device: the host; ops placed there stay there.
        batch_size: replaces an unknown leading placeholder dimension (shapes
            decide some rewrites).

    Returns:
        ``{op name: (type, attributes, data inputs, device type)}`` for every
        op Grappler keeps that is neither a constant nor a tflms op.
    """
    optimized = grappler_optimize(
        graph_def, fetches=fetches, device=device, host_device=host_device, batch_size=batch_size
    )
    return structure_of(optimized)


def structure_of(optimized: graph_pb2.GraphDef) -> Structure:
    """What decides the arithmetic of an already optimized graph (see :func:`grappler_structure`).

    Args:
        optimized: a graph as Grappler left it (e.g. one TensorFlow dumped with
            ``TF_DUMP_GRAPH_PREFIX`` before partitioning it).

    Returns:
        As :func:`grappler_structure`.
    """
    nodes = {node.name: node for node in optimized.node}
    constants = {
        name: "=" + _digest(node.attr["dtype"].SerializeToString(), _value(node))
        for name, node in nodes.items()
        if node.op in ("Const", "HostConst")
    }

    def resolve(ref: str) -> str:
        name, _, port = ref.partition(":")
        seen = 0
        while name in nodes and _kind(nodes[name]) in ("out", "in") and seen < 8:
            name, _, port = nodes[name].input[0].partition(":")
            seen += 1
        if name in constants:
            return constants[name]
        name = name.rsplit(_RECOMPUTE_SUFFIX, 1)[0]
        return f"{name}:{port}" if port and port != "0" else name

    structure: Structure = {}
    for name, node in nodes.items():
        if name in constants or _kind(node):
            continue
        attrs = tuple(
            sorted(
                (key, _digest(value.SerializeToString()))
                for key, value in node.attr.items()
                if not key.startswith("_")
            )
        )
        inputs = tuple(resolve(ref) for ref in node.input if not ref.startswith("^"))
        if node.op in _COMMUTATIVE and len(inputs) == 2:
            inputs = tuple(sorted(inputs))  # exact in IEEE arithmetic: a + b == b + a
        device_type = node.device.rsplit("/", 1)[-1].split(":")[0].replace("device", "") or ""
        structure[name] = (node.op, attrs, inputs, device_type.upper())
    return structure


def compare_rewrites(
    original: graph_pb2.GraphDef,
    rewritten: graph_pb2.GraphDef,
    *,
    fetches: Sequence[str] | None = None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    batch_size: int | None = None,
    before: Structure | None = None,
) -> RewriteCheck:
    """Whether Grappler rewrites ``rewritten`` (``original`` + a plan) as it rewrites ``original``.

    Args:
        original: the step's graph without the plan.
        rewritten: the same graph with the plan applied (same names).
        fetches, device, host_device, batch_size: as for :func:`grappler_structure`.
        before: ``grappler_structure(original, ...)`` when already computed
            (the original is then not optimized again).

    Returns:
        A :class:`RewriteCheck`; :attr:`RewriteCheck.agree` is the verdict.
    """

    def structure(graph_def):
        return grappler_structure(
            graph_def,
            fetches=fetches,
            device=device,
            host_device=host_device,
            batch_size=batch_size,
        )

    if before is None:
        before = structure(original)
    after = structure(rewritten)
    differences = tuple(
        Difference(name, before.get(name), after.get(name))
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    )
    return RewriteCheck(differences=differences, ops=len(before))


def _kind(node) -> str:
    """``out``/``in``/``recompute`` (swap-out, swap-in, clone) for a tflms op, else ``""``."""
    if SWAP_ATTR not in node.attr:
        return ""
    return node.attr[SWAP_ATTR].s.decode()


def _value(node) -> bytes:
    return node.attr["value"].SerializeToString()


def _digest(*parts: bytes) -> str:
    h = hashlib.sha1()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:12]
