"""Run engine collectives on ``tf.Tensor``s, eagerly or as ordinary graph ops, in program order.

Eagerly, tensors become numpy arrays, the engine runs, and the results become
tensors again; an engine error is re-raised as its TensorFlow-typed class
(:func:`ddl_tf.tensorflow.tf_errors.typed`). Inside ``tf.function`` (Keras ``fit``,
custom loops) and ``tf.compat.v1`` graphs each collective is one
``tf.numpy_function`` op (a plain stateful ``PyFunc`` node that tolerates
extra control inputs, e.g. from graph rewriters such as tflms).

Copies. A collective's data is copied once on its way through: into the
engine's fusion buffer, which MPI reduces in place. Host tensors are read in
place (eagerly through the buffer protocol; ``numpy_function`` passes its
inputs as views of TensorFlow's memory), and results, 64-byte aligned
(:mod:`ddl_tf.core.numerics.aligned`), become tensors without a copy (eagerly through
DLPack; ``numpy_function`` adopts aligned outputs itself).

Ordering. TensorFlow may run independent graph ops in any order, and in a
different order on each rank; two collectives issued in different orders
deadlock MPI. So every collective op created in a graph gets a control
dependency on the previous collective created in the same graph: execution
order equals program order on every rank, independent of TensorFlow's own
automatic control dependencies (which skip while loops and ``tf.compat.v1``
graphs). :func:`collective_ops` lists a graph's chain (tests use it).

Ops that by design always run alone in their session run (the broadcast of
``BroadcastGlobalVariablesHook`` right after the session starts) are built
inside :func:`outside_chain`: they neither wait for nor hold up the chain, so
running them does not run the training step's collectives.

The price is in ``tf.compat.v1`` sessions: a control dependency makes a
session run every earlier collective of the graph (and what they consume)
again when it runs a later one. Horovod matches collectives by name and has
no such chain; ddl_tf keeps program order instead, because a session run
that fetches several collectives must run them in the same order on every
rank. Build and run one op at a time in a fresh graph (or use
``tf.function``) to avoid the re-runs.

Errors inside graphs. TensorFlow gives a Python exception raised by an op a
type from its base class only (``ValueError`` -> ``InvalidArgumentError``,
``NotImplementedError`` -> ``UnimplementedError``, else ``UnknownError``).
A mismatch between ranks must surface as ``FailedPreconditionError``, as in
Horovod, so in graphs the op reports it as a status output instead: the
details are logged on every rank (logger ``ddl_tf.tensorflow.bridge``), and a gate op
fails the step with ``FailedPreconditionError`` before anything consumes the
outputs. The next collective waits for the gate, so after a failure no rank
starts another collective of that step.

XLA cannot compile Python ops, so a collective inside ``jit_compile=True``
raises :class:`~ddl_tf.errors.ConfigError` at trace time naming the fix.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from ddl_tf.core import basics
from ddl_tf.core.numerics.aligned import is_aligned
from ddl_tf.errors import CollectiveMismatchError, ConfigError, DDLError
from ddl_tf.tensorflow import tf_errors

__all__ = ["run", "refuse", "op_name", "collective_ops", "outside_chain"]

logger = logging.getLogger(__name__)

try:  # private but stable since TF 1.x; only used to give a clear error under XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - depends on the TF build

    def _in_xla(graph) -> bool:
        return False


_chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_counter = iter(range(1 << 62))
_unchained = threading.local()


@contextlib.contextmanager
def outside_chain() -> Iterator[None]:
    """Build collectives that are not ordered against the graph's other collectives.

    Only for ops that always run alone in a session run (e.g. a broadcast run
    once right after the session is created): they do not depend on earlier
    collectives, and later ones do not depend on them.
    """
    previous = getattr(_unchained, "active", False)
    _unchained.active = True
    try:
        yield
    finally:
        _unchained.active = previous


def op_name(kind: str, name: str | None) -> str:
    """Graph op name for collective ``kind`` (Horovod style: ``DDLAllreduce_<name or n>``).

    Args:
        kind: Collective kind, e.g. ``"Allreduce"``.
        name: The user's name; None takes a process-wide counter. ``/`` and ``:``
            become ``_``.

    Returns:
        A valid TensorFlow op name.
    """
    return f"DDL{kind}_{name or next(_counter)}".replace("/", "_").replace(":", "_")


def _to_numpy(value) -> np.ndarray:
    """``value``'s data as a numpy array, without a copy where TensorFlow allows it.

    A host tensor's memory is read in place (a read-only view; the engine never
    writes into its inputs); a device tensor is copied to the host.
    """
    if isinstance(value, np.ndarray):
        return value
    tensor = tf.convert_to_tensor(value)
    try:
        return np.asarray(memoryview(tensor))
    except (ValueError, TypeError, BufferError):  # bfloat16 has no buffer-protocol format
        return np.asarray(tensor.numpy())


def _to_tensor(array: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """An eager tensor of ``array`` that adopts its memory when it can.

    The engine hands back fresh arrays that nothing else writes to, so a
    64-byte aligned, writable, C-contiguous one becomes a tensor through
    DLPack without a copy (TensorFlow keeps the array alive). Anything else,
    bfloat16 (which DLPack cannot describe) included, is copied.
    """
    dtype = tf.as_dtype(dtype)
    if (
        array.dtype == dtype.as_numpy_dtype
        and array.flags.writeable
        and array.flags.c_contiguous
        and is_aligned(array)
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, ValueError):
            pass
    return tf.convert_to_tensor(array, dtype=dtype)


def run(
    fn: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence,
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[tf.TensorShape | None],
    *,
    name: str,
) -> list[tf.Tensor]:
    """Call ``fn(*numpy_inputs) -> numpy_outputs`` as a collective on tensors.

    Args:
        fn: Runs the engine collective; must return one array per ``out_dtypes``.
        inputs: Tensors (or tensor-like values).
        out_dtypes: Dtypes of the outputs.
        out_shapes: Static shapes to set on the graph outputs (None = unknown).
        name: Op name (graph mode).

    Returns:
        Output tensors.

    Raises:
        ConfigError: Called inside an XLA-compiled function.
        DDLError: Eagerly, the engine's error, TensorFlow-typed where Horovod's is.
    """
    if tf.executing_eagerly():
        try:
            outputs = fn(*[_to_numpy(x) for x in inputs])
        except DDLError as err:
            raise tf_errors.typed(err).with_traceback(err.__traceback__) from None
        tensors = [_to_tensor(o, d) for o, d in zip(outputs, out_dtypes, strict=True)]
        device = next((x.device for x in inputs if isinstance(x, tf.Tensor)), "")
        if device and "CPU" not in tf.DeviceSpec.from_string(device).device_type.upper():
            with tf.device(device):  # results go back where the inputs were, as in Horovod
                tensors = [tf.identity(t) for t in tensors]
        return tensors
    graph = tf.compat.v1.get_default_graph()
    if _in_xla(graph):
        raise ConfigError(
            f"ddl_tf collective {name!r} is inside an XLA-compiled function, which cannot call "
            "MPI. Received jit_compile=True; compile the model with model.compile(..., "
            "jit_compile=False) or decorate the step with tf.function(jit_compile=False)."
        )
    chain = _chains.setdefault(graph, [])  # (collective, gate) op *names*: ops keep graphs alive
    alone = getattr(_unchained, "active", False)
    previous = [graph.get_operation_by_name(n) for n in chain[-1]] if chain and not alone else []
    with tf.control_dependencies(previous):
        raw = tf.numpy_function(
            _reporting(fn, name, out_dtypes, out_shapes),
            [tf.convert_to_tensor(x) for x in inputs],
            [*out_dtypes, tf.int32],
            stateful=True,
            name=name,
        )
    collective, status = raw[0].op, raw[-1]
    outputs = _gate(status, list(raw[:-1]), name)
    for tensor, shape in zip(outputs, out_shapes, strict=True):
        if shape is not None:
            tensor.set_shape(shape)
    if not alone:
        chain.append((collective.name, (outputs[0].op if outputs else status.op).name))
    return outputs


def _reporting(fn, name: str, out_dtypes, out_shapes):
    """``fn`` with a status output: 1 (and placeholder outputs) after a mismatch."""

    def call(*arrays):
        try:
            return [*fn(*arrays), np.int32(0)]
        except CollectiveMismatchError as err:
            logger.error("ddl_tf collective %s failed on every rank:\n%s", name, err)
            return [*_placeholders(out_dtypes, out_shapes), np.int32(1)]

    return call


def _placeholders(out_dtypes, out_shapes) -> list[np.ndarray]:
    arrays = []
    for dtype, shape in zip(out_dtypes, out_shapes, strict=True):
        shape = tf.TensorShape(shape)
        dims = (
            [d if d is not None else 0 for d in shape.as_list()] if shape.rank is not None else []
        )
        arrays.append(np.zeros(dims, tf.as_dtype(dtype).as_numpy_dtype))
    return arrays


def _gate(status: tf.Tensor, outputs: list[tf.Tensor], name: str) -> list[tf.Tensor]:
    """Outputs that exist only if ``status`` is 0; else the step fails (FailedPreconditionError)."""

    def fail():
        # The one TensorFlow op that fails with FAILED_PRECONDITION and a text of our choice:
        # reading a variable that does not exist. Its name carries the message.
        handle = tf.raw_ops.VarHandleOp(
            dtype=tf.int32,
            shape=[],
            shared_name=(
                f"ddl_tf CollectiveMismatchError in {name}: ranks issued different collectives "
                "(names, shapes, dtypes, ops or order differ); every rank logged the details "
                "(logger ddl_tf.tensorflow.bridge). Make every rank issue the same collectives in the same "
                "order"
            ),
        )
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)

    check = tf.cond(status > 0, fail, lambda: tf.identity(status))
    if not outputs:
        return outputs
    with tf.control_dependencies([check]):
        return list(tf.raw_ops.IdentityN(input=outputs, name=f"{name}_gate"))


def refuse(kind: str, error: DDLError, *, name: str | None = None, engine=None) -> None:
    """Raise ``error`` for collective ``kind`` without leaving the other ranks waiting.

    Eagerly the other ranks are inside (or about to enter) the collective, so
    this rank negotiates a refusal and every rank raises ``error``'s class
    (TensorFlow-typed). While tracing a graph nothing runs yet: ``error`` is
    raised at once, as Horovod raises its argument errors when building the op.

    Args:
        kind: Collective kind, e.g. ``"Allreduce"``.
        error: The error to raise on every rank.
        name: The collective's name, as the other ranks know it.
        engine: The engine of the collective's process set; None: the job's.

    Raises:
        DDLError: Always.
    """
    if tf.executing_eagerly() and basics.is_initialized():
        try:
            (engine or basics.engine()).refuse(kind, error, name=name)
        except DDLError as err:
            raise tf_errors.typed(err).with_traceback(err.__traceback__) from None
    raise error


def collective_ops(graph: tf.Graph) -> list[tf.Operation]:
    """The collective ops created in ``graph``, in creation (= execution) order.

    Args:
        graph: A graph (e.g. a ``tf.function``'s ``concrete_function.graph``).

    Returns:
        The ops; empty for a graph without collectives.
    """
    return [graph.get_operation_by_name(names[0]) for names in _chains.get(graph, [])]
