"""Read the models tflms rewrites: SavedModels (TF1 and TF2) and GraphDef files.

:func:`read_model` parses protobufs only - it never loads variables, runs a
session or calls ``tf.saved_model.load`` - and returns a :class:`Model`
whose :meth:`Model.targets` are the graphs tflms may rewrite:

* a GraphDef file (``.pb`` binary, ``.pbtxt`` text): the graph itself;
* a TF1 SavedModel (``tf.compat.v1.saved_model.Builder``): the graph of
  each MetaGraphDef;
* a TF2 SavedModel (``tf.saved_model.save``): every function of the
  library (a traced ``tf.function`` is a ``FunctionDef`` there);

plus, in every case, the functions of the graph's library. A target
*trains* when it computes gradients (ops under a ``gradients``/
``gradient_tape`` scope, or gradient op types such as ``ReluGrad``): only
those are rewritten, every other graph and function is left byte-identical.

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
    ...     _ = tf.nn.relu(x, name="y")
    >>> path = os.path.join(tempfile.mkdtemp(), "graph.pb")
    >>> _ = tf.io.write_graph(g, os.path.dirname(path), "graph.pb", as_text=False)
    >>> model = read_model(path)
    >>> model.format, [(t.name, t.trains) for t in model.targets()]
    ('graph_def', [('graph', False)])
    >>> read_model(path + ".missing")
    Traceback (most recent call last):
    ...
    tflms.errors.ModelNotFoundError: No such file or directory: '...graph.pb.missing'. ...
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf
from google.protobuf import message, text_format
from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from tflms.errors import ModelFormatError, ModelNotFoundError
from tflms.graph.graph_def import function_to_graph_def, graph_from_graph_def
from tflms.graph.view import is_gradient_op
from tflms.saved_model.resource_args import resource_arguments

__all__ = [
    "Model",
    "Target",
    "read_model",
    "gradient_op_count",
    "SAVED_MODEL_PB",
    "SAVED_MODEL_PBTXT",
    "FINGERPRINT_PB",
    "FORMATS",
]

logger = logging.getLogger(__name__)

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"
FINGERPRINT_PB = "fingerprint.pb"
FORMATS = {
    "saved_model_v2": "TF2 SavedModel (tf.saved_model.save)",
    "saved_model_v1": "TF1 SavedModel (tf.compat.v1.saved_model.Builder)",
    "graph_def": "GraphDef file",
}
_EXAMPLE = "e.g. `tflms analyze path/to/saved_model_dir` or `tflms analyze graph.pb`"


def gradient_op_count(nodes) -> int:
    """How many of ``nodes`` compute gradients (by scope or by op type).

    Args:
        nodes: Iterable of ``NodeDef`` (a graph's or a function's nodes).

    Returns:
        The number of nodes under a ``gradients``/``gradient_tape`` scope (or
        a numbered variant) or whose op type is a gradient kernel
        (``...Grad``, ``...GradV3``...); ``StopGradient`` does not count.

    Example:
        >>> from tensorflow.core.framework import node_def_pb2
        >>> nodes = [node_def_pb2.NodeDef(name=n, op=t) for n, t in
        ...          [("relu", "Relu"), ("gradient_tape/ReluGrad", "ReluGrad"), ("gradients_1/mul", "Mul"),
        ...           ("bn_grad", "FusedBatchNormGradV3"), ("stop", "StopGradient")]]
        >>> gradient_op_count(nodes)
        3
    """
    return sum(is_gradient_op(node.name, node.op) for node in nodes)


@dataclass
class Target:
    """One graph of a model: a GraphDef or a function of a library.

    Attributes:
        name: the function name, ``"graph"`` for a GraphDef file, or
            ``"meta_graph[i]"`` for the graph of a MetaGraphDef.
        kind: ``"graph"`` or ``"function"``.
        proto: the ``GraphDef``/``FunctionDef`` inside the model (edits change the model).
        library: the function library the target belongs to.
        resources: ``{argument index: (dtype, shape)}`` of variables behind
            resource arguments (functions only).
        gradient_ops: number of gradient ops (see :func:`gradient_op_count`).
    """

    name: str
    kind: str
    proto: function_pb2.FunctionDef | graph_pb2.GraphDef
    library: function_pb2.FunctionDefLibrary
    resources: dict = field(default_factory=dict)
    gradient_ops: int = 0

    @property
    def trains(self) -> bool:
        """Whether the target computes gradients, i.e. is rewritten."""
        return self.gradient_ops > 0

    @property
    def nodes(self):
        return self.proto.node_def if self.kind == "function" else self.proto.node

    @property
    def unsized_resources(self) -> int:
        """Resource arguments whose variable (hence shape) is unknown."""
        if self.kind != "function":
            return 0
        return sum(
            1
            for i, arg in enumerate(self.proto.signature.input_arg)
            if arg.type == tf.resource.as_datatype_enum and i not in self.resources
        )

    def graph_def(self) -> graph_pb2.GraphDef:
        """The target as a standalone GraphDef (a function's arguments become placeholders)."""
        if self.kind == "function":
            return function_to_graph_def(self.proto, self.library, resources=self.resources)
        return self.proto

    def fetches(self) -> list[str] | None:
        """The nodes a function target runs to (its outputs and control outputs); None for a graph."""
        if self.kind != "function":
            return None
        refs = [*self.proto.ret.values(), *self.proto.control_ret.values()]
        return list(dict.fromkeys(ref.split(":")[0] for ref in refs))

    def import_graph(self) -> tf.Graph:
        """A ``tf.Graph`` for analysis (shape inference only; nothing runs)."""
        return graph_from_graph_def(self.graph_def(), where=f"{self.kind} {self.name!r}")


@dataclass
class Model:
    """A parsed model file or directory.

    Attributes:
        path: where it was read from.
        format: a key of :data:`FORMATS`.
        message: the ``SavedModel`` or ``GraphDef`` message.
        text: whether the file was text format (``.pbtxt``).
        had_fingerprint: a SavedModel directory held ``fingerprint.pb``.
    """

    path: Path
    format: str
    message: saved_model_pb2.SavedModel | graph_pb2.GraphDef
    text: bool = False
    had_fingerprint: bool = False

    @property
    def is_saved_model(self) -> bool:
        return self.format != "graph_def"

    @property
    def proto_file(self) -> Path:
        """The protobuf file: ``saved_model.pb(txt)`` of a SavedModel, else the file itself."""
        if not self.is_saved_model:
            return self.path
        return self.path / (SAVED_MODEL_PBTXT if self.text else SAVED_MODEL_PB)

    def describe(self) -> str:
        return FORMATS[self.format]

    def copy(self) -> Model:
        """A deep copy whose protobufs can be edited without touching this one."""
        return Model(
            self.path, self.format, copy.deepcopy(self.message), self.text, self.had_fingerprint
        )

    def targets(self) -> list[Target]:
        """Every graph and function of the model, graphs first."""
        if not self.is_saved_model:
            return _graph_targets("graph", self.message, {})
        found = []
        many = len(self.message.meta_graphs) > 1
        for i, meta_graph in enumerate(self.message.meta_graphs):
            resources = resource_arguments(meta_graph)
            label = f"meta_graph[{i}]"
            graph_targets = _graph_targets(label, meta_graph.graph_def, resources)
            if many:  # function names repeat across MetaGraphs: qualify them
                for target in graph_targets[1:]:
                    target.name = f"{label}/{target.name}"
            found.extend(graph_targets)
        return found

    def serialize(self, *, text: bool | None = None) -> bytes:
        """The model's protobuf file contents, as text or binary (default: as it was read).

        Args:
            text: True for protobuf text format, False for binary; None keeps the
                format the model was read in.

        Returns:
            The encoded protobuf (binary output is deterministic).
        """
        if self.text if text is None else text:
            return text_format.MessageToString(self.message).encode()
        return self.message.SerializeToString(deterministic=True)


def _graph_targets(label: str, graph_def, resources) -> list[Target]:
    library = graph_def.library
    targets = [Target(label, "graph", graph_def, library, {}, gradient_op_count(graph_def.node))]
    for fdef in library.function:
        name = fdef.signature.name
        targets.append(
            Target(
                name,
                "function",
                fdef,
                library,
                resources.get(name, {}),
                gradient_op_count(fdef.node_def),
            )
        )
    return targets


# --------------------------------------------------------------------------- reading


def read_model(path) -> Model:
    """Parse the model at ``path`` (a SavedModel directory or a GraphDef file).

    Args:
        path: A SavedModel directory, or a GraphDef file (``.pb`` binary,
            ``.pbtxt``/``.txt`` text); a ``str`` or ``Path``.

    Returns:
        The parsed model, with the path and the format it was read in.

    Raises:
        ModelNotFoundError: ``path`` does not exist or cannot be read.
        ModelFormatError: it is not a SavedModel or a GraphDef, or it is corrupt.
    """
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(
            f"No such file or directory: '{path}'. Pass a SavedModel directory or a "
            f"GraphDef file, {_EXAMPLE}."
        )
    if path.is_dir():
        return _read_saved_model(path)
    if path.name in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT):
        raise ModelFormatError(
            f"'{path}' is the protobuf of a SavedModel; pass its directory, "
            f"e.g. `tflms analyze {path.parent}`."
        )
    text = path.suffix in (".pbtxt", ".txt")
    graph_def = _parse(graph_pb2.GraphDef(), _read_bytes(path), text, path, "a GraphDef")
    if not graph_def.node:
        raise ModelFormatError(
            f"'{path}' holds no graph nodes: it is empty or not a GraphDef. tflms reads "
            f"SavedModel directories and GraphDef files, {_EXAMPLE}."
        )
    logger.debug("read GraphDef %s: %d nodes", path, len(graph_def.node))
    return Model(path, "graph_def", graph_def, text)


