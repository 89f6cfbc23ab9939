"""Candidates: which tensors the planner may reroute, and why others are refused.

A tensor is a *candidate* when its producer runs on the compute device
outside control flow, is not a constant/placeholder/variable read/metadata
op, passes the scope and type filters of :class:`~tflms.config.LMSConfig`,
and the tensor has rank >= 2, a swappable dtype and at least
``min_tensor_bytes``. A candidate with far consumers is still refused
(:func:`veto`) when rerouting it would change how TensorFlow computes:
Grappler reorders commutative ops by input name and folds arithmetic chains,
an AddN of 3+ inputs sums in the order buffers happen to be reusable, and
oneDNN pairs MaxPool with its gradient through a workspace on CPU. Those
rules keep training bitwise identical with and without a plan.

Example:
    >>> "ReadVariableOp" in NEVER_SWAP_PRODUCERS, "int32" in NEVER_SWAP_DTYPES
    (True, True)
"""

from __future__ import annotations

import networkx as nx

from tflms.config import LMSConfig
from tflms.graph.grappler_rules import (
    aliases_a_variable,
    compute_device_type,
    folded_to_constants,
    folds_into_a_consumer,
    pinned,
    removed_at_run_time,
)
from tflms.graph.loops import WHILE_TYPES
from tflms.graph.view import CLONE_KINDS

__all__ = [
    "ARITHMETIC_CHAIN",
    "CPU_PAIRED_INPUTS",
    "NAME_SENSITIVE",
    "NEVER_SWAP_DTYPES",
    "NEVER_SWAP_PRODUCERS",
    "WEIGHT_GRADIENT_OPS",
    "ORDER_SENSITIVE",
    "producer_ok",
    "tensor_ok",
    "kept_list",
    "compute_device_type",
    "order_sensitive",
    "veto",
]

NAME_SENSITIVE = frozenset(
    {"Add", "AddV2", "AddN", "AccumulateNV2", "Mul", "MulNoNan", "Maximum", "Minimum", "BiasAdd"}
)
"""Ops Grappler canonicalizes or reassociates by input name (see :mod:`tflms.plan.swap_plan`)."""

ARITHMETIC_CHAIN = frozenset({"Add", "AddV2", "AddN", "Sub", "Mul", "Neg"})
"""Ops Grappler's arithmetic optimizer folds into trees (AddOpsRewrite, MinimizeBroadcasts)
when the intermediate result has one consumer. A swap-out adds a consumer, so
swapping a tensor that links two of them would change the tree and the float
rounding; such tensors are not swapped."""

CPU_PAIRED_INPUTS = {"MaxPoolGrad": 1, "MaxPoolGradV2": 1, "MaxPool3DGrad": 1, "LRNGrad": 2}
"""Gradient ops whose input (forward output) oneDNN links to the forward op on CPU."""

WEIGHT_GRADIENT_OPS = frozenset(
    {
        "Conv2DBackpropFilter",
        "Conv2DBackpropFilterV2",
        "Conv3DBackpropFilter",
        "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNativeBackpropFilter",
        "BiasAddGrad",
    }
)
"""Kernels whose outputs are weight gradients: not swapped unless
``LMSConfig.swap_weight_gradients`` (see its docstring)."""

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


ORDER_SENSITIVE = frozenset({"AddN", "AccumulateNV2"})
"""Sums whose float result depends on which input buffer TensorFlow reuses.

An AddN of 3+ inputs accumulates into the first input whose buffer it may
reuse (reference count 1 at run time). Swapping one of its inputs or its
output changes reference counts or allocator attributes, hence the buffer it
picks, hence the summation order: results differ in the last bit. tflms never
swaps a tensor an AddN of 3+ inputs reads or writes, so training stays
bitwise identical.
"""


def producer_ok(name: str, node: dict, config: LMSConfig) -> bool:
    """Whether ``node`` (a view node called ``name``) may produce a swapped tensor.

    Args:
        name: the op name.
        node: its view attributes.
        config: supplies the scope and type filters.

    Returns:
        ``True`` for compute-device ops outside control flow that are not
        tflms ops nor variables' initializers (:mod:`tflms.graph.initializers`),
        not in :data:`NEVER_SWAP_PRODUCERS` and pass the filters.
    """
    if node["placement"] != "compute" or node["tflms"] or node.get("initializer"):
        return False
    if node["control_flow"] and not node.get("loop"):
        return False  # a loop's own outputs: only its kept lists (see kept_list)
    if node["type"] in NEVER_SWAP_PRODUCERS:
        return False
    if node["type"] in WEIGHT_GRADIENT_OPS and not config.swap_weight_gradients:
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


def kept_list(node: dict, info) -> bool:
    """Whether ``info`` is a loop's list of per-iteration tensors kept for its gradient.

    An RNN's forward time loop hands these lists (its saved activations) to
    the gradient loop; their bytes come from :mod:`tflms.graph.loops`. They
    are swapped whole: TensorFlow copies a ``TensorList`` between host and
    device element by element (its registered variant device copy), and
    ``Identity`` has host and GPU kernels for ``variant``.

    Args:
        node: the producer's view attributes.
        info: one of its outputs.
    """
    loop = node.get("loop")
    return (
        loop is not None
        and info.dtype == "variant"
        and info.index in loop.list_bytes
        and info.bytes > 0
    )


