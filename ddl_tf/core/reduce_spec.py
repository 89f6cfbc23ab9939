"""``ReduceSpec``: how one reduction is done, resolved once from Horovod's keyword arguments.

Horovod spreads a reduction's settings over keyword arguments (``op``,
``average``, ``compression``, ``prescale_factor``, ``postscale_factor``,
``process_set``, and for gradients ``gradient_predivide_factor``). The
public functions and classes keep taking them; they turn them into one
frozen :class:`ReduceSpec` (the op parsed, the compression split into the
engine's compressor and a Horovod-style wrapper, the scale factors fixed)
and pass that down, so that a training step does not parse and check them
again at every layer. ``DistributedOptimizer`` and ``DistributedGradientTape``
build theirs when they are created.

The process set is kept as given: whether it is registered, and whether this
rank is in it, can change after the spec is made (``add_process_set``, an
elastic re-formation), so its engine is looked up where the reduction runs
(:func:`ddl_tf.core.process_sets.engine_for`).

Example:
    >>> from ddl_tf.core.reduce_spec import ReduceSpec
    >>> spec = ReduceSpec.of("sum", compression="fp16")
    >>> spec.op, spec.compressor.name, spec.wrapper
    (ddl_tf.Sum, 'fp16', None)
    >>> grads = ReduceSpec.for_gradients(gradient_predivide_factor=4.0)
    >>> grads.op, grads.prescale_factor, grads.postscale_factor
    (ddl_tf.Average, 0.25, 4.0)
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

from ddl_tf.core.numerics.compression import Compression, Compressor
from ddl_tf.core.numerics.reduce_ops import ReduceOp, parse_op
from ddl_tf.core.process_sets import ProcessSet, check_process_set
from ddl_tf.errors import ConfigError

__all__ = ["ReduceSpec", "split_compression"]


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
    (a gradient reducer's).

    Attributes:
        op: The reduction.
        compressor: The engine's wire compression; None: the job's configured one.
        wrapper: A Horovod-style compressor applied to the tensors before and
            after the collective, or None.
        prescale_factor: Multiplies each rank's value before the reduction.
        postscale_factor: Multiplies the result after it.
        process_set: The ranks to reduce over; None: the whole job.
    """

    op: ReduceOp = ReduceOp.AVERAGE
    compressor: Compressor | None = None
    wrapper: Any = None
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0
    process_set: ProcessSet | None = None

    @classmethod
    def of(
        cls,
        op: ReduceOp | str | None = None,
        *,
        average: bool | None = None,
        compression: Any = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
        process_set: ProcessSet | None = None,
    ) -> ReduceSpec:
        """The spec of a collective called with Horovod's keyword arguments.

        Args:
            op: A :class:`~ddl_tf.core.numerics.reduce_ops.ReduceOp`, its name, or None (Average).
            average: Horovod's deprecated flag (only with ``op=None``).
            compression: See :func:`split_compression`.
            prescale_factor: Multiply before reducing.
            postscale_factor: Multiply after reducing.
            process_set: A :class:`~ddl_tf.core.process_sets.ProcessSet` or None.

        Returns:
            The spec.

        Raises:
            ConfigError: An unknown op or compression, both ``op`` and
                ``average``, or a ``process_set`` that is not a ``ProcessSet``.
        """
        check_process_set(process_set)
        compressor, wrapper = split_compression(compression)
        return cls(
            op=parse_op(op, average),
            compressor=compressor,
            wrapper=wrapper,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )

    @classmethod
    def for_gradients(
        cls,
        *,
        op: ReduceOp | str | None = ReduceOp.AVERAGE,
        compression: Any = None,
        gradient_predivide_factor: float = 1.0,
        process_set: ProcessSet | None = None,
    ) -> ReduceSpec:
        """The spec of a gradient reduction (``DistributedOptimizer``, ``DistributedGradientTape``).

        Args:
            op: Average (default), Sum or another :class:`~ddl_tf.core.numerics.reduce_ops.ReduceOp`.
            compression: See :func:`split_compression`.
            gradient_predivide_factor: With Average, divide by this before the
                sum and multiply by it after (Horovod's option against fp16 overflow).
            process_set: A :class:`~ddl_tf.core.process_sets.ProcessSet` or None.

        Returns:
            The spec, the predivide factor turned into scale factors.

        Raises:
            ConfigError: As :meth:`of`, or ``gradient_predivide_factor`` with
                another op than Average or not a positive number.
        """
        spec = cls.of(op, compression=compression, process_set=process_set)
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
