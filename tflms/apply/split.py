"""Apply a split plan: run ops too large for any swap plan on row chunks (see :mod:`tflms.plan.splits`).

For a ``SparseSoftmaxCrossEntropyWithLogits`` op ``L`` with logits ``[rows, V]``
and ``k`` chunks, the rewrite adds, under the name scope ``L-split/``:

* ``rows`` (``Shape`` of the labels), ``block`` (``rows // (k * ALIGN)``) and
  the inner boundaries ``bound_i = block * i * ALIGN``: computed in the graph,
  so a last batch of another size is cut correctly too;
* per chunk ``i``: ``logits_i`` and ``labels_i`` (``StridedSlice`` of rows
  ``bound_i:bound_i+1``; chunk ``i + 1`` waits by control edges for chunk
  ``i``'s op and for the copy to the host of chunk ``i - 1``, so at most two
  chunks of backprop are on the device, however slow the link), ``loss_i`` (the
  op on the chunk) and ``backprop_i_host`` (an ``Identity`` on the host
  device: the chunk's backprop goes to the host as soon as it is made);
* ``loss`` (``ConcatV2`` of the chunks' losses, on ``L``'s device),
  ``backprop_host`` (``ConcatV2`` of the host copies, on the host) and
  ``backprop`` (an ``Identity`` on ``L``'s device reading it, started by the
  split's triggers: the readers' other inputs, made at the start of the
  backward pass).

The readers of ``L``'s outputs then read ``loss`` and ``backprop``; ``L`` itself
is left without readers (TensorFlow prunes it from the function it runs; the
view drops it, :func:`finish_view`). Every row is computed by the same kernel as
before, so the results are bitwise identical (boundaries are aligned, see
:data:`tflms.plan.splits.ALIGN`).

Example:
    >>> import tflms
    >>> from tflms import zoo
    >>> from tflms.plan.splits import plan_splits
    >>> model = zoo.gpt2(vocab=64, seq=16, dim=8, heads=2, layers=1)
    >>> graph = tflms.train_step_graph(model, batch_size=4)
    >>> splits = plan_splits(tflms.build_view(graph), 1024)
    >>> split_graph(graph, splits)
    35
    >>> view = finish_view(tflms.build_view(graph), splits)
    >>> splits[0].op in view
    False
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import networkx as nx
import tensorflow as tf

from tflms.apply.graph_editor import GraphEditor
from tflms.errors import ValidationError
from tflms.graph.view import assign_levels
from tflms.plan.splits import ALIGN, Defer, Split

__all__ = ["split_graph", "finish_view", "split_names"]


def split_names(split: Split) -> dict[str, tuple[int, int]]:
    """The ops the rewrite adds for ``split`` whose outputs scale with the rows.

    Args:
        split: one entry of a split plan.

    Returns:
        ``{op name: (first row, last row)}``: the rows each op's output holds
        at the analysed batch size (the view sizes them by it).
    """
    prefix, bounds = f"{split.op}-split", split.boundaries()
    names = {}
    for i in range(split.chunks):
        rows = (bounds[i], bounds[i + 1])
        for part in ("logits", "labels", "loss", "backprop"):
            names[f"{prefix}/{part}_{i}"] = rows
        names[f"{prefix}/backprop_{i}_host"] = rows
    for part in ("loss", "backprop_host", "backprop"):
        names[f"{prefix}/{part}"] = (0, split.rows)
    return names


def split_graph(
    graph: tf.Graph,
    splits: Sequence[Split],
    host_device: str = "/device:CPU:0",
    deferrals: Sequence[Defer] = (),
) -> int:
    """Rewrite ``graph`` in place so that each op of ``splits`` runs on row chunks.

    Args:
        graph: the ``tf.Graph``/``FuncGraph`` the splits were planned on (for a
            ``FuncGraph``: before tracing ends).
        splits: from :func:`tflms.plan.splits.plan_splits`.
        host_device: where the chunks' backprop tensors wait for the backward pass.
        deferrals: from :func:`tflms.plan.splits.plan_deferrals`: a control
            edge from each trigger into its generator.
        deferrals: from :func:`tflms.plan.splits.plan_deferrals`: a control
            edge from each trigger into its generator.

    Returns:
        The number of ops inserted.

    Raises:
        ValidationError: an op of ``splits`` is missing, is not of its planned
            type, or a name the rewrite needs is taken.
    """
    editor = GraphEditor(graph)
    before = len(graph.get_operations())
    with editor.editing():
        for split in splits:
            _split_one(graph, editor, split, host_device)
        for defer in deferrals:
            editor.add_control(defer.trigger, defer.op)
    return len(graph.get_operations()) - before


def _split_one(graph, editor: GraphEditor, split: Split, host: str) -> None:
    try:
        op = graph.get_operation_by_name(split.op)
    except KeyError:
        raise ValidationError(
            f"The split plan names {split.op!r}, which this graph does not have. Plan the "
            "splits on this very graph."
        ) from None
    if op.type != split.op_type:
        raise ValidationError(
            f"{split.op!r} is a {op.type}, the split plan expected a {split.op_type}."
        )
    prefix = f"{split.op}-split"
    taken = [n for n in split_names(split) if editor.has_op(n)]
    if taken:
        raise ValidationError(
            f"Op names the split rewrite needs are taken: {taken[:3]}; the graph was split already?"
        )
    logits, labels = op.inputs[0], op.inputs[1]
    device = op.device
    triggers = [graph.get_operation_by_name(t) for t in split.triggers]

    def placed(dev):
        return graph.device(dev) if dev else contextlib.nullcontext()

    with graph.name_scope(prefix + "/"), placed(device):
        rows = tf.raw_ops.Shape(input=labels, out_type=tf.int32, name="rows")
        block = tf.raw_ops.FloorDiv(
            x=rows, y=tf.constant([split.chunks * ALIGN], tf.int32), name="block"
        )
        bounds = [tf.constant([0], tf.int32, name="bound_0")]
        for i in range(1, split.chunks):
            step = tf.constant([i * ALIGN], tf.int32)
            bounds.append(tf.raw_ops.Mul(x=block, y=step, name=f"bound_{i}"))
        bounds.append(rows)
        one = tf.constant([1], tf.int32, name="stride")
        losses, copies = [], []
        previous: list = []
        for i in range(split.chunks):
            with graph.control_dependencies(previous):
                chunk = tf.raw_ops.StridedSlice(
                    input=logits,
                    begin=bounds[i],
                    end=bounds[i + 1],
                    strides=one,
                    name=f"logits_{i}",
                )
            chunk_labels = tf.raw_ops.StridedSlice(
                input=labels, begin=bounds[i], end=bounds[i + 1], strides=one, name=f"labels_{i}"
            )
            loss, backprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
                features=chunk, labels=chunk_labels, name=f"loss_{i}"
            )
            # both outputs are the op "loss_i"; name the backprop's reader as the others expect
            backprop = tf.raw_ops.Identity(input=backprop, name=f"backprop_{i}")
            with placed(host):
                copies.append(tf.raw_ops.Identity(input=backprop, name=f"backprop_{i}_host"))
            losses.append(loss)
            # the next chunk waits for this one, and for the copy of the one before it:
            # two chunks of backprop on the device at most, however slow the link
            previous = [loss.op, *(c.op for c in copies[-2:-1])]
        axis = tf.constant(0, tf.int32, name="axis")
        loss = tf.raw_ops.ConcatV2(values=losses, axis=axis, name="loss")
        loss.set_shape(op.outputs[0].shape)
        with placed(host):
            whole = tf.raw_ops.ConcatV2(values=copies, axis=axis, name="backprop_host")
        with graph.control_dependencies(triggers):
            backprop = tf.raw_ops.Identity(input=whole, name="backprop")
        backprop.set_shape(op.outputs[1].shape)
    for out, new in ((op.outputs[0], loss), (op.outputs[1], backprop)):
        for reader in list(out.consumers()):
            for index, tensor in enumerate(reader.inputs):
                if tensor is out:
                    editor.reroute(reader.name, index, (new.op.name, new.value_index))
    missing = [n for n in split_names(split) if not editor.has_op(n)]
    if missing:
        raise ValidationError(
            f"The split rewrite of {split.op!r} could not name its ops as planned: {missing[:3]} "
            "(TensorFlow renamed them); the graph holds ops of those names already?"
        )


def finish_view(view: nx.DiGraph, splits: Sequence[Split]) -> nx.DiGraph:
    """The view of a split graph as the step runs: split ops dropped, chunks sized.

    :func:`tflms.build_view` of a split graph still holds each split op (without
    readers; TensorFlow prunes it when it runs the step) and sizes the chunks,
    whose row count is computed at run time, as if their unknown dimension were
    the batch. This drops the split ops and gives each chunk tensor its rows
    at the analysed batch size.

    Args:
        view: ``tflms.build_view`` of the graph :func:`split_graph` rewrote (edited in place).
        splits: the splits it applied.

    Returns:
        ``view``, edited.
    """
    for split in splits:
        if split.op in view and not any(True for _ in view.successors(split.op)):
            view.remove_node(split.op)
        for name, (lo, hi) in split_names(split).items():
            if name not in view:
                continue
            outputs = []
            for info in view.nodes[name]["outputs"]:
                per_row = split.bytes // split.rows if info.rank == 2 else 4
                outputs.append(info._replace(bytes=(hi - lo) * per_row))
            view.nodes[name]["outputs"] = tuple(outputs)
    assign_levels(view)
    return view
