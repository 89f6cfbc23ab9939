"""Split plan: which ops are too large for any swap plan, cut into how many row chunks.

The token-level loss of a language model, ``SparseSoftmaxCrossEntropyWithLogits``
over the whole vocabulary, reads its logits ``[rows, vocab]`` and writes a
backprop tensor of the same size that the backward pass reads first; for GPT-2
small at sequence 1024 each is 196 MiB per sample. TensorFlow's kernel writes
the backprop into the logits' buffer when nothing else reads the logits
(``forward_input_or_allocate_output``; the simulator does the same,
:data:`tflms.simulation.memory.FORWARDED_OUTPUT`): the op then holds one
logits-sized tensor and a split frees nothing there. Where the logits outlive
the loss (a metric such as ``sparse_categorical_accuracy`` reads them after
it), both are live at the op and a swap cannot help (nothing runs between the
op and its reader). The split rewrite (:mod:`tflms.apply.split`) runs the op
on row chunks instead, sends each chunk's backprop to the host as it is made,
concatenates them there and brings the whole back when the backward pass
needs it: at the op, the logits plus a chunk or two are on the device, not
twice the logits. ``LMSConfig.max_op_bytes`` asks for it; the simulator
judges whether it pays.

Chunk boundaries sit on multiples of :data:`ALIGN` rows. Every row of the op is
computed on its own, yet TensorFlow's CPU kernel gives bit-identical rows only
when a chunk starts on the same vector alignment as in the whole tensor (a
chunk starting on row 50 of ``[100, 30522]`` logits differs in the last bit;
rows 8, 16, 48, 504, 512, 1024 ... do not), so the split keeps the training
bitwise identical. The weight gradient of the logits (``h^T @ dlogits``) sums
over every row, so the rows of the gradient are brought back whole, and the
logits ``MatMul`` is kept whole too: Eigen's blocking makes a row chunk of a
matrix product differ in the last bit.

Example:
    >>> import tflms
    >>> from tflms import zoo
    >>> view = tflms.analyze(zoo.gpt2(vocab=64, seq=16, dim=8, heads=2, layers=1), batch_size=4)
    >>> [(s.rows, s.chunks) for s in plan_splits(view, 1024)]
    [(64, 4)]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import networkx as nx

from tflms.errors import ConfigError
from tflms.plan.triggers import trigger_filter

__all__ = [
    "ALIGN",
    "SPLIT_TYPES",
    "RANDOM_TYPES",
    "Split",
    "Defer",
    "plan_splits",
    "plan_deferrals",
]

ALIGN = 16
"""Chunk boundaries are multiples of this many rows (64 bytes of float32 for any vocabulary)."""

SPLIT_TYPES = frozenset({"SparseSoftmaxCrossEntropyWithLogits"})
"""Op types the split rewrite knows how to cut by rows."""


@dataclass(frozen=True)
class Split:
    """One op to run in row chunks.

    Attributes:
        op: the op's name.
        op_type: its type (one of :data:`SPLIT_TYPES`).
        rows: rows of its input at the analysed batch size.
        chunks: number of chunks (boundaries on multiples of :data:`ALIGN`
            rows of the batch the step runs with).
        bytes: size of its largest output at the analysed batch size.
        triggers: ops whose completion starts the copy back of the whole
            backprop tensor (the other inputs of its readers).
    """

    op: str
    op_type: str
    rows: int
    chunks: int
    bytes: int
    triggers: tuple[str, ...]

    def boundaries(self, rows: int | None = None) -> list[int]:
        """Row boundaries of the chunks for ``rows`` rows (default: the analysed ones).

        Args:
            rows: rows of the input at run time.

        Returns:
            ``chunks + 1`` boundaries from 0 to ``rows``; the inner ones are
            multiples of :data:`ALIGN` (the rewrite computes the same ones in
            the graph from the run-time row count).
        """
        rows = self.rows if rows is None else rows
        block = rows // (self.chunks * ALIGN)
        return [0, *(block * i * ALIGN for i in range(1, self.chunks)), rows]

    def to_dict(self) -> dict:
        """The split as plain JSON types."""
        out = asdict(self)
        out["triggers"] = list(self.triggers)
        return out


def plan_splits(view: nx.DiGraph, max_op_bytes: int | None) -> tuple[Split, ...]:
    """The ops of :data:`SPLIT_TYPES` whose backprop output exceeds ``max_op_bytes``.

    Args:
        view: the analysis view (sizes at its batch size).
        max_op_bytes: the largest chunk wanted; ``None`` splits nothing.

    Returns:
        One :class:`Split` per op to cut, by op name; empty when nothing is
        larger, or an op has too few rows to make two aligned chunks.

    Raises:
        ConfigError: ``max_op_bytes`` is not a positive number of bytes.
    """
    if max_op_bytes is None:
        return ()
    if isinstance(max_op_bytes, bool) or not isinstance(max_op_bytes, int) or max_op_bytes < 1:
        raise ConfigError(
            f"max_op_bytes must be a positive number of bytes. Received {max_op_bytes!r}; "
            "pass e.g. 256 * 2**20, or None to split nothing."
        )
    splits = []
    for name in sorted(view.nodes):
        node = view.nodes[name]
        if node["type"] not in SPLIT_TYPES or node.get("tflms") or len(node["outputs"]) != 2:
            continue
        backprop = node["outputs"][1]
        if backprop.bytes <= max_op_bytes or backprop.rank != 2:
            continue
        loss = node["outputs"][0]
        rows = loss.bytes // _itemsize(loss.dtype)
        chunks = min(math.ceil(backprop.bytes / max_op_bytes), rows // ALIGN)
        if chunks < 2:
            continue
        splits.append(
            Split(name, node["type"], rows, chunks, backprop.bytes, _triggers(view, name))
        )
    return tuple(splits)


RANDOM_TYPES = frozenset(
    {
        "StatelessRandomUniformV2",
        "StatelessRandomNormalV2",
        "StatelessTruncatedNormalV2",
        "StatelessRandomUniform",
        "StatelessRandomNormal",
    }
)
"""Random generators whose output depends on shapes and seeds only, not on the data."""


@dataclass(frozen=True)
class Defer:
    """A large random tensor to draw when it is needed, not when the step starts.

    A dropout mask depends on shapes and seeds only, so TensorFlow's ready
    queue draws every layer's mask as the step starts: at GPT-2 small's
    sequence 1024 that is 48 MiB of floats per sample and layer, all on the
    device at once. A control edge from the op that makes the data the mask
    is applied to (``trigger``) defers the draw to its layer; the values are
    the same (stateless generators).

    Attributes:
        op: the generator.
        trigger: the op it waits for.
        bytes: the size of its output at the analysed batch size.
    """

    op: str
    trigger: str
    bytes: int

    def to_dict(self) -> dict:
        """The deferral as plain JSON types."""
        return asdict(self)


def plan_deferrals(view: nx.DiGraph, max_op_bytes: int | None) -> tuple[Defer, ...]:
    """The generators of :data:`RANDOM_TYPES` larger than ``max_op_bytes`` to defer.

    Each is followed along its readers (the scaling ``Mul``/``Add``, the
    comparison with the rate) to the first op that also reads data; the
    producer of that data becomes the trigger, where a control edge out of it
    is safe (:func:`tflms.plan.triggers.trigger_filter`: no Grappler fold is
    changed).

    Args:
        view: the analysis view.
        max_op_bytes: as for :func:`plan_splits`; ``None`` defers nothing.

    Returns:
        One :class:`Defer` per generator with a safe trigger, by op name.
    """
    if max_op_bytes is None:
        return ()
    ok = trigger_filter(view)
    out = []
    for name in sorted(view.nodes):
        node = view.nodes[name]
        if node["type"] not in RANDOM_TYPES or node["outputs"][0].bytes <= max_op_bytes:
            continue
        chain, frontier, trigger = {name}, [name], None
        while frontier and trigger is None:
            op = frontier.pop(0)
            for reader in sorted(view.succ[op]):
                if not view.succ[op][reader].get("tensors"):
                    continue
                others = [
                    src
                    for src, edge in view.pred[reader].items()
                    if src not in chain and edge.get("tensors") and _reads_data(view, src)
                ]
                if others:
                    trigger = max(others, key=lambda src: view.nodes[src]["level"])
                    break
                chain.add(reader)
                frontier.append(reader)
        if trigger is not None and ok(trigger) and not nx.has_path(view, name, trigger):
            out.append(Defer(name, trigger, node["outputs"][0].bytes))
    return tuple(out)


_DATA_SOURCES = frozenset(
    {"Placeholder", "PlaceholderWithDefault", "_Arg", "ReadVariableOp", "VarHandleOp"}
)


def _reads_data(view: nx.DiGraph, name: str) -> bool:
    """Whether ``name`` depends on the step's inputs or variables (not on constants alone)."""
    seen, todo = {name}, [name]
    while todo:
        op = todo.pop()
        if view.nodes[op]["type"] in _DATA_SOURCES:
            return True
        for src, edge in view.pred[op].items():
            if edge.get("tensors") and src not in seen:
                seen.add(src)
                todo.append(src)
    return False


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype, 4)


def _triggers(view: nx.DiGraph, op: str) -> tuple[str, ...]:
    """The producers of the other data inputs of the readers of ``op``'s backprop."""
    readers = [
        dst
        for dst, edge in view.succ[op].items()
        if any(o == 1 for o, _ in edge.get("tensors", ()))
    ]
    found = set()
    for reader in readers:
        for src, edge in view.pred[reader].items():
            if src != op and edge.get("tensors"):
                found.add(src)
    return tuple(sorted(found))
