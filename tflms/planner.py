"""Plan: choose the tensors to swap and the triggers of their swap-ins.

:func:`make_plan` reads the analysis view (:func:`tflms.build_view`) and
returns a :class:`~tflms.plan.SwapPlan`. It never touches TensorFlow.

How a plan is made (TFLMS v2's rules, automatic, no optimizer scope needed):

1. *Candidates* are outputs of ops on the compute device with rank >= 2 and
   at least ``min_tensor_bytes``, not of a never-swap dtype (resource,
   variant, string, int32 - int32 lives in host memory on GPUs - or TF1
   reference types), not produced by a Const/Placeholder/variable read/
   Identity/Shape-like op, not inside control flow, and passing the
   scope/type filters.
2. A candidate is swapped for its *far consumers*: those whose level exceeds
   the producer's by more than ``swapout_threshold``. If a far consumer
   cannot be rerouted (control flow, another device, a tflms op), the
   tensor stays alive until then anyway and is not swapped.
3. Far consumers within ``swapin_groupby`` levels of the group's first
   consumer (and on the same device) share one swap-in.
4. The swap-in's *trigger* is an ancestor of the group's earliest consumer
   about ``swapin_ahead`` levels before it, on the compute device and
   outside control flow. It is found by walking back along the consumer's
   deepest inputs (every op at level L has an input at level L-1), so the
   search costs O(``swapin_ahead``) and the trigger is a true ancestor.
   Every inserted edge goes from a lower level to a higher one, so the
   rewritten graph stays acyclic. Without a trigger the swap-in waits for
   the consumer's other inputs (synchronous fallback, recorded in the plan).
5. ``sync_mode`` and ``serialization`` add the control edges of TFLMS v2.
6. ``n_tensors`` keeps the largest swaps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import networkx as nx

from tflms.config import LMSConfig
from tflms.devices import device_type as tf_device_type
from tflms.graph_view import consumers as tensor_consumers
from tflms.plan import Swap, SwapIn, SwapPlan

__all__ = ["make_plan", "NEVER_SWAP_PRODUCERS", "NEVER_SWAP_DTYPES"]

logger = logging.getLogger(__name__)

NAME_SENSITIVE = frozenset(
    {"Add", "AddV2", "AddN", "AccumulateNV2", "Mul", "MulNoNan", "Maximum", "Minimum", "BiasAdd"}
)
"""Ops Grappler canonicalizes or reassociates by input name (see :mod:`tflms.plan`)."""

ARITHMETIC_CHAIN = frozenset({"Add", "AddV2", "AddN", "Sub", "Mul", "Neg"})
"""Ops Grappler's arithmetic optimizer folds into trees (AddOpsRewrite, MinimizeBroadcasts)
when the intermediate result has one consumer. A swap-out adds a consumer, so
swapping a tensor that links two of them would change the tree and the float
rounding; such tensors are not swapped."""

CPU_PAIRED_INPUTS = {"MaxPoolGrad": 1, "MaxPoolGradV2": 1, "MaxPool3DGrad": 1, "LRNGrad": 2}
"""Gradient ops whose input (forward output) oneDNN links to the forward op on CPU."""

NEVER_SWAP_DTYPES = frozenset({"resource", "variant", "string", "int32"})
NEVER_SWAP_PRODUCERS = frozenset(
    {
        "Const",
        "HostConst",
        "Placeholder",
        "PlaceholderV2",
        "PlaceholderWithDefault",
        "_Arg",
        "_Recv",
        "_HostRecv",
        "VarHandleOp",
        "ReadVariableOp",
        "ResourceGather",
        "Variable",
        "VariableV2",
        "VarIsInitializedOp",
        "Identity",
        "IdentityN",
        "Snapshot",
        "StopGradient",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "BroadcastGradientArgs",
        "NoOp",
    }
)


def make_plan(view: nx.DiGraph, config: LMSConfig | None = None) -> SwapPlan:
    """Choose swaps for ``view`` under ``config``.

    Args:
        view: the analysis view of a graph (from :func:`tflms.build_view`).
        config: planner options; defaults to ``LMSConfig()``.

    Returns:
        The :class:`SwapPlan`; possibly with no swaps, in which case
        ``plan.skipped`` and ``plan.notes`` say why.

    Example:
        >>> import networkx as nx
        >>> from tflms.graph_view import TensorInfo, assign_levels
        >>> v = nx.DiGraph(name="chain")
        >>> for i in range(12):
        ...     out = TensorInfo(f"op{i}:0", 0, "float32", (8, 1024), 32768)
        ...     v.add_node(f"op{i}", type="Relu", device="", placement="compute", outputs=(out,),
        ...                control_flow=False, functions=(), stateful=False, tflms=None)
        ...     if i:
        ...         v.add_edge(f"op{i-1}", f"op{i}", tensors=[(0, 0)], control=False)
        >>> v.add_edge("op1", "op11", tensors=[(0, 1)], control=False)
        >>> assign_levels(v)
        >>> plan = make_plan(v, LMSConfig(swapout_threshold=5, swapin_ahead=3, min_tensor_bytes=0))
        >>> [(s.tensor, s.swap_ins[0].trigger) for s in plan.swaps]
        [('op1:0', 'op8')]
    """
    config = config or LMSConfig()
    levels = nx.get_node_attributes(view, "level")
    notes = list(_notes(view))
    swaps: list[Swap] = []
    skipped: list[tuple[str, str]] = []
    trigger_ok = _trigger_filter(view)

    for producer in view.nodes:
        node = view.nodes[producer]
        if not _producer_ok(producer, node, config):
            continue
        for info in node["outputs"]:
            if not _tensor_ok(info, config):
                continue
            swap, reason = _plan_tensor(view, producer, node, info, levels, config, trigger_ok)
            if swap is not None:
                swaps.append(swap)
            elif reason is not None:
                skipped.append((info.name, reason))

    swaps.sort(key=lambda s: (-s.bytes, s.tensor))
    if config.n_tensors is not None and len(swaps) > config.n_tensors:
        skipped.extend((s.tensor, "over the n_tensors cap") for s in swaps[config.n_tensors :])
        swaps = swaps[: config.n_tensors]
    if config.sync_mode in (1, 3):
        swaps = [_with_swapout_waits(view, s) for s in swaps]

    plan = SwapPlan(
        swaps=tuple(swaps),
        graph_name=str(view.graph.get("name", "")),
        serialization=_serialization_chains(view, config),
        config=config.to_dict(),
        skipped=tuple(sorted(skipped)),
        notes=tuple(notes),
        batch_size=view.graph.get("batch_size"),
    )
    logger.debug(
        "planned %d swaps (%d bytes), %d skipped, on %s",
        len(plan.swaps),
        plan.bytes_swapped,
        len(plan.skipped),
        plan.graph_name,
    )
    return plan


# --------------------------------------------------------------------------- filters


def _producer_ok(name: str, node: dict, config: LMSConfig) -> bool:
    if node["placement"] != "compute" or node["control_flow"] or node["tflms"]:
        return False
    if node["type"] in NEVER_SWAP_PRODUCERS:
        return False
    if config.incl_types and node["type"] not in config.incl_types:
        return False
    if node["type"] in config.excl_types:
        return False
    if config.incl_scopes and not name.startswith(config.incl_scopes):
        return False
    if config.excl_scopes and name.startswith(config.excl_scopes):
        return False
    return True


def _tensor_ok(info, config: LMSConfig) -> bool:
    return (
        not info.is_ref
        and info.dtype not in NEVER_SWAP_DTYPES
        and info.rank is not None
        and info.rank >= 2
        and info.bytes >= config.min_tensor_bytes
        and info.bytes > 0
    )


def _device_type(view: nx.DiGraph, node: dict) -> str:
    device = node["device"] or view.graph.get("compute_device") or ""
    if device:
        return (tf_device_type(device) or "").upper()
    return view.graph.get("default_device_type", "GPU")


def _trigger_filter(view: nx.DiGraph) -> Callable[[str], bool]:
    def ok(name: str) -> bool:
        node = view.nodes[name]
        return node["placement"] == "compute" and not node["control_flow"] and not node["tflms"]

    return ok


# --------------------------------------------------------------------------- one tensor


def _plan_tensor(view, producer, node, info, levels, config, trigger_ok):
    """Plan the swap of one candidate tensor; returns ``(swap, None)`` or ``(None, reason)``."""
    lp = levels[producer]
    uses = tensor_consumers(view, producer, info.index)
    far = sorted(
        ((c, i) for c, i in uses if levels[c] - lp > config.swapout_threshold),
        key=lambda ci: (levels[ci[0]], ci[0], ci[1]),
    )
    if not far:
        return None, None  # short-lived: the common case, not worth a line in the report
    if _order_sensitive(view, producer) or any(_order_sensitive(view, c) for c, _ in uses):
        return (
            None,
            "an AddN of 3+ inputs reads or writes it (its float sum order depends on buffer reuse)",
        )
    for c, i in far:
        cnode = view.nodes[c]
        if cnode["placement"] != "compute" or cnode["control_flow"] or cnode["tflms"]:
            return (
                None,
                f"a far consumer ({cnode['type']}) is in control flow or off the compute device",
            )
        if node["type"] in ARITHMETIC_CHAIN and cnode["type"] in ARITHMETIC_CHAIN:
            return None, (
                f"{node['type']} -> {cnode['type']} may be folded by Grappler's arithmetic "
                "optimizer; an extra consumer would change its float rounding"
            )
        if info.index and cnode["type"] in NAME_SENSITIVE:
            return None, (
                f"a far consumer ({cnode['type']}) of output {info.index} is commutative: Grappler "
                "would reorder its renamed input and change float results"
            )
        if CPU_PAIRED_INPUTS.get(cnode["type"]) == i and _device_type(view, cnode) == "CPU":
            return None, (
                f"on CPU, oneDNN pairs the forward op with {cnode['type']} through a workspace; "
                "rerouting would change how ties are broken"
            )

    swap_ins = []
    for group in _group(far, levels, view, config.swapin_groupby):
        swap_in, reason = _plan_swap_in(view, producer, lp, group, levels, config, trigger_ok)
        if swap_in is None:
            return None, reason
        swap_ins.append(swap_in)
    return (
        Swap(
            tensor=info.name,
            producer=producer,
            index=info.index,
            bytes=info.bytes,
            dtype=info.dtype,
            producer_level=lp,
            device=node["device"],
            swap_ins=tuple(swap_ins),
        ),
        None,
    )


def _group(far, levels, view, groupby):
    """Split far consumers (sorted by level) into swap-in groups."""
    groups: list[list[tuple[str, int]]] = []
    for c, i in far:
        device = view.nodes[c]["device"]
        for group in groups:
            first = group[0][0]
            if view.nodes[first]["device"] == device and levels[c] - levels[first] <= groupby:
                group.append((c, i))
                break
        else:
            groups.append([(c, i)])
    return groups


def _plan_swap_in(view, producer, lp, group, levels, config, trigger_ok):
    earliest = group[0][0]
    lc = levels[earliest]
    consumers = tuple(group)
    waits: tuple[str, ...] = ()
    if config.sync_mode in (2, 3):
        waits = _other_inputs(view, earliest, producer)
        if not waits:
            return None, "sync mode 2: the consumer has no other input to wait for"
        return SwapIn(consumers=consumers, control_inputs=waits, consumer_level=lc), None

    trigger = _find_trigger(view, earliest, lc - config.swapin_ahead, lp, levels, trigger_ok)
    if trigger is not None:
        return (
            SwapIn(
                consumers=consumers,
                trigger=trigger,
                trigger_level=levels[trigger],
                consumer_level=lc,
            ),
            None,
        )
    waits = _other_inputs(view, earliest, producer)
    if not waits:
        return None, "no swap-in trigger and the consumer has no other input to wait for"
    reason = (
        f"no op on the compute device between level {lp} and {lc} precedes {earliest}; "
        "the swap-in waits for the consumer's other inputs"
    )
    return SwapIn(
        consumers=consumers, control_inputs=waits, consumer_level=lc, fallback=reason
    ), None


def _find_trigger(view, consumer, target, floor, levels, ok):
    """An eligible ancestor of ``consumer`` at a level in ``(floor, level(consumer))``.

    Walks back along the deepest input of each op, so each step lowers the
    level by exactly one. Prefers the first eligible op at or below
    ``target``; failing that, the eligible op above ``target`` closest to it.
    """
    chain = []
    node = consumer
    while True:
        preds = view.pred[node]
        if not preds:
            break
        node = max(preds, key=lambda p: (levels[p], p))
        if levels[node] <= floor:
            break
        chain.append(node)
        if levels[node] <= target and ok(node):
            return node
    above = [n for n in chain if levels[n] > target and ok(n)]
    return above[-1] if above else None


def _other_inputs(view, consumer, producer) -> tuple[str, ...]:
    return tuple(
        sorted(
            p
            for p, edge in view.pred[consumer].items()
            if p != producer and edge.get("tensors") and not view.nodes[p]["tflms"]
        )
    )


# --------------------------------------------------------------------------- summation order

ORDER_SENSITIVE = frozenset({"AddN", "AccumulateNV2"})
"""Sums whose float result depends on which input buffer TensorFlow reuses.

