"""``ReduceSpec``: how one reduction is done, resolved once, and what the engine reduces with.

Horovod spreads a reduction's settings over keyword arguments (``op``,
``average``, ``compression``, ``prescale_factor``, ``postscale_factor``, and
for gradients ``gradient_predivide_factor``). The public functions and
classes keep taking them; they turn them into one frozen :class:`ReduceSpec`
(the op parsed, the compression split into the engine's compressor and a
Horovod-style wrapper, the scale factors fixed) and pass that down to
:meth:`Engine.allreduce <ddl_tf.core.collectives.engine.Engine.allreduce>`
and :meth:`~ddl_tf.core.collectives.engine.Engine.grouped_reducescatter`,
which take nothing else: no layer parses or checks the arguments again.
``DistributedOptimizer`` and ``DistributedGradientTape`` build theirs when
they are created, so a bad value fails there, not inside ``fit``.

The engine reads ``op``, ``compressor`` (None: the job's ``DDL_COMPRESSION``)
and the two scale factors; ``wrapper`` is the framework layer's to apply
around the collective. Which ranks take part is not part of the spec: each
process set has its own engine, looked up where the reduction runs
(:func:`ddl_tf.core.process_sets.engine_for`), since whether a set is
registered, and whether this rank is in it, can change after the spec is
made (``add_process_set``, an elastic re-formation).

Example:
    >>> from ddl_tf.core.collectives.reduce_spec import ReduceSpec
    >>> spec = ReduceSpec.of("sum", compression="fp16")
    >>> spec.op, spec.compressor.name, spec.wrapper
    (ddl_tf.Sum, 'fp16', None)
    >>> grads = ReduceSpec.for_gradients(gradient_predivide_factor=4.0)
    >>> grads.op, grads.prescale_factor, grads.postscale_factor
    (ddl_tf.Average, 0.25, 4.0)
    >>> ReduceSpec(op="sum")
    Traceback (most recent call last):
    ...
    ddl_tf.errors.ConfigError: ReduceSpec.op must be a ReduceOp. Received op='sum'; build the spec with ReduceSpec.of('sum') to parse a name.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

from ddl_tf.core.numerics.compression import Compression, Compressor
from ddl_tf.core.numerics.reduce_ops import ReduceOp, parse_op
from ddl_tf.errors import ConfigError

__all__ = ["ReduceSpec", "AVERAGE", "split_compression"]


def split_compression(compression: Any) -> tuple[Compressor | None, Any]:
    """The engine's compressor, or a Horovod-style compressor to apply around the collective.

    Args:
        compression: None, a :class:`~ddl_tf.core.numerics.compression.Compressor` or its
            name, or an object with ``compress``/``decompress`` methods (Horovod
            style, applied by the framework layer to its tensors).

    Returns:
        ``(engine compressor or None, wrapper or None)``; None for the engine
        means the job's configured compression. A Horovod-style compressor
        runs around the collective, with no engine compression.

    Raises:
        ConfigError: ``compression`` is none of these.
    """
    if compression is None:
        return None, None
    if isinstance(compression, (Compressor, str)):
        return Compression.get(compression), None
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return Compression.none, compression
    raise ConfigError(f"Unknown compression {compression!r}; use ddl_tf.Compression.fp16 etc.")


@dataclass(frozen=True)
class ReduceSpec:
    """One reduction's settings, parsed and checked.

    Build it with :meth:`of` (a collective's arguments) or :meth:`for_gradients`
    (a gradient reducer's); ``ReduceSpec()`` is an Average with the job's
    compression (:data:`AVERAGE`).

    Attributes:
        op: The reduction.
        compressor: The engine's wire compression; None: the job's configured one.
        wrapper: A Horovod-style compressor applied to the tensors before and
            after the collective (by the framework layer, not the engine), or None.
        prescale_factor: Multiplies each rank's value before the reduction.
        postscale_factor: Multiplies the result after it.

    Raises:
        ConfigError: ``op`` is not a :class:`~ddl_tf.core.numerics.reduce_ops.ReduceOp`,
            ``compressor`` not a :class:`~ddl_tf.core.numerics.compression.Compressor`
            (or None), or a scale factor not a number.
    """

    op: ReduceOp = ReduceOp.AVERAGE
    compressor: Compressor | None = None
    wrapper: Any = None
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.op, ReduceOp):
            raise ConfigError(
                f"ReduceSpec.op must be a ReduceOp. Received op={self.op!r}; build the spec "
                f"with ReduceSpec.of({self.op!r}) to parse a name."
            )
        if self.compressor is not None and not isinstance(self.compressor, Compressor):
            raise ConfigError(
                f"ReduceSpec.compressor must be a Compressor or None. Received "
                f"compressor={self.compressor!r}; build the spec with "
                "ReduceSpec.of(compression=...) to parse a name or a Horovod-style compressor."
            )
        for name in ("prescale_factor", "postscale_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigError(f"{name} must be a number. Received {name}={value!r}.")

    @classmethod
    def of(
        cls,
        op: ReduceOp | str | None = None,
        *,
        average: bool | None = None,
        compression: Any = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> ReduceSpec:
        """The spec of a collective called with Horovod's keyword arguments.

        Args:
            op: A :class:`~ddl_tf.core.numerics.reduce_ops.ReduceOp`, its name, or None (Average).
            average: Horovod's deprecated flag (only with ``op=None``).
            compression: See :func:`split_compression`.
            prescale_factor: Multiply before reducing.
            postscale_factor: Multiply after reducing.

        Returns:
            The spec.

        Raises:
            ConfigError: An unknown op or compression, both ``op`` and
                ``average``, or a scale factor that is not a number.
        """
        compressor, wrapper = split_compression(compression)
        return cls(
            op=parse_op(op, average),
            compressor=compressor,
            wrapper=wrapper,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
        )

    @classmethod
    def for_gradients(
        cls,
        *,
        op: ReduceOp | str | None = ReduceOp.AVERAGE,
        compression: Any = None,
        gradient_predivide_factor: float = 1.0,
    ) -> ReduceSpec:
        """The spec of a gradient reduction (``DistributedOptimizer``, ``DistributedGradientTape``).

        Args:
            op: Average (default), Sum or another :class:`~ddl_tf.core.numerics.reduce_ops.ReduceOp`.
            compression: See :func:`split_compression`.
            gradient_predivide_factor: With Average, divide by this before the
                sum and multiply by it after (Horovod's option against fp16 overflow).

        Returns:
            The spec, the predivide factor turned into scale factors.

        Raises:
            ConfigError: As :meth:`of`, or ``gradient_predivide_factor`` with
                another op than Average or not a positive number.
        """
        spec = cls.of(op, compression=compression)
        factor = gradient_predivide_factor
        if factor == 1.0:
            return spec
        if spec.op is not ReduceOp.AVERAGE:
            raise ConfigError(
                "gradient_predivide_factor only applies to op=Average. Received "
                f"gradient_predivide_factor={factor}, op={spec.op.name}."
            )
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not factor > 0:
            raise ConfigError(
                "gradient_predivide_factor must be a number > 0. Received "
                f"gradient_predivide_factor={factor!r}; e.g. 1.0 (off) or the number of ranks."
            )
        return dataclasses.replace(spec, prescale_factor=1.0 / factor, postscale_factor=factor)

    @property
    def scaled(self) -> bool:
        """Whether either scale factor differs from 1."""
        return self.prescale_factor != 1.0 or self.postscale_factor != 1.0


AVERAGE = ReduceSpec()
"""An Average with the job's compression and no scaling: the engine's default spec."""
