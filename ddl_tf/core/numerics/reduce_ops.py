"""Reduction operations, named as Horovod names them.

``Average`` is a ``Sum`` followed by a division by the number of ranks;
the allreduce algorithms only ever see ``SUM``, ``MIN``, ``MAX`` and
``PRODUCT``. ``Adasum`` is not an elementwise reduction (it combines whole
tensors by their dot products); the engine runs it by :mod:`ddl_tf.core.algorithms.adasum`.

Example:
    >>> from ddl_tf.core.numerics.reduce_ops import Average, ReduceOp, parse_op
    >>> Average.wire_op is ReduceOp.SUM
    True
    >>> parse_op(None, average=False) is ReduceOp.SUM
    True
"""

from __future__ import annotations

import enum

from ddl_tf.errors import ConfigError

__all__ = ["ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum", "parse_op"]


class ReduceOp(enum.Enum):
    """How values from different ranks are combined."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"

    __hash__ = object.__hash__  # members are singletons; skips Enum's Python-level hash

    @property
    def wire_op(self) -> ReduceOp:
        """The operation the algorithms run (``AVERAGE`` travels as ``SUM``)."""
        return ReduceOp.SUM if self is ReduceOp.AVERAGE else self

    def __repr__(self) -> str:  # Horovod prints ops by name
        return f"ddl_tf.{self.name.capitalize()}"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


def parse_op(op: ReduceOp | str | None, average: bool | None = None) -> ReduceOp:
    """Normalize Horovod's ``op=`` / deprecated ``average=`` pair into a :class:`ReduceOp`.

    Args:
        op: A :class:`ReduceOp`, its name (``"sum"``), or None.
        average: Horovod's deprecated flag; only allowed when ``op`` is None.

    Returns:
        The operation; ``Average`` when both are None (Horovod's default).

    Raises:
        ConfigError: Both were given, or the name is unknown.
    """
    if op is not None and average is not None:
        raise ConfigError(
            f"Pass either op= or the deprecated average=, not both. Received op={op!r}, "
            f"average={average!r}; use op=ddl_tf.Average or op=ddl_tf.Sum."
        )
    if op is None:
        return ReduceOp.SUM if average is False else ReduceOp.AVERAGE
    if isinstance(op, str):
        try:
            op = ReduceOp(op.lower())
        except ValueError:
            names = ", ".join(o.value for o in ReduceOp)
            raise ConfigError(
                f"Unknown reduction {op!r}. Received op={op!r}; use one of {names}."
            ) from None
    if not isinstance(op, ReduceOp):
        raise ConfigError(
            f"op must be one of ddl_tf.Average, Sum, Min, Max, Product, Adasum. Received op={op!r}."
        )
    return op
