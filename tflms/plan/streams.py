"""Streams: weights kept on the host, brought to the device only while they are used.

With ``LMSConfig(offload_weights=True)`` and a model whose weights live on
``host_device`` (:func:`tflms.keras.weights_on_host`), every read of such a
weight runs on the host (TensorFlow places an op that takes a variable's
handle on the variable's device) and its value crosses to the device ops
that use it. Left alone, TensorFlow copies it once, as the step starts, and
the copy lives on the device until the last use, in the backward pass: the
device would hold every weight all step, as if nothing were offloaded.

:func:`plan_streams` turns each such crossing into a swap whose every
consumer group is a swap-in (:class:`~tflms.plan.entries.Swap` with
``streamed=True``): the group of forward uses gets a copy started
``swapin_ahead`` levels ahead of them (a trigger, as for swap-ins), the
backward uses another, and each copy dies after its group. The swap-out of
a streamed tensor is an ``Identity`` on the host, where the tensor already
is: it copies nothing. The applier, the simulator and the validation treat
streams as the swaps they are.

Under ``mixed_float16`` a layer reads its float32 weight through a cast to
float16: :func:`plan_host_casts` runs that cast on the host, so the float16
copy streams (half the bytes). A weight's first device reader is also often
a view or a cast of it (an
``EinsumDense`` reshapes its kernel, ``mixed_float16`` casts it): that
reader's output then lives on the device from the forward to the backward
use. :func:`plan_stream_clones` re-runs such a chain of cheap ops before the
far readers (a :class:`~tflms.plan.entries.Recompute`, as recomputation
does), reading a copy of its own, so the weight is streamed for them too.

A weight a device op in control flow or in a called function reads, or
whose consumer Grappler removes before the step runs, is not streamed (the
plan's ``skipped`` says so): TensorFlow's one copy stays, and the simulator
counts it from the step's start (:func:`tflms.simulation.memory.trace_memory`).

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph(name="mlp")
    >>> def op(name, placement="compute", size=4096, **kw):
    ...     v.add_node(name, type=kw.get("type", "MatMul"), device="", placement=placement,
    ...                outputs=(TensorInfo(f"{name}:0", 0, "float32", (32, 32), size),),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    >>> op("w", "host", type="ReadVariableOp")
    >>> for i in range(14):
    ...     op(f"f{i}", type="Relu")
    ...     if i:
    ...         v.add_edge(f"f{i-1}", f"f{i}", tensors=[(0, 0)], control=False)
    >>> v.add_edge("w", "f1", tensors=[(0, 1)], control=False)   # the forward use
    >>> v.add_edge("w", "f12", tensors=[(0, 1)], control=False)  # the backward use
    >>> assign_levels(v)
    >>> config = LMSConfig(swapin_ahead=2, swapout_threshold=5, offload_weights=True)
    >>> [[(s.consumers, s.trigger) for s in t.swap_ins] for t in plan_streams(v, config)[0]]
    [[((('f1', 1),), None), ((('f12', 1),), 'f10')]]
"""

from __future__ import annotations

from collections.abc import Set

import networkx as nx

from tflms.config import LMSConfig
from tflms.cost.target import Target
from tflms.graph.grappler_rules import pinned, removed_at_run_time
from tflms.graph.view import CLONE_KINDS
from tflms.graph.view import consumers as tensor_consumers
from tflms.plan.candidates import order_sensitive
from tflms.plan.entries import Recompute, Swap
from tflms.plan.recompute import make_group
from tflms.plan.recompute import veto as recompute_veto
from tflms.plan.rerun_cost import cheap
from tflms.plan.triggers import group_consumers, swap_for_groups, trigger_filter

__all__ = [
    "plan_streams",
    "plan_stream_clones",
    "plan_host_casts",
    "STREAMED_DTYPES",
    "NARROW_DTYPES",
    "VIEW_OPS",
]

STREAMED_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
"""Dtypes of the host tensors streamed: weights (integer tensors are left to TensorFlow)."""


