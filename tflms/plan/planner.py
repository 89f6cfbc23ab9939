"""The swap planner: choose the tensors to swap and the triggers of their swap-ins.

:func:`plan_swaps` reads the analysis view (:func:`tflms.build_view`) and
returns a :class:`~tflms.plan.swap_plan.SwapPlan` of swaps; it never touches
TensorFlow. :func:`tflms.make_plan` combines it with recomputation and
ordering.

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
7. With ``offload_weights``, the weights kept on the host are streamed
   (:mod:`tflms.plan.streams`): swaps whose every reader reads a swap-in.
"""

from __future__ import annotations

import logging

import networkx as nx

from tflms.config import LMSConfig
from tflms.graph.grappler_rules import in_a_fold
from tflms.graph.view import consumers as tensor_consumers
from tflms.plan.candidates import (
    NEVER_SWAP_DTYPES,
    NEVER_SWAP_PRODUCERS,
    producer_ok,
    tensor_ok,
    veto,
)
from tflms.plan.streams import plan_streams
from tflms.plan.swap_plan import Swap, SwapPlan
from tflms.plan.triggers import group_consumers, swap_for_groups, trigger_filter
from tflms.utils.units import format_bytes

__all__ = ["plan_swaps", "NEVER_SWAP_PRODUCERS", "NEVER_SWAP_DTYPES"]

logger = logging.getLogger(__name__)


