"""Recomputation: which activations to re-run before the backward pass instead of keeping them.

A tensor is *recomputed* when its producer is cheap and what it is computed
from is at hand when its far consumers run: the ops are cloned, the clones
run just before those consumers (started by a trigger, like a swap-in), and
the original outputs die after the forward pass. In a network with unfused
BatchNorm, the BN output and the ReLU after it are recomputed from the
convolution output, which the BN backward pass keeps (or swaps) anyway.

Which ops qualify is decided by the cost model, not by a list of names
(:mod:`tflms.plan.rerun_cost`): *cheap* ops always (elementwise ops,
activations, the BatchNorm arithmetic, casts, reshapes, concatenations and
reductions, whatever their type), and with ``LMSConfig.recompute_dense`` also
the convolutions and matmuls that re-run faster than the host link copies
their outputs.

A recomputation *group* is grown from a tensor with far consumers (a
*target*) back through its inputs: an input is

* *at hand* when it is small (below ``min_tensor_bytes``), resident (a
  variable read or constant), or read in the backward pass anyway (it has a
  consumer at least as late as the target's far consumers - it is then kept
  or swapped by the swap planner, which sees the clones as its consumers);
* otherwise it is recomputed too, if its producer qualifies, up to
  :data:`MAX_GROUP_OPS` ops; if not, the target is kept.

With ``recompute_dense``, a group that reads a tensor another group
recomputes (or shares an op with it) absorbs that group, up to
:data:`MAX_CHAIN_OPS` ops: the clones read clones, so the tensors between them
need not be kept or swapped - checkpointing between the tensors the chain
starts from. (An original op that was a far consumer of an absorbed group and
is now a member reads the original tensor again, which the swap planner then
keeps or swaps for it.) A ResNet bottleneck then keeps its input and its first
convolution's output; the rest is re-run before its backward pass.

Rewrites that would change Grappler's arithmetic rewrites or TensorFlow's
buffer reuse of an ``AddN`` are refused (see :func:`veto`), so training stays
bitwise identical.

Example:
    >>> import networkx as nx
    >>> from tflms.config import LMSConfig
    >>> from tflms.graph.view import TensorInfo, assign_levels
    >>> v = nx.DiGraph(name="chain")
    >>> def op(name, kind, nbytes, *ins):
    ...     out = TensorInfo(f"{name}:0", 0, "float32", (8, nbytes // 32), nbytes)
    ...     v.add_node(name, type=kind, device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    >>> op("conv", "Conv2D", 1 << 20)
    >>> op("relu", "Relu", 1 << 20, "conv")
    >>> for i in range(12):
    ...     op(f"f{i}", "Tanh", 1 << 20, f"f{i-1}" if i else "relu")
    >>> op("grad", "ReluGrad", 1 << 20, "f11", "relu")
    >>> op("wgrad", "Conv2DBackpropFilter", 1 << 20, "grad", "conv")
    >>> assign_levels(v)
    >>> config = LMSConfig(swapout_threshold=5, swapin_ahead=2, min_tensor_bytes=0)
    >>> groups = plan_recomputes(v, config, config.target())
    >>> [(g.ops, g.consumers) for g in groups]
    [(('relu',), (('grad', 1, 'relu', 0),))]
"""

from __future__ import annotations

import logging

import networkx as nx

from tflms.config import LMSConfig
from tflms.cost.ops import DENSE_OPS
from tflms.cost.target import Target
from tflms.graph.grappler_rules import (
    aliases_a_variable,
    foldable_link,
    folded_to_constants,
    pinned,
    removed_at_run_time,
)
from tflms.graph.view import consumers as tensor_consumers
from tflms.plan.candidates import (
    ARITHMETIC_CHAIN,
    CPU_PAIRED_INPUTS,
    NAME_SENSITIVE,
    NEVER_SWAP_PRODUCERS,
    compute_device_type,
    order_sensitive,
    tensor_ok,
)
from tflms.plan.entries import Recompute
from tflms.plan.phases import turn_level
from tflms.plan.rerun_cost import CHEAP_INTENSITY, cheap, data_inputs, worth_rerunning
from tflms.plan.triggers import find_trigger, trigger_filter