VIEW_OPS = frozenset(
    {"Cast", "Reshape", "Identity", "ExpandDims", "Squeeze", "Transpose", "Snapshot"}
)
"""Cheap readers of a weight whose outputs :func:`plan_stream_clones` re-runs from a copy."""


def plan_stream_clones(
    view: nx.DiGraph, config: LMSConfig, target: Target, taken: Set[str] = frozenset()
) -> tuple[Recompute, ...]:
    """Re-run the views and casts of host tensors before their far readers.

    Args:
        view: The analysis view.
        config: ``swapout_threshold`` (which readers are far) and
            ``swapin_ahead`` (the clones' trigger).
        target: Times the clones.
        taken: Ops another recomputation already clones.

    Returns:
        One :class:`~tflms.plan.entries.Recompute` per chain of
        :data:`VIEW_OPS` that reads a host tensor on the device and has
        readers further than ``swapout_threshold`` levels.
    """
    levels = nx.get_node_attributes(view, "level")
    trigger_ok = trigger_filter(view)
    memo: dict[str, tuple[bool, float]] = {}
    groups = []
    for producer, info in _host_tensors(view, STREAMED_DTYPES):
        for reader, _ in tensor_consumers(view, producer, info.index):
            chain = _view_chain(view, reader, taken)
            if not chain:
                continue
            for op in chain:
                memo[op] = cheap(view, op, target.device)
            if not all(memo[op][0] for op in chain):
                continue
            entry = make_group(view, chain, levels, config, trigger_ok, memo)
            if entry is not None:
                groups.append(entry)
                taken = taken | set(chain)
    return tuple(sorted(groups, key=lambda g: (-g.bytes, g.ops)))


def _view_chain(view: nx.DiGraph, op: str, taken) -> list[str]:
    """``op`` and the view ops each reading the previous one alone, on the device."""
    chain: list[str] = []
    while True:
        node = view.nodes[op]
        if (
            node["type"] not in VIEW_OPS
            or node["placement"] != "compute"
            or node["control_flow"]
            or node["tflms"]
            or op in taken
            or op in chain
            or pinned(view, op, recompute=True)  # Grappler's check: its re-run changes the step
        ):
            return chain
        chain.append(op)
        readers = {c for c, _ in tensor_consumers(view, op, 0)}
        if len(readers) != 1:
            return chain
        op = readers.pop()


NARROW_DTYPES = frozenset({"float16", "bfloat16"})
"""Compute dtypes of mixed precision: a weight's cast to one runs on the host."""


def _inserted(node: dict) -> bool:
    """A tflms op other than a clone (a weight's cast moved to the host is one)."""
    return bool(node["tflms"]) and node["tflms"] not in CLONE_KINDS


def _host_tensors(view: nx.DiGraph, dtypes):
    """``(producer, tensor)`` for each output of ``dtypes`` of an op on the host.

    Ops tflms inserted (clones aside) and ops in control flow are left out;
    so are TF1 reference tensors.
    """
    for producer, node in view.nodes(data=True):
        if node["placement"] != "host" or _inserted(node) or node["control_flow"]:
            continue
        for info in node["outputs"]:
            if info.dtype in dtypes and not info.is_ref:
                yield producer, info


