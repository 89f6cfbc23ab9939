"""Which ops a recomputation may clone, and whether re-running them is worth it.

An op may be cloned when it is stateless, on the compute device, outside
control flow, not a constant/variable/placeholder and its outputs are of a
swappable dtype. Among those, the cost model (:mod:`tflms.cost.ops`) decides:

* *cheap* ops (:func:`cheap`) are not dense kernels and do at most
  :data:`CHEAP_INTENSITY` FLOPs per byte they move - elementwise ops,
  activations, the BatchNorm arithmetic, casts, reshapes, concatenations and
  reductions, whatever their type;
* *dense* ops (convolutions, matmuls; :func:`worth_rerunning`) qualify with
  ``LMSConfig.recompute_dense = r > 0`` when their predicted time is at most
  ``r`` times the time the host link takes to copy their outputs once: what
  a slow link cannot move in time is re-run instead.

Example:
    >>> import networkx as nx
    >>> from tflms.graph.view import TensorInfo
    >>> from tflms.cost.hardware import get_device, get_link
    >>> v = nx.DiGraph()
    >>> def op(name, kind, shape, *ins):
    ...     out = TensorInfo(f"{name}:0", 0, "float32", shape, 4 * shape[0] * shape[1])
    ...     v.add_node(name, type=kind, device="", placement="compute", outputs=(out,),
    ...                control_flow=False, functions=(), stateful=False, tflms=None)
    ...     for i, src in enumerate(ins):
    ...         v.add_edge(src, name, tensors=[(0, i)], control=False)
    >>> op("x", "Relu", (4096, 64)); op("w", "Relu", (64, 1024))
    >>> op("mm", "MatMul", (4096, 1024), "x", "w"); op("act", "Relu", (4096, 1024), "mm")
    >>> device = get_device("V100-16GB")
    >>> cheap(v, "act", device)[0], cheap(v, "mm", device)[0]
    (True, False)
    >>> worth_rerunning(v, "mm", device, get_link("pcie3"), 0.25)[0]
    True
"""

from __future__ import annotations

import networkx as nx

from tflms.cost.hardware import DeviceModel, LinkModel
from tflms.cost.ops import op_cost
from tflms.plan.candidates import NEVER_SWAP_DTYPES, NEVER_SWAP_PRODUCERS

__all__ = ["cheap", "worth_rerunning", "rerun_seconds", "data_inputs", "CHEAP_INTENSITY"]

CHEAP_INTENSITY = 4.0
"""FLOPs per byte moved up to which a (non-dense) op counts as cheap to re-run."""


def data_inputs(view: nx.DiGraph, node: str) -> list[tuple[str, int]]:
    """``(producer, output index)`` of each data input of ``node``, in input order."""
    found: list[tuple[int, str, int]] = []
    for pred, edge in view.pred[node].items():
        found.extend((in_idx, pred, out_idx) for out_idx, in_idx in edge.get("tensors", ()))
    return [(pred, out_idx) for _, pred, out_idx in sorted(found)]


def cheap(view: nx.DiGraph, node: str, device: DeviceModel) -> tuple[bool, float]:
    """Whether ``node`` may be cloned, and its predicted time on ``device``.

    Args:
        view: the analysis view.
        node: the op.
        device: the device model that times it.

    Returns:
        ``(eligible, seconds)``.
    """
    cost = _clonable_cost(view, node, device)
    if cost is None:
        return False, 0.0
    if cost.dense or cost.flops > CHEAP_INTENSITY * max(cost.bytes, 1):
        return False, cost.seconds
    return True, cost.seconds


def worth_rerunning(
    view: nx.DiGraph, node: str, device: DeviceModel, link: LinkModel, ratio: float
) -> tuple[bool, float]:
    """Whether a dense ``node`` (convolution, matmul) is worth re-running over ``link``.

    It is when re-running it takes at most ``ratio`` times as long as copying
    its outputs to the host once: ``ratio`` is ``LMSConfig.recompute_dense``.

    Args:
        view: the analysis view.
        node: the op.
        device: the device model that times it.
        link: the host link a swap of its outputs would use.
        ratio: recompute time / copy time allowed (0 disables).

    Returns:
        ``(eligible, seconds)``.
    """
    cost = _clonable_cost(view, node, device)
    if cost is None or not cost.dense or ratio <= 0:
        return False, 0.0 if cost is None else cost.seconds
    out_bytes = sum(info.bytes for info in view.nodes[node]["outputs"])
    return cost.seconds <= ratio * link.seconds(out_bytes), cost.seconds


def rerun_seconds(view: nx.DiGraph, node: str, device: DeviceModel) -> float | None:
    """The predicted time of re-running ``node`` on ``device``, or ``None`` when it may not be
    cloned at all (stateful, control flow, a function call, off the compute device, an input
    or a constant, references).

    Args:
        view: the analysis view.
        node: the op.
        device: the device model that times it.

    Returns:
        Seconds, or ``None``.
    """
    cost = _clonable_cost(view, node, device)
    return None if cost is None else cost.seconds


def _clonable_cost(view: nx.DiGraph, node: str, device: DeviceModel):
    """The op's predicted cost, or ``None`` when it may not be cloned at all."""
    data = view.nodes[node]
    if (
        data["placement"] != "compute"
        or data["control_flow"]
        or data["tflms"]
        or data["stateful"]
        or data["functions"]
        or data["type"] in NEVER_SWAP_PRODUCERS
        or any(
            info.dtype in NEVER_SWAP_DTYPES - {"int32"} or info.is_ref for info in data["outputs"]
        )
        or not data["outputs"]
    ):
        return None
    ins = [view.nodes[p]["outputs"][k] for p, k in data_inputs(view, node)]
    return op_cost(data["type"], ins, data["outputs"], device)