__all__ = [
    "plan_recomputes",
    "make_group",
    "cheap",
    "worth_rerunning",
    "veto",
    "CHEAP_INTENSITY",
    "MAX_GROUP_OPS",
    "MAX_CHAIN_OPS",
    "gates_for",
    "reroute_veto",
]

logger = logging.getLogger(__name__)

MAX_GROUP_OPS = 8
"""At most this many ops are cloned to recompute one tensor."""

MAX_CHAIN_OPS = 32
"""With ``recompute_dense``, groups that feed each other are merged into one
(the clones read clones, so the tensors between them need not be kept or
swapped) while the merged group has at most this many ops."""


def veto(view: nx.DiGraph, group: list[str], rerouted: dict, *, gated: bool = False) -> str | None:
    """Why recomputing ``group`` would change how TensorFlow computes, or ``None``.

    Args:
        view: the analysis view.
        group: the ops to clone.
        rerouted: ``{(op, output index): [(consumer, input index), ...]}``
            the far consumers that would read clones.
        gated: the clones read gates and are left to Grappler
            (:func:`gates_for`), which folds a chain of clones as it folds
            the originals; kept clones are not folded.

    Returns:
        A reason, or ``None`` when the rewrite is neutral.
    """
    members = set(group)
    for op in group:
        for src, k in data_inputs(view, op):
            readers = tensor_consumers(view, src, k)
            if src in members:
                if not gated and len(readers) == 1 and foldable_link(view, src, op):
                    return f"Grappler may fold {src} into {op}, but not their clones"
                continue
            if any(order_sensitive(view, c) for c, _ in readers):
                return f"an AddN of 3+ inputs reads {src}:{k}, which a clone would also read"
            if len(readers) == 1 and foldable_link(view, src, readers[0][0]):
                return f"a clone reading {src}:{k} would stop Grappler folding it into its consumer"
    for (op, k), far in rerouted.items():
        reason = reroute_veto(view, op, k, far, gated=gated, members=members)
        if reason is not None:
            return reason
    return None


def reroute_veto(
    view: nx.DiGraph, op: str, k: int, far, *, gated: bool = False, members=frozenset()
) -> str | None:
    """Why the far consumers ``far`` of tensor ``op:k`` may not read a clone, or ``None``.

    Args:
        view: the analysis view.
        op: the producer.
        k: the output index.
        far: ``[(consumer, input index), ...]`` rerouted to the clone.
        gated: as for :func:`veto`.
        members: the group's ops (clones of those that read ``op:k`` read its clone too).

    Returns:
        A reason, or ``None``.
    """
    uses = tensor_consumers(view, op, k)
    if order_sensitive(view, op) or any(order_sensitive(view, c) for c, _ in uses):
        return f"an AddN of 3+ inputs reads or writes {op}:{k}"
    # no rule for the consumers left to the original: a hold keeps its readers as they were
    # (Recompute's doc), so Grappler folds it, or not, as it does without the plan
    for c, i in far:
        ctype = view.nodes[c]["type"]
        if pinned(view, c):  # no plan reroutes a pinned op (the check found it rewritten)
            return f"Grappler rewrites its far consumer {c} differently once it reads a clone"
        if removed_at_run_time(view, c):
            return f"a far consumer ({ctype}) is removed by Grappler before the step runs"
        if view.nodes[op]["type"] in ARITHMETIC_CHAIN and ctype in ARITHMETIC_CHAIN:
            # a kept clone is never folded where the original may be; a gated clone read by
            # this consumer alone may be folded into it where the original (read by others)
            # is not; read by another clone too, neither is folded
            if not gated or (len(far) == 1 and not any(r in members for r, _ in uses)):
                return f"Grappler may fold {op} or its clone into its far consumer {c}, not both"
        if k and ctype in NAME_SENSITIVE:
            return f"a far consumer ({ctype}) of output {k} is commutative"
        if CPU_PAIRED_INPUTS.get(ctype) == i and compute_device_type(view, view.nodes[c]) == "CPU":
            return f"on CPU, oneDNN pairs {op} with {ctype} through a workspace"
    return None


