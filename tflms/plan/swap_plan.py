"""SwapPlan: what a rewrite does to one graph - swaps, recomputations, and an order.

A plan is a frozen value: the planner (:func:`tflms.make_plan`) makes it from
the analysis view, the appliers (:mod:`tflms.apply`) execute it on a live
graph, a view or a protobuf, :func:`tflms.validate` checks a graph against it,
and it round-trips through JSON so it can be saved, inspected and applied
later (``tflms rewrite --plan``). Its levers, applied in this order:

* :attr:`SwapPlan.recomputes` - cheap ops cloned to re-run before their far
  consumers (:class:`~tflms.plan.entries.Recompute`);
* :attr:`SwapPlan.swaps` - tensors copied to the host and back
  (:class:`~tflms.plan.entries.Swap`); their consumers may be clones;
* :attr:`SwapPlan.order` - control edges that fix the order of ops whose
  interleaving made the peak (and :attr:`SwapPlan.serialization`, TFLMS v2's
  level chains).

Example:
    >>> swap = Swap(
    ...     tensor="conv1/Relu:0", producer="conv1/Relu", index=0, bytes=4 << 20,
    ...     dtype="float32", producer_level=3, device="",
    ...     swap_ins=(SwapIn(consumers=(("grad/ReluGrad", 1),), trigger="grad/Conv2DBackpropInput",
    ...                      trigger_level=40, consumer_level=44),),
    ... )
    >>> plan = SwapPlan(swaps=(swap,), graph_name="train_step", order=(("a", "b"),))
    >>> swap.swapout_name, swap.swapin_name(0), swap.swapin_name(1)
    ('lms/swapout_conv1/Relu_0', 'conv1/Relu-lms/swapin', 'conv1/Relu-lms/swapin_1')
    >>> SwapPlan.from_json(plan.to_json()) == plan
    True

Naming (:mod:`tflms.plan.entries`) keeps every rerouted input sorting where
the original input sorted: Grappler canonicalizes commutative ops by sorting
their inputs by name and reassociates chains of Mul/Add/AddN in that order; a
swap-in named ``lms/...`` would move within those sorts, change the float
summation order and make training differ from the original in the last bits.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.plan.entries import Recompute, Swap, SwapIn
from tflms.utils.units import format_bytes

if TYPE_CHECKING:  # networkx stays out of the CLI's start-up (tests/tflms/test_cli_startup.py)
    import networkx as nx

__all__ = ["SwapIn", "Swap", "Recompute", "SwapPlan", "PLAN_FORMAT_VERSION", "pins_broken"]

PLAN_FORMAT_VERSION = 2
"""2 added recomputations and order edges; version 1 plans (swaps only) still load."""


@dataclass(frozen=True)
class SwapPlan:
    """A complete memory plan for one graph.

    Attributes:
        swaps: the swaps, largest tensor first.
        graph_name: name of the graph it was made for.
        serialization: chains of ops to run one after the other (each chain
            is linked by control edges in order).
        config: the options it was made with.
        skipped: ``(tensor, reason)`` for large tensors that were considered
            and not swapped.
        notes: facts the user should know (control flow left alone, unknown
            dims, batch size source, ...).
        batch_size: batch size used for sizes (``None``: per-sample sizes).
        recomputes: groups of cheap ops re-run before their far consumers.
        order: ``(before, after)`` control edges that fix an order with a
            lower peak.
    """

    swaps: tuple[Swap, ...] = ()
    graph_name: str = ""
    serialization: tuple[tuple[str, ...], ...] = ()
    config: LMSConfig = field(default_factory=LMSConfig, compare=False)
    skipped: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    batch_size: int | None = None
    recomputes: tuple[Recompute, ...] = ()
    order: tuple[tuple[str, str], ...] = ()

    # ------------------------------------------------------------------ queries
    @property
    def bytes_swapped(self) -> int:
        """Sum of the sizes of the swapped tensors (one way)."""
        return sum(s.bytes for s in self.swaps)

    @property
    def bytes_recomputed(self) -> int:
        """Sum of the sizes of the tensors recomputed instead of kept."""
        return sum(r.bytes for r in self.recomputes)

    @property
    def num_swap_ins(self) -> int:
        """Number of swap-in ops (one per consumer group of each swap)."""
        return sum(len(s.swap_ins) for s in self.swaps)

    @property
    def empty(self) -> bool:
        """Whether the plan changes nothing."""
        return not (self.swaps or self.recomputes or self.order or self.serialization)

    def touched(self) -> dict[str, set[str]]:
        """The existing ops the plan changes or hangs edges on, each with the levers that do.

        ``"swap"``: swapped producers, rerouted consumers, swap-ins' triggers
        and the ops they wait for, and the ops that wait for a swap-out;
        ``"stream"``: a streamed host tensor's producer and the readers
        rerouted from TensorFlow's own copy of it to the stream's (their
        triggers and waits count as ``"swap"``); ``"recompute"``: recomputed
        ops and the far consumers rerouted to their clones; ``"trigger"``: the
        ops a recomputation waits for; ``"order"``: both ends of order edges
        and the ops of serialized chains. A pinned op
        (:func:`tflms.graph.grappler_rules.pinned`) may be touched only as
        ``"stream"``: :func:`pins_broken` checks a plan against the pins.
        """
        roles: dict[str, set[str]] = {}

        def add(role: str, *ops: str | None) -> None:
            for op in ops:
                if op:
                    roles.setdefault(op, set()).add(role)

        for swap in self.swaps:
            lever = "stream" if swap.streamed else "swap"
            add(lever, swap.producer)
            add("swap", *swap.wait_for_swapout)
            for swap_in in swap.swap_ins:
                add(lever, *(consumer for consumer, _ in swap_in.consumers))
                add("swap", *swap_in.control_inputs, swap_in.trigger)
        for group in self.recomputes:
            add("recompute", *group.ops, *(consumer for consumer, *_ in group.consumers))
            add("trigger", group.trigger, *group.control_inputs)
        for before, after in self.order:
            add("order", before, after)
        for chain in self.serialization:
            add("order", *chain)
        return roles

    def waited_for(self) -> frozenset[str]:
        """The existing ops the plan makes other ops wait for.

        Swap-ins' and recomputations' triggers and control inputs, the ops
        that wait for a swap-out, and the ops of serialized chains: an edge
        another lever adds to one of them (an update wait,
        :func:`tflms.plan.updates.update_waits`) could hold back a re-run or a
        swap-in that a waiting reader needs.
        """
        found = {r.trigger for r in self.recomputes}
        found |= {op for r in self.recomputes for op in r.control_inputs}
        for swap in self.swaps:
            found |= {si.trigger for si in swap.swap_ins} | set(swap.wait_for_swapout)
            found |= {op for si in swap.swap_ins for op in si.control_inputs}
        found |= {op for chain in self.serialization for op in chain}
        return frozenset(op for op in found if op is not None)

    def op_names(self) -> set[str]:
        """Names of every op the plan inserts."""
        names = set()
        for s in self.swaps:
            names.add(s.swapout_name)
            names.update(s.swapin_name(k) for k in range(len(s.swap_ins)))
        for r in self.recomputes:
            names.update(r.inserted)
        return names

    def summary(self, *, per_scope: bool = True, top: int = 10) -> str:
        """A readable report: the levers pulled, totals, per-layer bytes, the largest tensors.

        Args:
            per_scope: add the swapped bytes per layer.
            top: how many layers and tensors to list.

        Returns:
            The report, one fact per line.
        """
        head = (
            f"tflms plan for {self.graph_name or 'graph'}: {len(self.swaps)} tensors swapped "
            f"({format_bytes(self.bytes_swapped)} each way), {self.num_swap_ins} swap-ins"
        )
        if self.recomputes:
            head += (
                f", {sum(len(r.tensors) for r in self.recomputes)} tensors recomputed "
                f"({format_bytes(self.bytes_recomputed)}, "
                f"{sum(len(r.ops) for r in self.recomputes)} ops re-run)"
            )
        if self.order:
            head += f", {len(self.order)} order edges"
        lines = [
            head + (f", batch size {self.batch_size}" if self.batch_size else ", per-sample sizes")
        ]
        streams = [s for s in self.swaps if s.streamed]
        if streams:
            lines.append(
                f"  {len(streams)} of them are weights streamed from the host "
                f"({format_bytes(sum(s.bytes for s in streams))}, "
                f"{sum(len(s.swap_ins) for s in streams)} copies in per step)"
            )
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
        lines.extend(self._levers(top))
        reasons = Counter(reason for _, reason in self.skipped)
        if reasons:
            lines.append("  large tensors kept (not swapped or recomputed):")
            for reason, n in reasons.most_common():
                lines.append(f"    {n:5d}  {reason}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _levers(self, top: int) -> list[str]:
        """The largest tensors and the lever each got, with why."""
        rows = [
            (
                s.bytes,
                s.tensor,
                "stream" if s.streamed else "swap",
                f"L{s.producer_level} -> "
                + ", ".join(f"L{si.consumer_level}" for si in s.swap_ins),
            )
            for s in self.swaps
        ]
        for r in self.recomputes:
            per = r.bytes // max(1, len(r.tensors))
            rows.extend((per, t, "recompute", r.reason) for t in r.tensors)
        if not rows:
            return []
        rows.sort(key=lambda row: (-row[0], row[1]))
        lines = ["  largest tensors and their lever:"]
        for nbytes, tensor, lever, why in rows[:top]:
            lines.append(f"    {format_bytes(nbytes):>12}  {lever:9s} {tensor}  ({why})")
        return lines

    # --------------------------------------------------------------- JSON I/O
    def to_dict(self) -> dict:
        """The plan as plain JSON-ready values, with ``format_version``."""
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["format_version"] = PLAN_FORMAT_VERSION
        return data

    def to_json(self, **kwargs) -> str:
        """The plan as JSON (``json.dumps`` keyword arguments pass through).

        Args:
            **kwargs: Passed to ``json.dumps`` (``indent=2``, ``sort_keys=True``...).

        Returns:
            The JSON text of :meth:`to_dict`.
        """
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> SwapPlan:
        """Inverse of :meth:`to_dict`; reads format versions 1 and 2.

        Args:
            data: A dict as made by :meth:`to_dict` (or read from its JSON).

        Returns:
            The plan; format version 1 plans get no recomputations and no order
            edges.

        Raises:
            ConfigError: another format version, or a malformed plan.
        """
        version = data.get("format_version") if isinstance(data, dict) else None
        if version not in (1, PLAN_FORMAT_VERSION):
            raise ConfigError(
                f"Unsupported swap plan format_version={version!r}; this tflms reads versions 1 "
                f"and {PLAN_FORMAT_VERSION}. Re-create the plan with this tflms version."
            )
        try:
            return cls(
                swaps=tuple(_swap(s) for s in data["swaps"]),
                graph_name=data["graph_name"],
                serialization=tuple(tuple(chain) for chain in data["serialization"]),
                config=LMSConfig.from_dict(dict(data["config"])),
                skipped=tuple((t, r) for t, r in data["skipped"]),
                notes=tuple(data["notes"]),
                batch_size=data["batch_size"],
                recomputes=tuple(_recompute(r) for r in data.get("recomputes", ())),
                order=tuple((a, b) for a, b in data.get("order", ())),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"Malformed swap plan JSON: {err!r}.") from err

    @classmethod
    def from_json(cls, text: str) -> SwapPlan:
        """Inverse of :meth:`to_json`.

        Args:
            text: JSON text as written by :meth:`to_json`.

        Returns:
            The plan (see :meth:`from_dict`).

        Raises:
            ConfigError: the text is not JSON or not a plan this tflms reads.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"A swap plan must be JSON: {err}.") from err
        return cls.from_dict(data)


