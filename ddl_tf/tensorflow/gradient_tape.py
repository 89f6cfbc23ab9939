"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient`` returns averaged gradients.

It wraps the user's tape by composition (Horovod clones the tape's class with
``type()``; plain delegation is enough): recording, ``watch`` and friends go
to the wrapped tape; :meth:`DistributedGradientTape.gradient` computes local
gradients and allreduces them: eagerly in one fused, negotiated collective;
inside ``tf.function`` in buckets, in the order backprop produces them, so
that reducing overlaps the rest of the backward pass (:mod:`ddl_tf.tensorflow.overlap`).

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> w = tf.Variable(3.0)
    >>> with tf.GradientTape() as tape:
    ...     loss = w * w
    >>> tape = hvd.DistributedGradientTape(tape)
    >>> float(tape.gradient(loss, [w])[0])
    6.0
    >>> hvd.shutdown()
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet, member_engine
from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.functions import reduce_gradients
from ddl_tf.tensorflow.overlap import resolve

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class DistributedGradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` allreduces across ranks.

    Args:
        gradtape: The ``tf.GradientTape`` that recorded the forward pass.
        device_dense: Accepted for compatibility (ignored).
        device_sparse: Accepted for compatibility (ignored).
        compression: ``Compression.none`` (default), ``.fp16`` or ``.bf16``.
        sparse_as_dense: Densify ``tf.IndexedSlices`` gradients first.
        op: Average (default), Sum or Adasum.
        gradient_predivide_factor: See :func:`ddl_tf.tensorflow.functions.allreduce_gradients`.
        num_groups: Accepted for compatibility (ddl_tf always fuses into buckets).
        groups: Accepted for compatibility.
        process_set: The ranks to reduce over (a registered ``ProcessSet``); None: all. A rank
            outside the set keeps its own gradients (as in Horovod).
        scale_local_gradients: Divide gradients of registered local sources by
            the number of ranks, as Horovod does.
        overlap: Reduce in buckets that overlap the backward pass (graphs
            only); None: the job's setting (``DDL_OVERLAP``, on by default).
        bucket_bytes: Gradient bytes per bucket; None: the job's ``DDL_BUCKET_BYTES``.

    Raises:
        ConfigError: An unknown ``op`` or ``compression``, a bad
            ``gradient_predivide_factor``, ``overlap`` or ``bucket_bytes``, or a
            ``process_set`` that is not registered: when the tape is made, not
            when it reduces.
    """

    def __init__(
        self,
        gradtape: tf.GradientTape,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = None,
        sparse_as_dense: bool = False,
        op: ReduceOp = ReduceOp.AVERAGE,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        process_set: ProcessSet | None = None,
        scale_local_gradients: bool = True,
        overlap: bool | None = None,
        bucket_bytes: int | None = None,
    ) -> None:
        # every option is checked here, once: a bad value fails when the tape is made
        self._spec = ReduceSpec.for_gradients(
            op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor
        )
        # a tape lives for one step: its set's engine (None outside the set) is looked up once
        self._engine = member_engine(process_set)  # and a bad set refused here
        self._bucketing = resolve(overlap, bucket_bytes)
        self._tape = gradtape
        self._sparse_as_dense = sparse_as_dense
        self._scale_local = scale_local_gradients
        self._local_sources: set = set()

    def register_local_source(self, source) -> None:
        """Keep ``source``'s gradient local (not reduced across ranks).

        Args:
            source: A variable (or other object) that is passed among ``sources`` later.
        """
        self._local_sources.add(source.ref() if hasattr(source, "ref") else id(source))

    def _is_local(self, source) -> bool:
        key = source.ref() if hasattr(source, "ref") else id(source)
        return key in self._local_sources

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        """Local gradients of ``target``, allreduced (same structure as ``sources``).

        On a rank outside the tape's ``process_set`` the local gradients come
        back unreduced, as in Horovod (that rank trains alone).

        Gradients of registered local sources are not reduced (divided by the
        number of ranks when ``scale_local_gradients``). ``use_generic_names``
        is accepted for Horovod compatibility.

        Args:
            target: The value to differentiate, as for ``tf.GradientTape.gradient``.
            sources: A variable or nested structure of them.
            output_gradients: Upstream gradients of ``target``, or None.
            use_generic_names: Ignored.
            **kwargs: Passed on to ``tf.GradientTape.gradient`` (e.g. ``unconnected_gradients``).

        Returns:
            Gradients in the structure of ``sources`` (None for unconnected ones).
        """
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        engine = self._engine
        if engine is None:
            return grads  # as in Horovod: a rank outside the set trains on its own gradients
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        shared = [i for i, s in enumerate(flat_sources) if not self._is_local(s)]
        reduced = reduce_gradients(
            [flat_grads[i] for i in shared],
            self._spec,
            engine,
            self._bucketing,
            sparse_as_dense=self._sparse_as_dense,
            name="DistributedGradientTape",
        )
        out = list(flat_grads)
        for i, g in zip(shared, reduced, strict=True):
            out[i] = g
        if self._scale_local and len(shared) < len(flat_sources):
            n = engine.size
            for i, s in enumerate(flat_sources):
                if self._is_local(s) and out[i] is not None:
                    out[i] = _divide(out[i], n)
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(
        self, target, sources, output_gradients=None, use_generic_names=False
    ) -> tuple[list, list]:
        """:meth:`gradient`, split into ``(local [(source, grad)], global [(source, grad)])``.

        The order within each list is the order of ``sources``.

        Args:
            target: The value to differentiate.
            sources: An iterable of variables.
            output_gradients: Upstream gradients of ``target``, or None.
            use_generic_names: Ignored.

        Returns:
            ``(local, global)`` lists of ``(source, gradient)`` pairs.
        """
        sources = list(sources)
        grads = self.gradient(target, sources, output_gradients)
        local: list[tuple] = []
        shared: list[tuple] = []
        for source, grad in zip(sources, grads, strict=True):
            (local if self._is_local(source) else shared).append((source, grad))
        return local, shared

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, name: str):
        return getattr(self._tape, name)


def _divide(grad, n: int):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


def PartialDistributedGradientTape(
    gradtape, local_layers=None, **kwargs
) -> DistributedGradientTape:  # noqa: N802 - Horovod's name
    """A :class:`DistributedGradientTape` that keeps the gradients of ``local_layers`` local.

    Args:
        gradtape: The ``tf.GradientTape`` that recorded the forward pass.
        local_layers: A Keras layer or a list of them whose trainable weights keep
            local gradients; None for none.
        **kwargs: Passed on to :class:`DistributedGradientTape`.

    Returns:
        The distributed tape with those weights registered as local sources.

    Raises:
        ConfigError: An entry of ``local_layers`` is not a Keras layer.
    """
    tape = DistributedGradientTape(gradtape, **kwargs)
    layers = [] if local_layers is None else local_layers
    if not isinstance(layers, (list, tuple)):
        layers = [layers]
    bad = [layer for layer in layers if not hasattr(layer, "trainable_weights")]
    if bad:
        raise ConfigError(
            "local_layers must be Keras layers. Received "
            f"{[type(b).__name__ for b in bad]}; pass model.layers[i] objects."
        )
    for layer in layers:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