def plan_recomputes(
    view: nx.DiGraph, config: LMSConfig, target: Target, *, taken: frozenset[str] = frozenset()
) -> tuple[Recompute, ...]:
    """Choose the recomputation groups of ``view`` (see the module docstring).

    Args:
        view: the analysis view (without tflms ops).
        config: ``swapout_threshold`` defines *far* consumers, ``swapin_ahead``
            how early a group is triggered, ``min_tensor_bytes`` what is worth
            it, the scope/type filters which producers qualify,
            ``recompute_dense`` which dense ops may be re-run.
        target: the device that times the clones and the link that decides
            which dense ops are worth re-running (resolved once by the
            front end, :class:`tflms.pipeline.Pipeline`).
        taken: ops other groups re-run already (segments): not re-run again.

    Returns:
        The groups, largest saving first.
    """
    device, link = target.device, target.link
    levels = nx.get_node_attributes(view, "level")
    trigger_ok = trigger_filter(view)
    memo: dict[str, tuple[bool, float]] = {}

    kept_free = folded_to_constants(view)

    def eligible(node):
        if node in taken or node in kept_free or aliases_a_variable(view, node):
            return False  # a constant to Grappler, or the variable's own buffer: nothing to free
        if pinned(view, node, recompute=True):
            return False  # Grappler rewrites the step differently once it is re-run
        if node not in memo:
            memo[node] = cheap(view, node, device)
            if not memo[node][0] and config.recompute_dense:
                memo[node] = worth_rerunning(view, node, device, link, config.recompute_dense)
        return memo[node][0]

    planned: dict[int, Recompute] = {}
    owner: dict[str, int] = {}
    for producer in nx.topological_sort(view):
        node = view.nodes[producer]
        if producer in owner or not eligible(producer) or not _filters_ok(producer, node, config):
            continue
        for info in node["outputs"]:
            if not tensor_ok(info, config):
                continue
            lp = levels[producer]
            far = [
                (c, i)
                for c, i in tensor_consumers(view, producer, info.index)
                if levels[c] - lp > config.swapout_threshold
            ]
            if not far:
                continue
            group = _grow(view, producer, far, levels, config, eligible)
            if group is None:
                continue
            if config.recompute_dense:  # chain through earlier groups instead of keeping
                absorbed = _feeding_groups(view, group, owner)
                merged = set(group).union(*(planned[g].ops for g in absorbed))
                if absorbed and len(merged) <= MAX_CHAIN_OPS:
                    entry = make_group(
                        view, _by_level(merged, levels), levels, config, trigger_ok, memo
                    )
                    if entry is not None:
                        for g in absorbed:
                            del planned[g]
                        _claim(planned, owner, entry)
                        continue
            if any(op in owner for op in group):
                continue
            entry = make_group(view, group, levels, config, trigger_ok, memo)
            if entry is not None:
                _claim(planned, owner, entry)
    groups = sorted(planned.values(), key=lambda g: (-g.bytes, g.ops))
    logger.debug(
        "planned %d recompute groups (%d bytes)", len(groups), sum(g.bytes for g in groups)
    )
    return tuple(groups)


def _claim(planned, owner, entry) -> None:
    key = max(planned, default=-1) + 1
    planned[key] = entry
    owner.update((op, key) for op in entry.ops)


def _by_level(ops, levels) -> list[str]:
    return sorted(ops, key=lambda op: (levels[op], op))


def _feeding_groups(view, group, owner) -> list[int]:
    """Earlier groups that recompute an op of ``group`` or a tensor it reads."""
    members = set(group)
    found = {owner[op] for op in group if op in owner}
    found.update(
        owner[src]
        for op in group
        for src, _ in data_inputs(view, op)
        if src not in members and src in owner
    )
    return sorted(found)


def _filters_ok(name: str, node: dict, config: LMSConfig) -> bool:
    if config.incl_types and node["type"] not in config.incl_types:
        return False
    if node["type"] in config.excl_types:
        return False
    if config.incl_scopes and not name.startswith(config.incl_scopes):
        return False
    return not (config.excl_scopes and name.startswith(config.excl_scopes))


def _grow(view, target, far, levels, config, eligible) -> list[str] | None:
    """The ops to clone for ``target``, topologically ordered; ``None`` if it cannot be done."""
    earliest = min(levels[c] for c, _ in far)
    group, todo = [], [target]
    while todo:
        op = todo.pop()
        if op in group:
            continue
        group.append(op)
        if len(group) > MAX_GROUP_OPS:
            return None
        for src, k in data_inputs(view, op):
            if _at_hand(view, src, k, earliest, config):
                continue
            if not eligible(src):
                return None
            todo.append(src)
    return sorted(group, key=lambda op: (levels[op], op))