def _read_saved_model(path: Path) -> Model:
    binary, text_file = path / SAVED_MODEL_PB, path / SAVED_MODEL_PBTXT
    proto_file = binary if binary.exists() else text_file if text_file.exists() else None
    if proto_file is None:
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:8]
        nested = [e for e in entries if e.endswith("/") and (path / e / SAVED_MODEL_PB).exists()]
        hint = (
            f" It contains a SavedModel in {nested[0]!r}: pass that directory."
            if nested
            else f" It contains {entries or 'nothing'}."
        )
        raise ModelFormatError(
            f"'{path}' is a directory but not a SavedModel: it has no {SAVED_MODEL_PB}.{hint} "
            f"Pass a directory written by tf.saved_model.save or a SavedModel Builder, {_EXAMPLE}."
        )
    text = proto_file == text_file
    saved_model = _parse(
        saved_model_pb2.SavedModel(), _read_bytes(proto_file), text, proto_file, "a SavedModel"
    )
    if not saved_model.meta_graphs or not any(m.graph_def.node for m in saved_model.meta_graphs):
        raise ModelFormatError(
            f"'{proto_file}' parses but holds no MetaGraph with a graph: the file is "
            "truncated or corrupt. Re-export the model or copy it again."
        )
    v2 = len(saved_model.meta_graphs) == 1 and saved_model.meta_graphs[0].HasField(
        "object_graph_def"
    )
    logger.debug("read SavedModel %s: %d MetaGraphs", path, len(saved_model.meta_graphs))
    return Model(
        path,
        "saved_model_v2" if v2 else "saved_model_v1",
        saved_model,
        text,
        (path / FINGERPRINT_PB).is_file(),
    )


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except IsADirectoryError as err:
        raise ModelNotFoundError(
            f"'{path}' is a directory where tflms expects a file; the model is damaged. "
            "Re-export it or copy it again."
        ) from err
    except PermissionError as err:
        raise ModelNotFoundError(
            f"Permission denied reading '{path}'. Make it readable (chmod +r) or run tflms "
            "as a user who can read it."
        ) from err
    except OSError as err:
        raise ModelNotFoundError(f"Cannot read '{path}': {err.strerror or err}.") from err


def _parse(msg, data: bytes, text: bool, path: Path, what: str):
    try:
        if text:
            text_format.Parse(data.decode("utf-8"), msg)
        else:
            msg.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError) as err:
        raise ModelFormatError(
            f"'{path}' ({len(data)} bytes) is not {what} or is corrupt: {_first_line(err)}. "
            "Re-export the model or copy it again (an interrupted copy truncates it)."
        ) from err
    return msg


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