An AddN of 3+ inputs accumulates into the first input whose buffer it may
reuse (reference count 1 at run time). Swapping one of its inputs or its
output changes reference counts or allocator attributes, hence the buffer it
picks, hence the summation order: results differ in the last bit. tflms never
swaps a tensor an AddN of 3+ inputs reads or writes, so training stays
bitwise identical.
"""


def _num_data_inputs(view, node: str) -> int:
    return sum(len(edge.get("tensors", ())) for edge in view.pred[node].values())


def _order_sensitive(view, node: str) -> bool:
    return view.nodes[node]["type"] in ORDER_SENSITIVE and _num_data_inputs(view, node) >= 3


# --------------------------------------------------------------------------- sync / serialization


def _with_swapout_waits(view, swap: Swap) -> Swap:
    rerouted = {c for c, _ in swap.consumers}
    near = sorted(
        {c for c, _ in tensor_consumers(view, swap.producer, swap.index) if c not in rerouted}
    )
    return Swap(**{**swap.__dict__, "wait_for_swapout": tuple(near)})


def _serialization_chains(view, config: LMSConfig) -> tuple[tuple[str, ...], ...]:
    if not config.serialization:
        return ()
    by_level: dict[int, list[str]] = {}
    for name, data in view.nodes(data=True):
        if data["placement"] == "compute" and not data["control_flow"] and not data["tflms"]:
            by_level.setdefault(data["level"], []).append(name)
    chains = []
    for lo, hi in config.serialization:
        for level in range(lo, hi + 1):
            ops = sorted(by_level.get(level, ()))
            if len(ops) > 1:
                chains.append(tuple(ops))
    return tuple(chains)


def _notes(view: nx.DiGraph):
    g = view.graph
    cf = g.get("control_flow_ops") or []
    if cf:
        functions = sorted({f for n in cf for f in view.nodes[n]["functions"]})
        yield (
            f"{len(cf)} control-flow ops left untouched"
            + (
                f" (bodies: {', '.join(functions[:5])}{'...' if len(functions) > 5 else ''})"
                if functions
                else ""
            )
        )
    calls = [
        n
        for n, d in view.nodes(data=True)
        if d["type"] in ("PartitionedCall", "StatefulPartitionedCall")
    ]
    if calls:
        yield (
            f"{len(calls)} function calls (e.g. {calls[0]}) are treated as single ops; "
            "tensors inside their bodies are not swapped"
        )
    if g.get("unsized_batch"):
        yield (
            f"{len(g['unsized_batch'])} tensors have an unknown batch dimension; sizes are per sample "
            "(set LMSConfig(batch_size=...) for absolute sizes)"
        )
    if g.get("unknown_dims"):
        yield f"{len(g['unknown_dims'])} tensors have other unknown dimensions, counted as 1"
    if g.get("batch_size") is not None:
        yield f"batch size {g['batch_size']} (from {g.get('batch_source')})"
