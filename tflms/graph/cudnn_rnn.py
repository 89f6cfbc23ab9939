"""Analysis: the reserve space of cuDNN's fused RNN ops, which their static shape does not give.

On a GPU, Keras runs an ``LSTM``/``GRU`` with default activations as one
``CudnnRNN``/``CudnnRNNV2``/``CudnnRNNV3`` op instead of a ``While`` loop. In
training the op keeps what the backward pass needs from every time step in
its ``reserve_space`` output, an opaque byte buffer of unknown static shape:
to the view it would be one element, and the RNN's activations would be
missing from every simulated peak.

:func:`reserve_space_bytes` estimates it as the per-step tensors the same
recurrence keeps when it runs as a loop (:mod:`tflms.graph.loops` measures
those exactly): per layer, direction and time step, the gate activations and
the two states of an LSTM (4 + 2 vectors of the hidden size), of a GRU
(3 + 2), of a plain RNN (1 + 2). It is an estimate: cuDNN documents the size
only through ``cudnnGetRNNTempSpaceSizes`` at run time, and these machines
have no GPU to measure it on. A view records every op sized this way in
``view.graph["estimated_reserve_space"]``.

Example:
    >>> import tensorflow as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [256, 32, 64])  # time-major
    ...     h = tf.zeros([1, 32, 256])
    ...     out = tf.raw_ops.CudnnRNNV3(input=x, input_h=h, input_c=h, params=tf.zeros([8]),
    ...                                 sequence_lengths=tf.fill([32], 256), is_training=True)
    >>> reserve_space_bytes(out[0].op, batch=None)  # 256 steps x 32 x 256 units x 6 x 4 bytes
    50331648
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["CUDNN_RNN_TYPES", "RESERVE_SPACE_INDEX", "reserve_space_bytes"]

CUDNN_RNN_TYPES = frozenset({"CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"})
RESERVE_SPACE_INDEX = 3
"""Output index of ``reserve_space`` (after ``output``, ``output_h``, ``output_c``)."""

_GATES = {"lstm": 4, "gru": 3, "rnn_relu": 1, "rnn_tanh": 1}


def reserve_space_bytes(op: tf.Operation, batch: int | None) -> int | None:
    """Estimated bytes of ``op``'s reserve space in training (see the module docstring).

    Args:
        op: a ``CudnnRNN``, ``CudnnRNNV2`` or ``CudnnRNNV3`` op.
        batch: the batch size for an open batch dimension.

    Returns:
        The estimate; 0 for an op not in training mode; ``None`` when the
        input's or the state's shape is not known.
    """
    if not op.get_attr("is_training"):
        return 0
    steps_batch = op.inputs[0].shape  # (time, batch, features), or batch-major in V3
    state = op.inputs[1].shape  # (layers * directions, batch, hidden)
    if steps_batch.rank != 3 or state.rank != 3:
        return None
    time_major = op.get_attr("time_major") if op.type == "CudnnRNNV3" else True
    steps, n = (steps_batch[0], steps_batch[1]) if time_major else (steps_batch[1], steps_batch[0])
    n = n if n is not None else batch
    layers_dirs, hidden = state[0], state[2]
    if None in (steps, n, layers_dirs, hidden):
        return None
    mode = op.get_attr("rnn_mode")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    per_step = (_GATES.get(mode, 4) + 2) * hidden
    return steps * n * layers_dirs * per_step * op.inputs[0].dtype.size
