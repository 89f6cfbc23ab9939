"""ddl_tf's collective errors as TensorFlow error types, for ``except`` clauses written for Horovod.

Horovod's collectives are TensorFlow ops, so their failures are
``tf.errors.OpError`` subclasses: ``FailedPreconditionError`` when ranks
disagree on a tensor's shape, dtype, name or root, ``InvalidArgumentError``
for bad alltoall splits and for a process set that does not include the
calling rank. The TensorFlow layer of ddl_tf raises the classes
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

from typing import Any

import tensorflow as tf

from ddl_tf import errors
from ddl_tf.core import process_sets
from ddl_tf.core.process_sets import ProcessSet

__all__ = [
    "CollectiveMismatchError",
    "CollectiveArgumentError",
    "NotInProcessSetError",
    "typed",
    "engine_for",
]


class CollectiveMismatchError(errors.CollectiveMismatchError, tf.errors.FailedPreconditionError):
    """Ranks issued different collectives; also a ``tf.errors.FailedPreconditionError``."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class CollectiveArgumentError(errors.CollectiveArgumentError, tf.errors.InvalidArgumentError):
    """A rank's collective arguments are invalid; also a ``tf.errors.InvalidArgumentError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class NotInProcessSetError(errors.NotInProcessSetError, tf.errors.InvalidArgumentError):
    """A collective on a set that excludes this rank; also a ``tf.errors.InvalidArgumentError``."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


_TYPED = (
    (errors.CollectiveMismatchError, CollectiveMismatchError),
    (errors.CollectiveArgumentError, CollectiveArgumentError),
    (errors.NotInProcessSetError, NotInProcessSetError),
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


def engine_for(process_set: ProcessSet | None) -> Any:
    """:func:`ddl_tf.core.process_sets.engine_for`, with its errors TensorFlow-typed.

    Raises:
        NotInProcessSetError: This rank is not in ``process_set`` (also a
            ``tf.errors.InvalidArgumentError`` and a ``ConfigError``).
        ddl_tf.errors.ConfigError: ``process_set`` is not a registered set.
    """
    try:
        return process_sets.engine_for(process_set)
    except errors.NotInProcessSetError as err:
        raise typed(err) from None
