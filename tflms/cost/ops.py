"""Time model of the simulator: a roofline per op, from FLOPs and bytes moved.

``seconds = kernel_overhead + max(flops / rate, bytes / bandwidth)`` on the
op's :class:`~tflms.cost.hardware.DeviceModel`, where

* ``flops`` is exact for convolutions (2D/3D, depthwise, and both of their
  gradients) and matmuls (``2 * outputs * K``; ``K`` is read off the input
  and output sizes, so transposes need no attributes), and one FLOP per
  output element for the rest;
* ``bytes`` is every input plus every output (optimizer updates also read and
  write their variable and slots in place);
* ``rate`` is the dense (tensor-core) rate for convolutions and matmuls
  (the 16-bit rate for float16/bfloat16), else the vector rate.

Metadata ops cost nothing: a GPU does not launch a kernel for a ``Reshape``,
an ``Identity``, a ``Shape`` or a variable read. Ops whose tensors are all
tiny (scalars, shapes, per-channel statistics) take no time either: the
executor enqueues such a kernel in a few microseconds while the GPU is still
busy with the large ones, so they neither delay the step nor the dispatch of
the next large kernel (which is also how Grappler times them; counting a
launch overhead for them would shift which of two parallel backward branches
runs first, and with it the memory peak). Only sizes are known to
the view, not attributes such as strides, which the formulas above do not
need.

Example:
    >>> from tflms.graph.view import TensorInfo
    >>> from tflms.cost.hardware import get_device
    >>> x = TensorInfo("x:0", 0, "float32", (64, 1024), 64 * 1024 * 4)
    >>> w = TensorInfo("w:0", 0, "float32", (1024, 1024), 1024 * 1024 * 4)
    >>> cost = op_cost("MatMul", [x, w], [x], get_device("V100-16GB"))
    >>> cost.flops == 2 * 64 * 1024 * 1024, cost.dense
    (True, True)
    >>> op_cost("Reshape", [x], [x], get_device("V100-16GB")).seconds  # at least 1 ns
    1e-09
"""

from __future__ import annotations

from dataclasses import dataclass

from tflms.cost.hardware import DeviceModel

__all__ = [
    "OpCost",
    "op_cost",
    "FREE_OPS",
    "ALIAS_OPS",
    "DENSE_OPS",
    "VARIABLE_UPDATES",
    "dtype_size",
    "updates_a_variable",
]

ALIAS_OPS = frozenset(
    {"Identity", "IdentityN", "StopGradient", "Reshape", "Squeeze", "ExpandDims", "Snapshot"}
)
"""Ops whose output shares its input's buffer on a GPU (TensorFlow forwards it)."""

VARIABLE_UPDATES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
"""Ops that write a variable through its handle, besides the ``ResourceApply*`` kernels
(:func:`updates_a_variable`)."""


def updates_a_variable(kind: str) -> bool:
    """Whether an op of type ``kind`` writes the variables whose handles it reads.

    >>> updates_a_variable("AssignSubVariableOp"), updates_a_variable("ResourceApplyAdam")
    (True, True)
    >>> updates_a_variable("ReadVariableOp")
    False
    """
    return kind in VARIABLE_UPDATES or kind.startswith(("ResourceApply", "ResourceSparseApply"))


FREE_OPS = ALIAS_OPS | frozenset(
    {
        "Const",
        "HostConst",
        "Placeholder",
        "PlaceholderV2",
        "PlaceholderWithDefault",
        "_Arg",
        "_Retval",
        "VarHandleOp",
        "ReadVariableOp",
        "VarIsInitializedOp",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "NoOp",
        "BroadcastGradientArgs",
        "ControlTrigger",
        "PreventGradient",
        "Enter",
        "Exit",
        "NextIteration",
        "LoopCond",
        "Switch",
        "Merge",
    }
)
"""Ops that launch no kernel: zero time."""

_CONV = frozenset({"Conv2D", "Conv3D", "FusedConv2DBiasActivation", "_FusedConv2D"})
_CONV_BACKPROP_INPUT = frozenset({"Conv2DBackpropInput", "Conv3DBackpropInputV2"})
_CONV_BACKPROP_FILTER = frozenset({"Conv2DBackpropFilter", "Conv3DBackpropFilterV2"})
_DEPTHWISE = frozenset(
    {
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    }
)
_MATMUL = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul"})
DENSE_OPS = _CONV | _CONV_BACKPROP_INPUT | _CONV_BACKPROP_FILTER | _DEPTHWISE | _MATMUL
"""Ops timed at the dense (tensor-core) rate."""

