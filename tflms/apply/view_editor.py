"""Editor for the networkx analysis view (works on a copy).

The rewritten view has exactly the nodes, edges and attributes that
:func:`tflms.build_view` would produce from the rewritten TensorFlow graph,
so the simulator and :func:`tflms.validate` can work on either.
"""

from __future__ import annotations

import contextlib

import networkx as nx

from tflms.devices import DeviceMatcher
from tflms.graph.view import TensorInfo, assign_levels

__all__ = ["ViewEditor"]


class ViewEditor:
    """Applies swap-plan edits to a copy of an analysis view."""

    def __init__(self, view: nx.DiGraph, *, host_device: str, compute_device: str | None = None):
        self.view = view.copy()
        self.host_device = host_device
        self._matcher = DeviceMatcher(compute=compute_device, host=host_device)

    def editing(self):
        return contextlib.nullcontext()

    def swap_ops(self) -> list[str]:
        return [n for n, d in self.view.nodes(data=True) if d.get("tflms")]

    def missing(self, names: set[str]) -> list[str]:
        return [n for n in names if n not in self.view]

    def has_op(self, name: str) -> bool:
        return name in self.view

    def device_of(self, op: str) -> str:
        """The device string of ``op``."""
        return self.view.nodes[op]["device"]

    def data_inputs(self, op: str) -> list[tuple[str, int]]:
        """``(source op, output index)`` of each data input of ``op``, in input order."""
        found = []
        for pred, edge in self.view.pred[op].items():
            found.extend((in_idx, pred, out_idx) for out_idx, in_idx in edge.get("tensors", ()))
        return [(pred, out_idx) for _, pred, out_idx in sorted(found)]

    def add_clone(self, name: str, original: str, inputs: list[tuple[str, int]]) -> None:
        """A node ``name`` like ``original`` (type, device, outputs), reading ``inputs``."""
        node = self.view.nodes[original]
        outputs = tuple(info._replace(name=f"{name}:{info.index}") for info in node["outputs"])
        self.view.add_node(
            name,
            **{**node, "outputs": outputs, "tflms": "recompute", "recompute_of": original},
        )
        for in_idx, (src, k) in enumerate(inputs):
            if self.view.has_edge(src, name):
                self.view[src][name]["tensors"].append((k, in_idx))
            else:
                self.view.add_edge(src, name, tensors=[(k, in_idx)], control=False)
        for pred, edge in self.view.pred[original].items():
            if edge.get("control"):
                self.add_control(pred, name)

    def add_identity(self, name: str, source: tuple[str, int], device: str, kind: str) -> None:
        src_info = self.view.nodes[source[0]]["outputs"][source[1]]
        info = TensorInfo(
            name=f"{name}:0",
            index=0,
            dtype=src_info.dtype,
            shape=src_info.shape,
            bytes=src_info.bytes,
            is_ref=False,
        )
        self.view.add_node(
            name,
            type="Identity",
            device=device,
            placement="host" if kind == "out" else self._matcher.placement(device),
            outputs=(info,),
            control_flow=False,
            functions=(),
            stateful=False,
            tflms=kind,
        )
        self.view.add_edge(source[0], name, tensors=[(source[1], 0)], control=False)

    def reroute(self, consumer: str, input_index: int, source: tuple[str, int]) -> None:
        for pred in list(self.view.pred[consumer]):
            edge = self.view[pred][consumer]
            kept = [(o, i) for o, i in edge["tensors"] if i != input_index]
            if len(kept) != len(edge["tensors"]):
                edge["tensors"] = kept
                if not kept and not edge["control"]:
                    self.view.remove_edge(pred, consumer)
                break
        if self.view.has_edge(source[0], consumer):
            edge = self.view[source[0]][consumer]
            edge["tensors"] = [*edge["tensors"], (source[1], input_index)]
        else:
            self.view.add_edge(
                source[0], consumer, tensors=[(source[1], input_index)], control=False
            )

    def add_control(self, src: str, dst: str) -> None:
        if self.view.has_edge(src, dst):
            self.view[src][dst]["control"] = True
        else:
            self.view.add_edge(src, dst, tensors=[], control=True)

    def finish(self) -> nx.DiGraph:
        """Recompute levels and return the rewritten view."""
        assign_levels(self.view)
        return self.view
