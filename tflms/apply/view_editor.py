"""Editor for the networkx analysis view (works on a copy, or in place with an undo).

The rewritten view has exactly the nodes, edges and attributes that
:func:`tflms.build_view` would produce from the rewritten TensorFlow graph,
so the simulator and :func:`tflms.validate` can work on either.

Copying a 15,000-op view takes longer than rewriting it, and the auto-tuner
simulates dozens of plans of one view: with ``in_place=True`` the editor
rewrites the view it is given and keeps a journal - the nodes it added and,
for every original op whose outgoing edges it changed, those edges as they
were - so that :meth:`ViewEditor.undo` restores the view: the same nodes,
edges and attributes, each op's successors in their original order (what
:func:`~tflms.simulation.schedule.compile_view` iterates). Predecessor
dicts may come back in another order; nothing that reads a view depends on
it (lookups and sorted walks only).
"""

from __future__ import annotations

import contextlib

import networkx as nx

from tflms.graph.view import TensorInfo, assign_levels
from tflms.utils.devices import DeviceMatcher

__all__ = ["ViewEditor"]


class ViewEditor:
    """Applies swap-plan edits to a copy of an analysis view, or to the view itself.

    Args:
        view: The analysis view.
        host_device: Where swap-outs go.
        compute_device: The device of the compute ops (None: any accelerator).
        in_place: Edit ``view`` itself and journal the edits for :meth:`undo`
            (see the module docstring); False edits a copy.
    """

    def __init__(
        self,
        view: nx.DiGraph,
        *,
        host_device: str,
        compute_device: str | None = None,
        in_place: bool = False,
    ):
        self.view = view if in_place else view.copy()
        self.host_device = host_device
        self._matcher = DeviceMatcher(compute=compute_device, host=host_device)
        self._in_place = in_place
        self._added: dict[str, None] = {}  # nodes this editor inserted, in order
        self._original_out: dict[str, list[tuple[str, dict]]] = {}  # op -> its edges as they were

    def _touch(self, src: str, dst: str) -> None:
        """Journal ``src``'s outgoing edges before an edit of ``src -> dst`` (in place only).

        An edge into an inserted node needs no journal: it goes with the node.
        """
        if not self._in_place or src in self._original_out:
            return
        if src in self._added or dst in self._added:
            return
        self._original_out[src] = [(v, dict(data)) for v, data in self.view.succ[src].items()]

    def undo(self) -> None:
        """Restore the view edited in place (see the module docstring).

        Raises:
            RuntimeError: the editor works on a copy (there is nothing to undo).
        """
        if not self._in_place:
            raise RuntimeError("ViewEditor.undo: this editor edited a copy, not the view.")
        view = self.view
        view.remove_nodes_from(reversed(list(self._added)))
        for src, edges in self._original_out.items():
            view.remove_edges_from([(src, dst) for dst in list(view.succ[src])])
            # edges into inserted nodes may be in the journal (added before it): they went with them
            view.add_edges_from((src, dst, data) for dst, data in edges if dst not in self._added)
        self._added.clear()
        self._original_out.clear()

    def editing(self):
        """Context around all edits of one plan: nothing to set up for a view.

        Returns:
            ``contextlib.nullcontext()``.
        """
        return contextlib.nullcontext()

    def swap_ops(self) -> list[str]:
        """Names of the nodes tflms inserted (swap ops and recompute clones).

        Returns:
            The nodes whose ``tflms`` attribute is set.
        """
        return [n for n, d in self.view.nodes(data=True) if d.get("tflms")]

    def missing(self, names: set[str]) -> list[str]:
        """Which of ``names`` are not ops of the graph (see ``Editor.missing``).

        Args:
            names: Op names the plan refers to.

        Returns:
            The names the graph has no op for.
        """
        return [n for n in names if n not in self.view]

    def has_op(self, name: str) -> bool:
        """Whether an op called ``name`` exists (see ``Editor.has_op``).

        Args:
            name: Op name to look up.

        Returns:
            True if the graph has an op of that name.
        """
        return name in self.view

    def device_of(self, op: str) -> str:
        """The device string of ``op``.

        Args:
            op: Name of an existing op.

        Returns:
            The device string, ``""`` when the op has none.
        """
        return self.view.nodes[op]["device"]

    def data_inputs(self, op: str) -> list[tuple[str, int]]:
        """``(source op, output index)`` of each data input of ``op``, in input order.

        Args:
            op: Name of an existing op.

        Returns:
            One ``(source op, output index)`` pair per data input.
        """
        found: list[tuple[int, str, int]] = []
        for pred, edge in self.view.pred[op].items():
            found.extend((in_idx, pred, out_idx) for out_idx, in_idx in edge.get("tensors", ()))
        return [(pred, out_idx) for _, pred, out_idx in sorted(found)]

    def add_clone(
        self,
        name: str,
        original: str,
        inputs: list[tuple[str, int]],
        device: str,
        *,
        keep: bool = True,
    ) -> None:
        """A node ``name`` like ``original`` (type, device, outputs), reading ``inputs``.

        Args:
            name: Name of the clone.
            original: Name of the op to copy.
            inputs: ``(op name, output index)`` of each data input, in order.
            device: Where the clone runs; ``""``: the original's device.
            keep: Keep the clone from Grappler (``_grappler_do_not_remove``);
                ``False`` for clones reading gates, which Grappler may fuse.
        """
        node = self.view.nodes[original]
        outputs = tuple(info._replace(name=f"{name}:{info.index}") for info in node["outputs"])
        placed = {"device": device, "placement": self._matcher.placement(device)} if device else {}
        self.view.add_node(
            name,
            **{
                **node,
                **placed,
                "outputs": outputs,
                "tflms": "recompute",
                "recompute_of": original,
            },
        )
        self._added[name] = None
        for in_idx, (src, k) in enumerate(inputs):
            if self.view.has_edge(src, name):
                self.view[src][name]["tensors"].append((k, in_idx))
            else:
                self.view.add_edge(src, name, tensors=[(k, in_idx)], control=False)
        for pred, edge in self.view.pred[original].items():
            if edge.get("control"):
                self.add_control(pred, name)

    def add_identity(self, name: str, source: tuple[str, int], device: str, kind: str) -> None:
        """Insert an Identity ``name`` reading ``source`` on ``device`` (see ``Editor``).

        Args:
            name: Name of the new op.
            source: ``(op name, output index)`` of the tensor it reads.
            device: Device string; ``""`` leaves the op unplaced.
            kind: ``"out"`` (swap-out), ``"in"`` (swap-in), ``"gate"`` or ``"hold"``.
        """
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
        self._added[name] = None
        self.view.add_edge(source[0], name, tensors=[(source[1], 0)], control=False)

    def reroute(self, consumer: str, input_index: int, source: tuple[str, int]) -> None:
        """Make input ``input_index`` of ``consumer`` read ``source`` (see ``Editor.reroute``).

        Args:
            consumer: Name of the op whose input changes.
            input_index: Position of the data input (0-based).
            source: ``(op name, output index)`` of the tensor to read instead.
        """
        for pred in list(self.view.pred[consumer]):
            edge = self.view[pred][consumer]
            kept = [(o, i) for o, i in edge["tensors"] if i != input_index]
            if len(kept) != len(edge["tensors"]):
                self._touch(pred, consumer)
                edge["tensors"] = kept
                if not kept and not edge["control"]:
                    self.view.remove_edge(pred, consumer)
                break
        self._touch(source[0], consumer)
        if self.view.has_edge(source[0], consumer):
            edge = self.view[source[0]][consumer]
            edge["tensors"] = [*edge["tensors"], (source[1], input_index)]
        else:
            self.view.add_edge(
                source[0], consumer, tensors=[(source[1], input_index)], control=False
            )

    def add_control(self, src: str, dst: str) -> None:
        """Add a control edge ``src -> dst`` (see ``Editor.add_control``).

        Args:
            src: Op that must run first.
            dst: Op that gets ``src`` as a control input.
        """
        self._touch(src, dst)
        if self.view.has_edge(src, dst):
            self.view[src][dst]["control"] = True
        else:
            self.view.add_edge(src, dst, tensors=[], control=True)

    def finish(self, *, levels: bool = True) -> nx.DiGraph:
        """Recompute levels and return the rewritten view.

        Args:
            levels: Recompute the levels; ``False`` leaves the copied ones.

        Returns:
            The edited copy of the view (the view given to the constructor is
            unchanged), or the view itself when editing in place.

        Raises:
            ValueError: ``levels`` in place: :meth:`undo` restores edges, not levels.
        """
        if levels and self._in_place:
            raise ValueError("ViewEditor(in_place=True).finish needs levels=False.")
        if levels:
            assign_levels(self.view)
        return self.view
