"""ddl_tf's collective errors as TensorFlow error types, for ``except`` clauses written for Horovod.

Horovod's collectives are TensorFlow ops, so their failures are
``tf.errors.OpError`` subclasses: ``FailedPreconditionError`` when ranks
disagree on a tensor's shape, dtype, name or root, ``InvalidArgumentError``
for bad alltoall splits. The TensorFlow layer of ddl_tf raises the classes
below instead of the framework-neutral ones of :mod:`ddl_tf.errors`; each is
both (``except ddl_tf.errors.CollectiveMismatchError`` and ``except
tf.errors.FailedPreconditionError`` catch the same error).

Eagerly the typed error itself reaches the caller. Inside a graph
(``tf.function``, Keras ``fit``, ``tf.compat.v1`` sessions) TensorFlow turns
any Python exception of an op into its own type by the exception's base
class: ``ValueError`` -> ``InvalidArgumentError``, ``NotImplementedError`` ->
``UnimplementedError``, anything else -> ``UnknownError``. A mismatch
therefore takes another road there (see :mod:`ddl_tf.tensorflow.bridge`) so that it
still surfaces as ``FailedPreconditionError``.

Example:
    >>> import tensorflow as tf
    >>> from ddl_tf import errors
    >>> from ddl_tf.tensorflow import tf_errors
    >>> err = tf_errors.typed(errors.CollectiveMismatchError("rank 1 sent float32[3]"))
    >>> isinstance(err, tf.errors.FailedPreconditionError), isinstance(err, errors.DDLError)
    (True, True)
    >>> str(err)
    'rank 1 sent float32[3]'
"""

from __future__ import annotations

import tensorflow as tf

from ddl_tf import errors

__all__ = ["CollectiveMismatchError", "CollectiveArgumentError", "typed"]


class CollectiveMismatchError(errors.CollectiveMismatchError, tf.errors.FailedPreconditionError):
    """Ranks issued different collectives; also a ``tf.errors.FailedPreconditionError``."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class CollectiveArgumentError(errors.CollectiveArgumentError, tf.errors.InvalidArgumentError):
    """A rank's collective arguments are invalid; also a ``tf.errors.InvalidArgumentError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


_TYPED = (
    (errors.CollectiveMismatchError, CollectiveMismatchError),
    (errors.CollectiveArgumentError, CollectiveArgumentError),
)


def typed(err: BaseException) -> BaseException:
    """``err`` as its TensorFlow-typed class (same message), or ``err`` itself if there is none.

    Args:
        err: An exception raised by the engine.

    Returns:
        An instance of this module's class for ``err``'s class, or ``err``.
    """
    if isinstance(err, tf.errors.OpError):
        return err
    for core, tf_class in _TYPED:
        if isinstance(err, core):
            return tf_class(str(err))
    return err
