"""Horovod's broadcasts: ``broadcast``, the in-place ``broadcast_``, ``broadcast_global_variables``
and the ``tf.compat.v1`` session hook ``BroadcastGlobalVariablesHook``.

Shapes, dtypes and the root must match across ranks, else every rank raises
:class:`~ddl_tf.tensorflow.tf_errors.CollectiveMismatchError` (a
``tf.errors.FailedPreconditionError``).

Gradient of ``broadcast`` (as Horovod 0.28.1): on the root rank, the
**average** over ranks of the upstream gradient; zeros elsewhere.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> v = tf.Variable([1.0, 2.0])
    >>> [t.numpy().tolist() for t in hvd.broadcast_([v], root_rank=0)]
    [[1.0, 2.0]]
    >>> hvd.broadcast_global_variables(0)
    Traceback (most recent call last):
    ...
    ddl_tf.errors.ExecutionModeError: broadcast_global_variables() broadcasts tf.compat.v1 global variables, which do not exist in eager execution. Use ddl_tf.broadcast_variables(model.variables, root_rank=0) (and the optimizer's variables), or hvd.callbacks.BroadcastGlobalVariablesCallback(0) in fit().
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from ddl_tf.core.collectives.reduce_spec import AVERAGE
from ddl_tf.core.process_sets import ProcessSet, set_root
from ddl_tf.errors import ExecutionModeError
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.functions import broadcast_variables
from ddl_tf.tensorflow.tf_errors import engine_for

__all__ = [
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
]


def broadcast(
    tensor,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet | None = None,
) -> tf.Tensor:
    """``tensor`` from ``root_rank`` on every rank.

    Args:
        tensor: The tensor; same dtype and shape on every rank (only the
            root's values are used).
        root_rank: Rank whose values everyone receives.
        name: Optional name, compared across ranks.
        ignore_name_scope: Accepted for compatibility.
        process_set: The ranks to broadcast among (a registered ``ProcessSet``; ``root_rank``
            is a job rank in it); None: all.

    Returns:
        The root's values. Its gradient is the ranks' gradients averaged, on the
        root, and zero on the other ranks.

    Raises:
        ConfigError: ``process_set`` is not registered, or this rank is not in it.
    """
    engine = engine_for(process_set)
    root = set_root(process_set, root_rank)
    tensor = tf.convert_to_tensor(tensor)

    @tf.custom_gradient
    def op(x):
        y = bridge.run(
            lambda a: engine.broadcast([a], root, name=name),
            [x],
            [x.dtype],
            [x.shape],
            name=bridge.op_name("Broadcast", name),
        )[0]

        def grad(dy):
            averaged = bridge.run(
                lambda d: engine.allreduce([d], AVERAGE),
                [dy],
                [dy.dtype],
                [dy.shape],
                name=bridge.op_name("BroadcastGrad", None),
            )[0]
            # `* 0`, not zeros_like: Grappler folds zeros_like of a known shape into a constant
            # and would drop the allreduce on non-root ranks only (Horovod multiplies too)
            return averaged if engine.rank == root else averaged * 0

        return y, grad

    return op(tensor)


def broadcast_(
    variables: Sequence,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet | None = None,
) -> list[tf.Tensor]:
    """Assign every variable the root's value in place; returns the new values.

    Works with ``tf.Variable`` (resource variables), ``tf.compat.v1`` reference
    variables in graphs, and Keras 3 variables; all variables travel in one
    fused message. In a graph the returned tensors read the variables after
    the assignment, as Horovod's.

    Args:
        variables: Variables in the same order on every rank.
        root_rank: Rank whose values win.
        name: Optional name, compared across ranks.
        process_set: The ranks to broadcast among (a registered ``ProcessSet``; ``root_rank``
            is a job rank in it); None: all.

    Returns:
        The variables' values after the broadcast, one tensor per variable.
    """
    engine = engine_for(process_set)
    root = set_root(process_set, root_rank)
    variables = list(variables)
    if not variables:
        return []
    values = bridge.run(
        lambda *arrays: engine.broadcast(arrays, root, name=name or "broadcast_"),
        [tf.convert_to_tensor(v) for v in variables],
        [tf.as_dtype(v.dtype).base_dtype for v in variables],
        [tf.TensorShape(v.shape) for v in variables],
        name=bridge.op_name("BroadcastInplace", name),
    )
    if tf.executing_eagerly():
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
        return [tf.convert_to_tensor(v) for v in variables]
    return [
        tf.identity(variable.assign(value))
        for variable, value in zip(variables, values, strict=True)
    ]


def broadcast_global_variables(root_rank: int):
    """Broadcast all ``tf.compat.v1`` global variables from ``root_rank`` (graph mode only).

    Args:
        root_rank: Rank whose variable values everyone receives.

    Returns:
        The grouped assign op (None when there are no global variables).

    Raises:
        ExecutionModeError: Called eagerly (a ``RuntimeError``, as in Horovod).
    """
    if tf.executing_eagerly():
        raise ExecutionModeError(
            "broadcast_global_variables() broadcasts tf.compat.v1 global variables, which do "
            "not exist in eager execution. Use ddl_tf.broadcast_variables(model.variables, "
            f"root_rank={root_rank}) (and the optimizer's variables), or "
            f"hvd.callbacks.BroadcastGlobalVariablesCallback({root_rank}) in fit()."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """``tf.compat.v1`` session hook: broadcast global variables once the session exists.

    For ``tf.compat.v1.train.MonitoredTrainingSession`` (and Estimator-style
    loops): every rank starts from the root's initial values or checkpoint.

    Args:
        root_rank: Rank whose variables every rank adopts.
        device: Accepted for Horovod compatibility (ignored).
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self._graph = None

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self._graph is not graph:
            self._graph = graph
            with bridge.outside_chain():  # runs alone: must not run the training collectives
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord) -> None:
        """Run the broadcast once the session exists (``SessionRunHook`` API).

        Args:
            session: The new ``tf.compat.v1.Session``.
            coord: The session's coordinator (unused).
        """
        if self.bcast_op is not None:
            session.run(self.bcast_op)