def plan_host_casts(view: nx.DiGraph, config: LMSConfig) -> tuple[Recompute, ...]:
    """Run each device cast of a host weight to a narrower float on the host instead.

    Under ``mixed_float16`` a layer reads its float32 weight through a cast;
    cast on the host, the float16 copy is what streams: half the bytes over
    the link and on the device. The cast is cloned there (a
    :class:`~tflms.plan.entries.Recompute` with ``device=host_device``), every
    reader of the original reads the clone, and the original, read by
    nothing, is pruned by TensorFlow. Float rounding to a narrower type is
    the same on any IEEE device, so training is unchanged.

    Args:
        view: The analysis view.
        config: ``host_device`` is where the casts go.

    Returns:
        One single-op recomputation per cast, on the host, without trigger.
    """
    levels = nx.get_node_attributes(view, "level")
    casts = []
    for producer, info in _host_tensors(view, frozenset({"float32"})):
        for cast, _ in tensor_consumers(view, producer, info.index):
            cnode = view.nodes[cast]
            if (
                cnode["type"] != "Cast"
                or cnode["placement"] != "compute"
                or cnode["control_flow"]
                or cnode["tflms"]
                or cnode["outputs"][0].dtype not in NARROW_DTYPES
                or pinned(view, cast, recompute=True)  # Grappler's check: keep it where it is
            ):
                continue
            readers = sorted(tensor_consumers(view, cast, 0), key=lambda ci: (levels[ci[0]], ci))
            if not readers or recompute_veto(view, [cast], {(cast, 0): readers}):
                continue
            casts.append(
                Recompute(
                    ops=(cast,),
                    consumers=tuple((c, i, cast, 0) for c, i in readers),
                    consumer_level=levels[readers[0][0]],
                    bytes=cnode["outputs"][0].bytes,
                    reason="cast on the host: its narrower copy is what streams",
                    device=config.host_device,
                )
            )
    return tuple(casts)


def plan_streams(view: nx.DiGraph, config: LMSConfig) -> tuple[list[Swap], list[tuple[str, str]]]:
    """The streams of ``view``'s host tensors that device ops read, and those left alone.

    Args:
        view: The analysis view (:func:`tflms.build_view`); a weight's reads
            are placed ``"host"`` when the weight lives on the host.
        config: ``swapin_ahead``, ``swapin_groupby`` and ``sync_mode`` shape
            the swap-ins, as for swaps; readers more than
            ``swapout_threshold`` levels apart never share a copy (the
            forward and the backward use of a layer's weight).

    Returns:
        ``(streams, skipped)``: a :class:`~tflms.plan.entries.Swap` with
        ``streamed=True`` per streamed tensor, largest first, and
        ``(tensor, reason)`` for the host tensors device ops read that stay
        with TensorFlow's one copy.
    """
    levels = nx.get_node_attributes(view, "level")
    trigger_ok = trigger_filter(view)
    streams: list[Swap] = []
    skipped: list[tuple[str, str]] = []
    for producer, info in _host_tensors(view, STREAMED_DTYPES):
        uses = tensor_consumers(view, producer, info.index)
        on_device = sorted(
            ((c, i) for c, i in uses if view.nodes[c]["placement"] != "host"),
            key=lambda ci: (levels[ci[0]], ci[0], ci[1]),
        )
        if not on_device:
            continue
        reason = _veto(view, on_device)
        if reason is None:
            stream, reason = _plan_stream(
                view, producer, info, on_device, levels, config, trigger_ok
            )
            if stream is not None:
                streams.append(stream)
                continue
        skipped.append((info.name, reason))
    streams.sort(key=lambda s: (-s.bytes, s.tensor))
    return streams, skipped


def _veto(view: nx.DiGraph, on_device) -> str | None:
    """Why the device reads of a host tensor cannot be rerouted to swap-ins, or ``None``."""
    for c, _ in on_device:
        cnode = view.nodes[c]
        if cnode["placement"] != "compute" or cnode["control_flow"] or cnode["functions"]:
            return (
                f"a device reader ({cnode['type']}) is in control flow, a called function or on "
                "another device: TensorFlow's one copy stays for the whole step"
            )
        if cnode["tflms"] and cnode["tflms"] not in CLONE_KINDS:
            return f"a reader ({cnode['type']}) is a tflms op"
        if removed_at_run_time(view, c):
            return f"a reader ({cnode['type']}) is removed by Grappler before the step runs"
        if order_sensitive(view, c):
            return "an AddN of 3+ inputs reads it (its float sum order depends on buffer reuse)"
    return None


def _plan_stream(view, producer, info, on_device, levels, config, trigger_ok):
    """One host tensor's stream: ``(swap, None)``, or ``(None, reason)``."""
    # readers further apart than swapout_threshold get copies of their own, as swaps do
    groupby = min(config.swapin_groupby, config.swapout_threshold)
    groups = group_consumers(on_device, levels, view, groupby)
    return swap_for_groups(view, producer, info, groups, levels, config, trigger_ok, streamed=True)