_TINY_BYTES = 4096
MIN_SECONDS = 1e-9
"""Every op takes at least a nanosecond, as in Grappler's cost model."""
_HALF = frozenset({"float16", "bfloat16", "half"})
_SIZES = {
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
    "double": 8,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "complex64": 8,
    "complex128": 16,
}


@dataclass(frozen=True)
class OpCost:
    """Predicted cost of one op.

    Attributes:
        seconds: predicted run time.
        flops: floating-point operations counted.
        bytes: bytes read and written.
        dense: timed at the dense (tensor-core) rate.
    """

    seconds: float
    flops: float
    bytes: int
    dense: bool = False


def dtype_size(dtype: str) -> int:
    """Bytes per element of a dtype name (4 when unknown).

    Args:
        dtype: A TensorFlow dtype name (``"float32"``, ``"bfloat16"``...).

    Returns:
        The element size in bytes; 4 for a name the table does not know.
    """
    return _SIZES.get(dtype, 4)


def _numel(info) -> int:
    return info.bytes // dtype_size(info.dtype) if info.bytes else 0


def _prod(dims) -> int:
    n = 1
    for d in dims or ():
        n *= 1 if d is None else int(d)
    return n


def _dense_flops(op_type: str, inputs, outputs) -> float:
    out = outputs[0] if outputs else None
    if out is None:
        return 0.0
    n_out = _numel(out)
    if op_type in _MATMUL:
        a = inputs[0] if inputs else None
        if a is None or not n_out or not out.shape:
            return 0.0
        n_cols = out.shape[-1] or 1
        k = _numel(a) * n_cols / n_out
        return 2.0 * n_out * k
    if op_type in _CONV and len(inputs) > 1 and inputs[1].shape:
        return 2.0 * n_out * _prod(inputs[1].shape[:-1])
    if op_type in _CONV_BACKPROP_INPUT and len(inputs) > 2 and inputs[1].shape:
        return 2.0 * _numel(inputs[2]) * _prod(inputs[1].shape[:-1])
    if op_type in _CONV_BACKPROP_FILTER and len(inputs) > 2 and out.shape:
        return 2.0 * _numel(inputs[2]) * _prod(out.shape[:-1])
    if op_type in _DEPTHWISE and len(inputs) > 1:
        filt = inputs[1].shape if op_type != "DepthwiseConv2dNativeBackpropFilter" else out.shape
        window = _prod(filt[:2]) if filt and len(filt) >= 2 else 9
        biggest = max(_numel(t) for t in (*inputs, out))
        return 2.0 * biggest * window
    return 0.0


def op_cost(op_type: str, inputs, outputs, device: DeviceModel) -> OpCost:
    """Predicted cost of one op on ``device``.

    Args:
        op_type: the TensorFlow op type.
        inputs: :class:`~tflms.graph.view.TensorInfo` of the data inputs.
        outputs: :class:`~tflms.graph.view.TensorInfo` of the outputs.
        device: where it runs.

    Returns:
        An :class:`OpCost`.
    """
    if op_type in FREE_OPS:
        return OpCost(MIN_SECONDS, 0.0, 0)
    in_bytes = sum(t.bytes for t in inputs)
    out_bytes = sum(t.bytes for t in outputs)
    moved = in_bytes + out_bytes
    if op_type.startswith("ResourceApply") or op_type.startswith("ResourceSparseApply"):
        handles = sum(1 for t in inputs if t.dtype == "resource")
        grad = max((t.bytes for t in inputs), default=0)
        moved += 2 * grad * handles
    elif op_type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
        moved += in_bytes  # read-modify-write of the variable
    if max((t.bytes for t in (*inputs, *outputs)), default=0) < _TINY_BYTES:
        return OpCost(MIN_SECONDS, 0.0, moved)
    bandwidth = device.memory_bandwidth * device.memory_efficiency
    if op_type in DENSE_OPS:
        flops = _dense_flops(op_type, inputs, outputs)
        dtype = outputs[0].dtype if outputs else "float32"
        rate = device.half_dense_flops if dtype in _HALF else device.dense_flops
        rate *= device.dense_efficiency
        seconds = device.kernel_overhead_s + max(flops / rate, moved / bandwidth)
        return OpCost(seconds, flops, moved, dense=True)
    flops = float(sum(_numel(t) for t in outputs))
    seconds = device.kernel_overhead_s + max(flops / device.vector_flops, moved / bandwidth)
    return OpCost(seconds, flops, moved)