def plan_swaps(view: nx.DiGraph, config: LMSConfig | None = None) -> SwapPlan:
    """Choose swaps for ``view`` under ``config`` (the swap lever of :func:`tflms.make_plan`).

    Args:
        view: the analysis view of a graph (from :func:`tflms.build_view`).
        config: planner options; defaults to ``LMSConfig()``.

    Returns:
        The :class:`SwapPlan`; possibly with no swaps, in which case
        ``plan.skipped`` and ``plan.notes`` say why.

    Example:
        >>> import networkx as nx
        >>> from tflms.graph.view import TensorInfo, assign_levels
        >>> v = nx.DiGraph(name="chain")
        >>> for i in range(12):
        ...     out = TensorInfo(f"op{i}:0", 0, "float32", (8, 1024), 32768)
        ...     v.add_node(f"op{i}", type="Relu", device="", placement="compute", outputs=(out,),
        ...                control_flow=False, functions=(), stateful=False, tflms=None)
        ...     if i:
        ...         v.add_edge(f"op{i-1}", f"op{i}", tensors=[(0, 0)], control=False)
        >>> v.add_edge("op1", "op11", tensors=[(0, 1)], control=False)
        >>> assign_levels(v)
        >>> plan = plan_swaps(v, LMSConfig(swapout_threshold=5, swapin_ahead=3, min_tensor_bytes=0))
        >>> [(s.tensor, s.swap_ins[0].trigger) for s in plan.swaps]
        [('op1:0', 'op8')]
    """
    config = config or LMSConfig()
    levels = nx.get_node_attributes(view, "level")
    notes = list(_notes(view))
    streams, skipped = plan_streams(view, config) if config.offload_weights else ([], [])
    if config.offload_weights and not streams:
        notes.append(
            "offload_weights: no device op reads a weight kept on the host (build the model "
            "inside tflms.keras.weights_on_host(host_device))"
        )
    if not config.swap:
        return SwapPlan(
            swaps=tuple(streams),
            graph_name=str(view.graph.get("name", "")),
            serialization=_serialization_chains(view, config),
            config=config,
            skipped=tuple(sorted(skipped)),
            notes=(*notes, "no tensor swapped: swapping is off (LMSConfig.swap=False)"),
            batch_size=view.graph.get("batch_size"),
        )
    swaps: list[Swap] = []
    trigger_ok = trigger_filter(view)
    any_size = config.replace(min_tensor_bytes=0)
    small: list[int] = []  # bytes of the tensors only min_tensor_bytes kept out
    spans: list[int] = []  # levels the short-lived candidates live

    for producer in view.nodes:
        node = view.nodes[producer]
        if not producer_ok(producer, node, config):
            continue
        for info in node["outputs"]:
            if not tensor_ok(info, config, node):
                if tensor_ok(info, any_size, node):
                    small.append(info.bytes)
                continue
            swap, reason = _plan_tensor(view, producer, node, info, levels, config, trigger_ok)
            if swap is not None:
                swaps.append(swap)
            elif reason is not None:
                skipped.append((info.name, reason))
            else:
                uses = tensor_consumers(view, producer, info.index)
                spans.append(max((levels[c] - levels[producer] for c, _ in uses), default=0))
    if not swaps:
        notes.append(_why_no_swaps(config, small, spans, len(skipped)))

    swaps.sort(key=lambda s: (-s.bytes, s.tensor))
    if config.n_tensors is not None and len(swaps) > config.n_tensors:
        skipped.extend((s.tensor, "over the n_tensors cap") for s in swaps[config.n_tensors :])
        swaps = swaps[: config.n_tensors]
    if config.sync_mode in (1, 3):
        swaps = [_with_swapout_waits(view, s) for s in swaps]
    swaps += streams  # every weight kept on the host, whatever the caps on swaps

    plan = SwapPlan(
        swaps=tuple(swaps),
        graph_name=str(view.graph.get("name", "")),
        serialization=_serialization_chains(view, config),
        config=config,
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


def _plan_tensor(view, producer, node, info, levels, config, trigger_ok):
    """Plan the swap of one candidate tensor; returns ``(swap, None)`` or ``(None, reason)``."""
    lp = levels[producer]
    uses = tensor_consumers(view, producer, info.index)
    # a recomputation's hold reads the original where it was made, whatever its level
    # (the Recompute's doc): never a swap-in
    far = sorted(
        (
            (c, i)
            for c, i in uses
            if levels[c] - lp > config.swapout_threshold and view.nodes[c].get("tflms") != "hold"
        ),
        key=lambda ci: (levels[ci[0]], ci[0], ci[1]),
    )
    if not far:
        return None, None  # short-lived: the common case, not worth a line in the report
    reason = veto(view, producer, info, uses, far)
    if reason is not None:
        return None, reason
    groups = group_consumers(far, levels, view, config.swapin_groupby)
    return swap_for_groups(view, producer, info, groups, levels, config, trigger_ok)


def _why_no_swaps(config: LMSConfig, small: list[int], spans: list[int], vetoed: int) -> str:
    """Why the plan swaps nothing, with the option that would change it."""
    parts = []
    if spans:
        parts.append(
            f"{len(spans)} candidate(s) are last read within swapout_threshold="
            f"{config.swapout_threshold} levels (the longest-lived spans {max(spans)}; a lower "
            "swapout_threshold swaps shorter-lived tensors)"
        )
    if small:
        parts.append(
            f"{len(small)} tensor(s) are under min_tensor_bytes={format_bytes(config.min_tensor_bytes)}"
            f" (the largest is {format_bytes(max(small))}; lower min_tensor_bytes to consider them)"
        )
    if vetoed:
        parts.append(f"{vetoed} long-lived tensor(s) are kept for the reasons listed")
    if not parts:
        return "no tensor swapped: the graph has no tensor a swap could move off the device"
    return "no tensor swapped: " + "; ".join(parts)


def _with_swapout_waits(view, swap: Swap) -> Swap:
    """Sync modes 1 and 3: the producer's other readers wait for the swap-out, those in
    an arithmetic fold or pinned by Grappler's check excepted (a control input changes
    how Grappler rewrites them; the rule swap-in triggers' waits keep too,
    :func:`~tflms.plan.triggers.other_inputs`)."""
    rerouted = {c for c, _ in swap.consumers}
    near = sorted(
        {
            c
            for c, _ in tensor_consumers(view, swap.producer, swap.index)
            if c not in rerouted and not in_a_fold(view, c)
        }
    )
    return Swap(**{**swap.__dict__, "wait_for_swapout": tuple(near)})


def _serialization_chains(view, config: LMSConfig) -> tuple[tuple[str, ...], ...]:
    if not config.serialization:
        return ()
    by_level: dict[int, list[str]] = {}
    # the ops a trigger may be: a chain's edges are control edges as a trigger's are (none on
    # an initializer, an op Grappler removes, folds or was found to rewrite differently:
    # under oneDNN with float16 kernels a chained BiasAdd stopped its MatMul's fusion)
    may_wait = trigger_filter(view)
    for name, data in view.nodes(data=True):
        # a source (a Placeholder, a Const) does no work to order
        if view.pred[name] and may_wait(name):
            by_level.setdefault(data["level"], []).append(name)
    chains = []
    for lo, hi in config.serialization:
        for level in range(lo, hi + 1):
            # in the order the ops were made (the view's): TensorFlow orders a traced step's
            # stateful ops by that order when tracing ends, so an edge against it closes a cycle
            ops = by_level.get(level, ())
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
    if g.get("unbounded_loops"):
        yield (
            f"{len(g['unbounded_loops'])} loops (e.g. {g['unbounded_loops'][0]}) keep lists "
            "without a known trip bound; they are counted as empty (pass maximum_iterations=)"
        )
    if g.get("estimated_reserve_space"):
        yield (
            f"{len(g['estimated_reserve_space'])} cuDNN RNN reserve spaces are estimated from "
            "the per-step tensors the same RNN keeps as a loop (tflms.graph.cudnn_rnn)"
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
