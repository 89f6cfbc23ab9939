"""SwapPlan: which tensors to swap, for which consumers, started by which trigger.

A plan is a frozen value: the planner (:mod:`tflms.plan.planner`) makes it from
the analysis view, the appliers (:mod:`tflms.apply.graph_editor`,
:mod:`tflms.apply.view_editor`) execute it, :func:`tflms.validate` checks a graph
against it, and it round-trips through JSON so it can be saved, inspected
and applied later (``tflms rewrite --plan``).

Example:
    >>> swap = Swap(
    ...     tensor="conv1/Relu:0", producer="conv1/Relu", index=0, bytes=4 << 20,
    ...     dtype="float32", producer_level=3, device="",
    ...     swap_ins=(SwapIn(consumers=(("grad/ReluGrad", 1),), trigger="grad/Conv2DBackpropInput",
    ...                      trigger_level=40, consumer_level=44),),
    ... )
    >>> plan = SwapPlan(swaps=(swap,), graph_name="train_step")
    >>> swap.swapout_name, swap.swapin_name(0), swap.swapin_name(1)
    ('lms/swapout_conv1/Relu_0', 'conv1/Relu-lms/swapin', 'conv1/Relu-lms/swapin_1')
    >>> SwapPlan.from_json(plan.to_json()) == plan
    True

Naming: swap-outs are called ``lms/swapout_<tensor>``. Swap-ins are called
``<producer>-lms/swapin`` (``-lms/swapin_out<k>`` for output ``k > 0``, plus
``_<n>`` for the n-th consumer group), so that a rerouted input *sorts where
the original input sorted*. Grappler canonicalizes commutative ops by sorting
their inputs by name and reassociates chains of Mul/Add/AddN in that order;
a swap-in named ``lms/...`` would move within those sorts, change the float
summation order and make training differ from the original in the last bits.
With this naming the rewrite is bitwise neutral.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

from tflms.errors import ConfigError
from tflms.units import format_bytes

__all__ = ["SwapIn", "Swap", "SwapPlan", "PLAN_FORMAT_VERSION"]

PLAN_FORMAT_VERSION = 1
SCOPE = "lms"


def _sanitize(tensor_name: str) -> str:
    return tensor_name.replace(":", "_")


@dataclass(frozen=True)
class SwapIn:
    """One swap-in of a swapped-out tensor, shared by a group of consumers.

    Attributes:
        consumers: ``(op name, input index)`` pairs rerouted to read the
            swapped-in copy instead of the original tensor.
        trigger: op whose completion starts the swap-in (a control edge
            ``trigger -> swap-in``); ``None`` when there is no suitable op.
        control_inputs: further ops the swap-in waits for (sync mode 2 and
            the synchronous fallback: the consumer's other inputs).
        trigger_level: level of ``trigger`` (``None`` without trigger).
        consumer_level: level of the earliest consumer.
        fallback: why no trigger was found (``None`` when one was).
    """

    consumers: tuple[tuple[str, int], ...]
    trigger: str | None = None
    control_inputs: tuple[str, ...] = ()
    trigger_level: int | None = None
    consumer_level: int = 0
    fallback: str | None = None


@dataclass(frozen=True)
class Swap:
    """One tensor swapped out to the host and back in for its far consumers.

    Attributes:
        tensor: ``"op:index"`` name of the swapped tensor.
        producer, index: the op producing it and the output index.
        bytes: estimated size (see :class:`tflms.graph.view.TensorInfo`).
        dtype: dtype name.
        producer_level: the producer's level.
        device: the producer's device string (``""`` if unassigned).
        swap_ins: one entry per consumer group.
        wait_for_swapout: ops given a control edge from the swap-out
            (sync modes 1 and 3: the producer's other consumers).
    """

    tensor: str
    producer: str
    index: int
    bytes: int
    dtype: str
    producer_level: int
    device: str
    swap_ins: tuple[SwapIn, ...]
    wait_for_swapout: tuple[str, ...] = ()

    @property
    def swapout_name(self) -> str:
        """Name of the swap-out op, ``lms/swapout_<tensor>``."""
        return f"{SCOPE}/swapout_{_sanitize(self.tensor)}"

    def swapin_name(self, k: int) -> str:
        """Name of the swap-in of consumer group ``k`` (see the module docstring)."""
        base = f"{self.producer}-{SCOPE}/swapin" + (f"_out{self.index}" if self.index else "")
        return f"{base}_{k}" if k else base

    @property
    def consumers(self) -> tuple[tuple[str, int], ...]:
        return tuple(c for s in self.swap_ins for c in s.consumers)


@dataclass(frozen=True)
class SwapPlan:
    """A complete swap plan for one graph.

    Attributes:
        swaps: the swaps, largest tensor first.
        graph_name: name of the graph it was made for.
        serialization: chains of ops to run one after the other (each chain
            is linked by control edges in order).
        config: the options it was made with (``LMSConfig.to_dict()``).
        skipped: ``(tensor, reason)`` for large tensors that were considered
            and not swapped.
        notes: facts the user should know (control flow left alone, unknown
            dims, batch size source, ...).
        batch_size: batch size used for sizes (``None``: per-sample sizes).
    """

    swaps: tuple[Swap, ...] = ()
    graph_name: str = ""
    serialization: tuple[tuple[str, ...], ...] = ()
    config: dict = field(default_factory=dict, compare=False)
    skipped: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    batch_size: int | None = None

    # ------------------------------------------------------------------ queries
    @property
    def bytes_swapped(self) -> int:
        """Sum of the sizes of the swapped tensors (one way)."""
        return sum(s.bytes for s in self.swaps)

    @property
    def num_swap_ins(self) -> int:
        return sum(len(s.swap_ins) for s in self.swaps)

    def op_names(self) -> set[str]:
        """Names of every op the plan inserts."""
        names = set()
        for s in self.swaps:
            names.add(s.swapout_name)
            names.update(s.swapin_name(k) for k in range(len(s.swap_ins)))
        return names

    def summary(self, *, per_scope: bool = True, top: int = 10) -> str:
        """A readable report: totals, per-layer bytes, the largest swaps."""
        lines = [
            f"tflms plan for {self.graph_name or 'graph'}: {len(self.swaps)} tensors swapped "
            f"({format_bytes(self.bytes_swapped)} each way), {self.num_swap_ins} swap-ins"
            + (f", batch size {self.batch_size}" if self.batch_size else ", per-sample sizes"),
        ]
        fallbacks = sum(1 for s in self.swaps for si in s.swap_ins if si.fallback)
        if fallbacks:
            lines.append(f"  {fallbacks} swap-ins are synchronous (no trigger found)")
        if self.serialization:
            lines.append(f"  {len(self.serialization)} levels serialized")
        if per_scope and self.swaps:
            by_scope: Counter = Counter()
            for s in self.swaps:
                by_scope[_layer_of(s.producer)] += s.bytes
            lines.append("  bytes swapped per layer:")
            for scope, nbytes in by_scope.most_common(top):
                lines.append(f"    {format_bytes(nbytes):>12}  {scope}")
            if len(by_scope) > top:
                lines.append(f"    ... {len(by_scope) - top} more layers")
        if self.swaps:
            lines.append("  largest swaps:")
            for s in self.swaps[:top]:
                far = ", ".join(f"L{si.consumer_level}" for si in s.swap_ins)
                lines.append(
                    f"    {format_bytes(s.bytes):>12}  {s.tensor}  (L{s.producer_level} -> {far})"
                )
        reasons = Counter(reason for _, reason in self.skipped)
        if reasons:
            lines.append("  large tensors not swapped:")
            for reason, n in reasons.most_common():
                lines.append(f"    {n:5d}  {reason}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    # --------------------------------------------------------------- JSON I/O
    def to_dict(self) -> dict:
        data = asdict(self)
        data["format_version"] = PLAN_FORMAT_VERSION
        return data

    def to_json(self, **kwargs) -> str:
        """The plan as JSON (``json.dumps`` keyword arguments pass through)."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> SwapPlan:
        version = data.get("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise ConfigError(
                f"Unsupported swap plan format_version={version!r}; this tflms reads "
                f"version {PLAN_FORMAT_VERSION}. Re-create the plan with this tflms version."
            )
        try:
            swaps = tuple(
                Swap(
                    **{
                        **s,
                        "swap_ins": tuple(
                            SwapIn(
                                **{
                                    **si,
                                    "consumers": tuple((c, int(i)) for c, i in si["consumers"]),
                                    "control_inputs": tuple(si["control_inputs"]),
                                }
                            )
                            for si in s["swap_ins"]
                        ),
                        "wait_for_swapout": tuple(s["wait_for_swapout"]),
                    }
                )
                for s in data["swaps"]
            )
            return cls(
                swaps=swaps,
                graph_name=data["graph_name"],
                serialization=tuple(tuple(chain) for chain in data["serialization"]),
                config=dict(data["config"]),
                skipped=tuple((t, r) for t, r in data["skipped"]),
                notes=tuple(data["notes"]),
                batch_size=data["batch_size"],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"Malformed swap plan JSON: {err!r}.") from err

    @classmethod
    def from_json(cls, text: str) -> SwapPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"A swap plan must be JSON: {err}.") from err
        return cls.from_dict(data)


def _layer_of(op_name: str) -> str:
    """The layer-ish scope of an op name (``model/conv1/Relu`` -> ``model/conv1``)."""
    parts = op_name.split("/")
    return "/".join(parts[:-1]) if len(parts) > 1 else op_name