def _at_hand(view, src, k, earliest, config) -> bool:
    data = view.nodes[src]
    info = data["outputs"][k]
    if info.bytes < config.min_tensor_bytes or info.bytes == 0:
        return True
    if data["type"] in NEVER_SWAP_PRODUCERS:  # constants, variable reads, inputs: resident
        return True
    levels = view.nodes
    return any(levels[c]["level"] >= earliest for c, _ in tensor_consumers(view, src, k))


def _backward_readers_only(view: nx.DiGraph, rerouted: dict, levels: dict) -> dict:
    """``rerouted`` without its forward readers when it has backward ones too.

    Every reader of a group reads the same clones, made once, just before the
    earliest of them. A forward reader far from its producer (a residual
    add across a block) would have the clones made in the forward pass and
    kept until the backward readers ran: what keeping the originals costs,
    plus the re-run and a second copy. So forward readers stay on the
    originals; a group whose readers are all in the forward pass keeps them.
    (A ResNet-50's chained dense groups ran their convolutions in the forward
    pass this way, to 3.0 GiB instead of 1.9 simulated.)
    """
    turn = turn_level(view)
    late = {
        key: [(c, i) for c, i in readers if levels[c] >= turn] for key, readers in rerouted.items()
    }
    if not any(late.values()):
        return rerouted
    return {key: readers for key, readers in late.items() if readers}


def make_group(
    view, group, levels, config, trigger_ok, memo, *, far=None, per_tensor=False
) -> Recompute | None:
    """The recomputation of ``group`` for its far consumers, or None (vetoed, no trigger).

    Args:
        view: The analysis view.
        group: The ops to clone, in topological order.
        levels: Op levels of the view.
        config: ``swapout_threshold`` (far) and ``swapin_ahead`` (trigger).
        trigger_ok: Which ops may trigger (:func:`~tflms.plan.triggers.trigger_filter`).
        memo: ``{op: (eligible, seconds)}`` for every op of the group.
        far: ``far(op, consumer)``: whether a consumer outside the group reads
            the clone; default: more than ``swapout_threshold`` levels later.
        per_tensor: a tensor whose rerouting :func:`reroute_veto` refuses is
            left to its original (kept) instead of the whole group refused,
            and the clones read it rather than re-run it (:func:`_trim`).

    Returns:
        The :class:`~tflms.plan.entries.Recompute`, or None.
    """
    members = set(group)
    if far is None:

        def far(op, consumer):
            return levels[consumer] - levels[op] > config.swapout_threshold

    rerouted: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for op in group:
        for info in view.nodes[op]["outputs"]:
            readers = [
                (c, i)
                for c, i in tensor_consumers(view, op, info.index)
                if c not in members and far(op, c)
            ]
            if readers:
                rerouted[(op, info.index)] = readers
    rerouted = _backward_readers_only(view, rerouted, levels)
    gates = gates_for(view, group)
    if per_tensor:  # a tensor whose rerouting is vetoed stays kept; the group goes on
        rerouted = {
            (op, k): readers
            for (op, k), readers in rerouted.items()
            if reroute_veto(view, op, k, readers, gated=bool(gates), members=set(group)) is None
        }
    if not rerouted:
        return None
    if per_tensor:
        group = _trim(view, group, rerouted, levels)
        gates = gates_for(view, group)
    reason = veto(view, group, rerouted, gated=bool(gates))
    if reason is not None:
        logger.debug("not recomputing %s: %s", group[-1], reason)
        return None
    consumers = sorted(
        ((c, i, op, k) for (op, k), readers in rerouted.items() for c, i in readers),
        key=lambda t: (levels[t[0]], t[0], t[1]),
    )
    earliest = consumers[0][0]
    lc = levels[earliest]
    floor = max(levels[op] for op in group)
    trigger = find_trigger(view, earliest, lc - config.swapin_ahead, floor, levels, trigger_ok)
    if trigger is None or trigger in members:
        return None
    nbytes = sum(view.nodes[op]["outputs"][k].bytes for op, k in rerouted)
    seconds = sum(memo[op][1] for op in group)
    sources = sorted(
        {f"{s}:{k}" for op in group for s, k in data_inputs(view, op) if s not in members}
        - {f"{s}:{k}" for s, k in _small_inputs(view, group, config)}
    )
    return Recompute(
        ops=tuple(group),
        consumers=tuple(consumers),
        trigger=trigger,
        trigger_level=levels[trigger],
        consumer_level=lc,
        gates=gates,
        bytes=nbytes,
        seconds=seconds,
        reason=(
            f"{_kinds(view, group)} re-run from {', '.join(sources) or 'small inputs'} "
            f"({seconds * 1e3:.3f} ms predicted)"
        ),
    )