def tensor_ok(info, config: LMSConfig, node: dict | None = None) -> bool:
    """Whether the output ``info`` (a :class:`~tflms.graph.view.TensorInfo`) is worth swapping.

    Args:
        info: the tensor.
        config: supplies ``min_tensor_bytes``.

        node: the producer's view attributes; with them, a loop's kept list
            (:func:`kept_list`) is a candidate too.

    Returns:
        ``True`` for non-reference tensors of rank >= 2, a swappable dtype
        and at least ``config.min_tensor_bytes`` (and more than 0) bytes; a
        loop's kept list of at least ``min_tensor_bytes``; else ``False``.
    """
    if node is not None and node["control_flow"]:
        return kept_list(node, info) and info.bytes >= config.min_tensor_bytes
    return (
        not info.is_ref
        and info.dtype not in NEVER_SWAP_DTYPES
        and info.rank is not None
        and info.rank >= 2
        and info.bytes >= config.min_tensor_bytes
        and info.bytes > 0
    )


def _num_data_inputs(view: nx.DiGraph, node: str) -> int:
    return sum(len(edge.get("tensors", ())) for edge in view.pred[node].values())


def order_sensitive(view: nx.DiGraph, node: str) -> bool:
    """Whether ``node`` is a sum of 3+ inputs whose float order depends on buffer reuse.

    Args:
        view: The analysis view.
        node: Name of the node.

    Returns:
        True for an ``AddN``-like op with at least three data inputs, whose
        result can change in the last bits when tflms changes buffer reuse.
    """
    return view.nodes[node]["type"] in ORDER_SENSITIVE and _num_data_inputs(view, node) >= 3


def veto(view: nx.DiGraph, producer: str, info, uses, far) -> str | None:
    """Why the tensor ``info`` of ``producer`` must not be rerouted, or ``None`` if it may be.

    Args:
        view: the analysis view.
        producer: the op producing the tensor.
        info: the tensor's :class:`~tflms.graph.view.TensorInfo`.
        uses: every ``(consumer, input index)`` reading it.
        far: the consumers it would be rerouted for.

    Returns:
        A one-line reason (recorded in ``SwapPlan.skipped``), or ``None``.
    """
    node = view.nodes[producer]
    if producer in folded_to_constants(view):
        return "Grappler folds it into a constant (computable from shapes alone): nothing to move"
    if aliases_a_variable(view, producer):
        return "it is a view of a variable read (the variable's buffer): moving it frees nothing"
    if order_sensitive(view, producer) or any(order_sensitive(view, c) for c, _ in uses):
        return (
            "an AddN of 3+ inputs reads or writes it (its float sum order depends on buffer reuse)"
        )
    if pinned(view, producer) or any(pinned(view, c) for c, _ in far):
        return (
            "Grappler rewrites the step differently once it moves (its optimized graph "
            "compared with and without the plan: LMSConfig.check_rewrites)"
        )
    if folds_into_a_consumer(view, producer):
        return (
            "Grappler's arithmetic optimizer folds its producer into its one consumer; a "
            "swap-out would add a consumer and change the float arithmetic"
        )
    for c, i in far:
        cnode = view.nodes[c]
        gradient_loop = kept_list(node, info) and cnode["type"] in WHILE_TYPES
        if (
            cnode["placement"] != "compute"
            or (cnode["control_flow"] and not gradient_loop)
            or (cnode["tflms"] and cnode["tflms"] not in CLONE_KINDS)  # a clone may read a swap-in
        ):
            return f"a far consumer ({cnode['type']}) is in control flow or off the compute device"
        if removed_at_run_time(view, c):
            return (
                f"a far consumer ({cnode['type']}) is removed by Grappler before the step runs: "
                "the ops behind it read the tensor as soon as it exists"
            )
        if (
            node["type"] in ARITHMETIC_CHAIN
            and cnode["type"] in ARITHMETIC_CHAIN
            and len({u for u, _ in uses}) == 1
        ):  # Grappler folds a link only while the producer's output has this one reader
            return (
                f"{node['type']} -> {cnode['type']} may be folded by Grappler's arithmetic "
                "optimizer; an extra consumer would change its float rounding"
            )
        if info.index and cnode["type"] in NAME_SENSITIVE:
            return (
                f"a far consumer ({cnode['type']}) of output {info.index} is commutative: Grappler "
                "would reorder its renamed input and change float results"
            )
        if CPU_PAIRED_INPUTS.get(cnode["type"]) == i and compute_device_type(view, cnode) == "CPU":
            return (
                f"on CPU, oneDNN pairs the forward op with {cnode['type']} through a workspace; "
                "rerouting would change how ties are broken"
            )
    return None
