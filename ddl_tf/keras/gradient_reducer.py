"""``GradientReducer``: Horovod's gradient options, checked once, and the reduction they describe.

Both Keras optimizers of ddl_tf reduce gradients the same way:
:class:`~ddl_tf.keras.optimizer.DistributedOptimizer` before its inner
optimizer applies them, and
:class:`~ddl_tf.keras.loss_scale.DistributedLossScaleOptimizer` before it
checks them for overflow. Each holds one reducer, which owns the options
(``op``, ``compression``, ``gradient_predivide_factor``, ``process_set``,
...), their :class:`~ddl_tf.core.collectives.reduce_spec.ReduceSpec` and
:class:`~ddl_tf.tensorflow.overlap.Bucketing` (built here, once),
the variables whose gradients stay local, and the Keras config of all that.

Example (one process):
    >>> import keras
    >>> import ddl_tf.keras as hvd
    >>> from ddl_tf.keras.gradient_reducer import GradientReducer
    >>> _ = hvd.init()
    >>> reducer = GradientReducer("demo", op=hvd.Sum)
    >>> w = keras.Variable([1.0, 2.0])
    >>> [g.numpy().tolist() for g in reducer.reduce([keras.ops.ones(2)], [w])]
    [[1.0, 1.0]]
    >>> reducer.get_config()["op"]
    'sum'
    >>> hvd.shutdown()
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.compression import Compression, Compressor
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet, excludes_this_rank, member_engine
from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.functions import reduce_gradients
from ddl_tf.tensorflow.overlap import resolve

__all__ = ["GradientReducer", "variable_key", "variables_of_apply"]

logger = logging.getLogger(__name__)


class GradientReducer:
    """Reduce gradient lists across ranks as a ``DistributedOptimizer`` was configured to.

    Args:
        name: Base name of the collectives (``<name>_allreduce``); the same on every rank.
        compression: ``Compression.none`` (default: the configured one), ``.fp16``, ``.bf16``.
        sparse_as_dense: Densify ``tf.IndexedSlices`` gradients before reducing.
        gradient_predivide_factor: With Average, scale by ``1/f`` before the sum
            and ``f/size`` after it.
        op: ``Average`` (default), ``Sum`` or ``Adasum``.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all.
        scale_local_gradients: Divide the gradients of local variables by the number of ranks.
        overlap: Reduce in buckets that overlap the backward pass (graphs only);
            None: the job's ``DDL_OVERLAP``.
        bucket_bytes: Gradient bytes per bucket; None: the job's ``DDL_BUCKET_BYTES``.

    Raises:
        ConfigError: An op other than Average, Sum or Adasum, an unknown
            compression, a bad ``gradient_predivide_factor``, ``overlap`` or
            ``bucket_bytes``, or a process set that is not registered.
    """

    def __init__(
        self,
        name: str,
        *,
        compression: Compressor | str | None = None,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        op: ReduceOp | str = ReduceOp.AVERAGE,
        process_set: ProcessSet | None = None,
        scale_local_gradients: bool = True,
        overlap: bool | None = None,
        bucket_bytes: int | None = None,
    ) -> None:
        excludes_this_rank(process_set)  # refuse a bad set here, not inside fit
        self.spec = ReduceSpec.for_gradients(
            op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor
        )
        if self.spec.op not in (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM):
            raise ConfigError(
                "DistributedOptimizer combines gradients with Average, Sum or Adasum. Received "
                f"op={self.spec.op!r}."
            )
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.gradient_predivide_factor = gradient_predivide_factor
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.overlap = overlap
        self.bucket_bytes = bucket_bytes
        self.bucketing = resolve(overlap, bucket_bytes)  # bad values fail here, not inside fit
        self._local_vars: set = set()

    @property
    def op(self) -> ReduceOp:
        """The reduction (parsed)."""
        return self.spec.op

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient on this rank: it is not reduced across ranks.

        Args:
            var: A trainable variable of the model (Keras or TensorFlow).
        """
        self._local_vars.add(variable_key(var))

    def has_local_variables(self) -> bool:
        """Whether any variable was registered with :meth:`register_local_var`."""
        return bool(self._local_vars)

    def reduce(self, grads: list, variables: list, overlap: bool | None = None) -> list:
        """The gradients reduced across ranks, local variables' kept on this rank.

        On a rank outside ``process_set`` every gradient stays local, as in Horovod.

        Args:
            grads: One gradient per variable (tensors, ``tf.IndexedSlices`` or None).
            variables: The variables, in the same order.
            overlap: Reduce in buckets as backprop produces them (None: the
                reducer's setting, resolved when it was made).

        Returns:
            The reduced gradients, in the same order.
        """
        grads = list(grads)
        engine = member_engine(self.process_set)  # the one look-up of the set per step
        if engine is None:
            return grads  # as in Horovod: a rank outside the set trains on its own gradients
        bucketing = self.bucketing
        if overlap is not None and overlap != bucketing.overlap:
            bucketing = resolve(overlap, bucketing.bucket_bytes)
        shared = [i for i, v in enumerate(variables) if variable_key(v) not in self._local_vars]
        reduced = reduce_gradients(
            [grads[i] for i in shared],
            self.spec,
            engine,
            bucketing,
            sparse_as_dense=self.sparse_as_dense,
            name=f"{self.name}_allreduce",
        )
        out = list(grads)
        for i, g in zip(shared, reduced, strict=True):
            out[i] = g
        if self.scale_local_gradients and len(shared) < len(grads):
            for i, v in enumerate(variables):
                if variable_key(v) in self._local_vars and out[i] is not None:
                    out[i] = _divide(out[i], engine.size)
        return out

    def get_config(self) -> dict:
        """The options, as Keras saves them (a custom Horovod-style compressor is not saved).

        Returns:
            Keyword arguments of :class:`GradientReducer` (less ``name`` and ``process_set``).
        """
        compression = self.compression
        if compression is not None and not isinstance(compression, (Compressor, str)):
            logger.warning("custom compressor %r is not saved with the optimizer", compression)
            compression = None
        return {
            "compression": None if compression is None else Compression.get(compression).name,
            "sparse_as_dense": self.sparse_as_dense,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "op": self.op.value,
            "scale_local_gradients": self.scale_local_gradients,
            "overlap": self.overlap,
            "bucket_bytes": self.bucket_bytes,
        }


def variable_key(variable: Any) -> Any:
    """A hashable key of a Keras or TensorFlow variable (its ``ref()``, else its id)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def variables_of_apply(optimizer: Any, trainable_variables: Any, built_with: Any) -> list:
    """The variables an ``apply`` call updates, building ``optimizer`` over them the first time.

    ``built_with`` is the optimizer's own list of the variables it was built
    with (the caller passes it: it is the optimizer's, not this module's).

    Raises:
        ConfigError: no variables are given and the optimizer was never built.
    """
    if trainable_variables is None:
        if not optimizer.built:
            raise ConfigError(
                f"{type(optimizer).__name__}.apply() got gradients without variables before it "
                "was built. Pass the variables (optimizer.apply(grads, model.trainable_"
                "variables)) or call optimizer.build(variables) first."
            )
        return list(built_with)
    variables = list(trainable_variables)
    if not optimizer.built:
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(variables)
        optimizer.built = True
    return variables


def _divide(grad, n: int):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)
