"""Run engine collectives on ``tf.Tensor``s, eagerly or as ordinary graph ops, in program order.

Eagerly, tensors become numpy arrays, the engine runs, and the results become
tensors again. Inside ``tf.function`` (Keras ``fit``, custom loops) each
collective is one ``tf.numpy_function`` op (a plain stateful ``PyFunc`` node
that tolerates extra control inputs, e.g. from graph rewriters such as tflms).

Ordering. TensorFlow may run independent graph ops in any order, and in a
different order on each rank; two collectives issued in different orders
deadlock MPI. So every collective op created in a graph gets a control
dependency on the previous collective created in the same graph: execution
order equals program order on every rank, independent of TensorFlow's own
automatic control dependencies (which skip while loops and ``tf.compat.v1``
graphs). :func:`collective_ops` lists a graph's chain (tests use it).

XLA cannot compile Python ops, so a collective inside ``jit_compile=True``
raises :class:`~ddl_tf.errors.ConfigError` at trace time naming the fix.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from ddl_tf.errors import ConfigError

__all__ = ["run", "collective_ops"]

try:  # private but stable since TF 1.x; only used to give a clear error under XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - depends on the TF build

    def _in_xla(graph) -> bool:
        return False


_chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _to_numpy(value) -> np.ndarray:
    return np.asarray(tf.convert_to_tensor(value).numpy())


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
    """
    if tf.executing_eagerly():
        outputs = fn(*[_to_numpy(x) for x in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, out_dtypes, strict=True)]
    graph = tf.compat.v1.get_default_graph()
    if _in_xla(graph):
        raise ConfigError(
            f"ddl_tf collective {name!r} is inside an XLA-compiled function, which cannot call "
            "MPI. Received jit_compile=True; compile the model with model.compile(..., "
            "jit_compile=False) or decorate the step with tf.function(jit_compile=False)."
        )
    chain = _chains.setdefault(graph, [])  # op *names*: ops would keep the graph alive
    previous = [graph.get_operation_by_name(chain[-1])] if chain else []
    with tf.control_dependencies(previous):
        outputs = tf.numpy_function(
            fn,
            [tf.convert_to_tensor(x) for x in inputs],
            list(out_dtypes),
            stateful=True,
            name=name,
        )
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    for tensor, shape in zip(outputs, out_shapes, strict=True):
        if shape is not None:
            tensor.set_shape(shape)
    chain.append(outputs[0].op.name)
    return outputs


def collective_ops(graph: tf.Graph) -> list[tf.Operation]:
    """The collective ops created in ``graph``, in creation (= execution) order."""
    return [graph.get_operation_by_name(name) for name in _chains.get(graph, [])]