def _trim(view, group, rerouted, levels) -> list[str]:
    """``group`` without the ops its clones need not re-run, in the same order.

    An op none of whose tensors is rerouted, and whose tensors the group reads
    are alive anyway when the clones run (a reader outside the group at or
    after the earliest rerouted consumer: a tensor whose rerouting was vetoed
    stays kept), is read where it is instead of re-run; then every op whose
    clone no longer feeds a rerouted tensor is dropped. Besides saving the
    work, a clone then reads what its original reads: had the group re-run
    such an op, its clone would have one reader where the original has
    several, and Grappler rewrites the two apart (GELU's ``0.5 * x``: the
    arithmetic optimizer moves the constant into the clone's product).
    """
    earliest = min(levels[c] for readers in rerouted.values() for c, _ in readers)

    def alive(op: str, inside: set[str]) -> bool:
        for info in view.nodes[op]["outputs"]:
            if (op, info.index) in rerouted:
                return False
            readers = tensor_consumers(view, op, info.index)
            if any(c in inside for c, _ in readers) and not any(
                c not in inside and levels[c] >= earliest for c, _ in readers
            ):
                return False
        return True

    members = list(group)
    while True:
        inside = set(members)
        kept = [op for op in members if not alive(op, inside)]
        needed: set[str] = {op for op, _ in rerouted}
        for op in reversed(kept):
            if op in needed:
                needed.update(src for src, _ in data_inputs(view, op))
        kept = [op for op in kept if op in needed]
        if kept == members:
            return members
        members = kept


CONSTANT_TYPES = frozenset({"Const", "HostConst"})
HALF_DTYPES = frozenset({"float16", "bfloat16"})


def gates_for(view: nx.DiGraph, group) -> tuple[tuple[str, int], ...]:
    """The tensors the first clones of ``group`` read through gates (see :class:`Recompute`).

    Every input of an op that reads no op of the group, constants excepted;
    none at all when such an op reads constants only (its clone then waits for
    the trigger itself and is kept from Grappler, as are the others), or when
    the group computes in float16 or bfloat16: under ``mixed_float16`` a
    MobileNetV3 with gated clones trained 1e-3 away from plain training although
    Grappler rewrote both steps alike (cause not found), and bitwise with kept
    clones.

    Args:
        view: The analysis view.
        group: The ops to clone, in topological order.

    Returns:
        ``(op, output index)`` pairs, in the order the clones read them.
    """
    members = set(group)
    if any(
        info.dtype in HALF_DTYPES for op in group for info in view.nodes[op]["outputs"]
    ):  # measured: MobileNetV3 under mixed_float16 trained 1e-3 apart with gated clones
        return ()
    gates: dict[tuple[str, int], None] = {}
    for op in group:
        inputs = data_inputs(view, op)
        if any(src in members for src, _ in inputs):
            continue
        outside = [(s, k) for s, k in inputs if view.nodes[s]["type"] not in CONSTANT_TYPES]
        if not outside:
            return ()
        gates.update(dict.fromkeys(outside))
    return tuple(gates)


def _kinds(view, group) -> str:
    dense = sum(view.nodes[op]["type"] in DENSE_OPS for op in group)
    cheap_ops = f"{len(group) - dense} cheap ops"
    return f"{cheap_ops} and {dense} dense" if dense else cheap_ops


def _small_inputs(view, group, config):
    members = set(group)
    for op in group:
        for src, k in data_inputs(view, op):
            if src not in members and view.nodes[src]["outputs"][k].bytes < config.min_tensor_bytes:
                yield src, k
