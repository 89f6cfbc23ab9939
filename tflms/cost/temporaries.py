"""Kernel temporaries: memory an op's kernel allocates for its own run, besides its outputs.

TensorFlow's allocator sees every buffer a kernel asks for, not only its
outputs. Where a kernel's scratch is a whole tensor of the step's size, it
counts in the peak while the op runs. Modelled here:

* ``Einsum`` (:func:`einsum_temporary_bytes`): TensorFlow's kernel
  (``einsum_op_impl.h``) brings each operand into the order batch, free,
  contracted dimensions (or batch, contracted, free, which ``BatchMatMul``'s
  adjoint flags absorb) and copies it transposed into a temporary where it is
  not in that order already; the product is a temporary in the order batch,
  the first operand's free dimensions, the second's, and it is transposed into
  the output where the equation asks for another order. Keras'
  ``MultiHeadAttention`` computes with such equations (``aecd,abcd->acbe``,
  and their gradients): at the CPU allocator's peak of an encoder-decoder
  (users' model, batch 1024) two such copies of an attention gradient's
  operands, 1.25 MiB each, were live, and no output of the graph held them.

Example:
    >>> from tflms.graph.view import TensorInfo
    >>> q = TensorInfo("q:0", 0, "float32", (8, 16, 4, 32), 8 * 16 * 4 * 32 * 4)
    >>> k = TensorInfo("k:0", 0, "float32", (8, 16, 4, 32), 8 * 16 * 4 * 32 * 4)
    >>> s = TensorInfo("s:0", 0, "float32", (8, 4, 16, 16), 8 * 4 * 16 * 16 * 4)
    >>> einsum_temporary_bytes("aecd,abcd->acbe", [k, q], s) == k.bytes + q.bytes + s.bytes
    True
    >>> einsum_temporary_bytes("abc,acd->abd", [q, q], s)  # a plain batch matmul
    0
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TEMPORARY_OPS", "einsum_temporary_bytes", "temporary_bytes"]

TEMPORARY_OPS = frozenset({"Einsum"})
"""Op types whose kernel temporaries :func:`temporary_bytes` models."""

_BATCH, _FREE, _CONTRACT, _REDUCE = 1, 2, 3, 4  # TensorFlow's DimensionType order
_SWAPPED = {_BATCH: 1, _FREE: 3, _CONTRACT: 2, _REDUCE: 4}  # free and contracted swapped


def temporary_bytes(op_type: str, attrs: dict, inputs: Sequence, outputs: Sequence) -> int:
    """Bytes of the temporaries an op's kernel holds while it runs (0 where none are modelled).

    Args:
        op_type: the op's type.
        attrs: the attributes the view keeps for it (``equation`` for ``Einsum``).
        inputs: :class:`~tflms.graph.view.TensorInfo` of its data inputs, by input index.
        outputs: those of its outputs.

    Returns:
        Bytes, allocated when the op starts and freed when it ends.
    """
    if op_type == "Einsum" and attrs.get("equation") and len(outputs) == 1:
        return einsum_temporary_bytes(attrs["equation"], inputs, outputs[0])
    return 0


def einsum_temporary_bytes(equation: str, inputs: Sequence, output) -> int:
    """Bytes TensorFlow's two-operand ``Einsum`` kernel copies its operands and product into.

    Args:
        equation: the op's ``equation`` attribute, e.g. ``"aecd,abcd->acbe"``.
        inputs: the two operands' :class:`~tflms.graph.view.TensorInfo`.
        output: the output's.

    Returns:
        The bytes of each operand transposed into a temporary plus, where the
        product must be transposed into the output, the output's bytes. 0 for
        what is not modelled: one operand, ellipses, repeated labels (diagonals)
        and labels summed out of one operand alone.
    """
    spec = equation.replace(" ", "")
    if "..." in spec or "->" not in spec or len(inputs) != 2:
        return 0
    lhs, out = spec.split("->")
    operands = lhs.split(",")
    if len(operands) != 2 or any(len(set(s)) != len(s) for s in (*operands, out)):
        return 0
    ids: dict[str, int] = {}
    for label in lhs.replace(",", "") + out:
        ids.setdefault(label, len(ids))

    def kind(label: str) -> int:
        both = label in operands[0] and label in operands[1]
        if label in out:
            return _BATCH if both else _FREE
        return _CONTRACT if both else _REDUCE

    kinds = {ids[label]: kind(label) for label in ids}
    if _REDUCE in kinds.values():
        return 0
    total = 0
    free: list[list[int]] = []
    for operand, info in zip(operands, inputs, strict=True):
        labels = [ids[c] for c in operand]
        if not _in_swapped_order(labels, kinds):
            ordered = sorted(labels, key=lambda label: (kinds[label], label))
            if len(labels) >= 2 and ordered != labels:
                total += info.bytes  # TransposeOperand: a transposed copy
            labels = ordered
        free.append([label for label in labels if kinds[label] == _FREE])
    product = [label for label in sorted(kinds) if kinds[label] == _BATCH] + free[0] + free[1]
    if len(product) >= 2 and product != [ids[c] for c in out]:
        total += output.bytes  # the product, transposed into the output
    return total


def _in_swapped_order(labels: list[int], kinds: dict[int, int]) -> bool:
    """TensorFlow's ``ShouldSwapFreeAndContract``: batch, contracted, free dimensions in order."""
    for a, b in zip(labels, labels[1:], strict=False):
        ka, kb = _SWAPPED[kinds[a]], _SWAPPED[kinds[b]]
        if ka > kb or (ka == kb and a > b):
            return False
    return True