def _swap(s: dict) -> Swap:
    swap_ins = tuple(
        SwapIn(
            **{
                **si,
                "consumers": tuple((c, int(i)) for c, i in si["consumers"]),
                "control_inputs": tuple(si["control_inputs"]),
            }
        )
        for si in s["swap_ins"]
    )
    return Swap(**{**s, "swap_ins": swap_ins, "wait_for_swapout": tuple(s["wait_for_swapout"])})


def _recompute(r: dict) -> Recompute:
    return Recompute(
        **{
            **r,
            "ops": tuple(r["ops"]),
            "consumers": tuple((c, int(i), op, int(k)) for c, i, op, k in r["consumers"]),
            "control_inputs": tuple(r.get("control_inputs", ())),
        }
    )


def _layer_of(op_name: str) -> str:
    """The layer-ish scope of an op name (``model/conv1/Relu`` -> ``model/conv1``)."""
    parts = op_name.split("/")
    return "/".join(parts[:-1]) if len(parts) > 1 else op_name


def pins_broken(view: nx.DiGraph, plan: SwapPlan) -> dict[str, set[str]]:
    """The pinned ops ``plan`` touches, each with the levers that touch it.

    A pinned op (:data:`~tflms.graph.grappler_rules.PINNED`) may be touched
    by no lever but a stream's reroute: a reader of a weight kept on the host
    reads TensorFlow's own copy of it without the plan and the stream's copy
    with it, the same tensor to Grappler (its check reads through swap ops),
    and nothing is hung on the reader (a stream's triggers and waits are held
    to the pins). An op kept from recomputation
    (:data:`~tflms.graph.grappler_rules.NOT_RECOMPUTED`) may not be
    recomputed (it may still read a clone). Empty for a plan that keeps
    every pin.

    Args:
        view: the analysis view the plan was made on (its pins).
        plan: the plan (:meth:`SwapPlan.touched`).

    Returns:
        ``{op: levers}``, ``"recompute"`` standing for a re-run of the op itself.
    """
    from tflms.graph.grappler_rules import NOT_RECOMPUTED, PINNED  # imports networkx

    full = view.graph.get(PINNED, frozenset())
    kept = view.graph.get(NOT_RECOMPUTED, frozenset())
    if not (full or kept):
        return {}
    broken = {
        op: roles - {"stream"}
        for op, roles in plan.touched().items()
        if op in full and roles - {"stream"}
    }
    for group in plan.recomputes:
        for op in group.ops:
            if op in kept:
                broken.setdefault(op, set()).add("recompute")
    return broken
