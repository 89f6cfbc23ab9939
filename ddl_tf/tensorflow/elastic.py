"""``hvd.elastic``: state objects that survive membership changes, and ``run``.

Horovod's elastic mode lets hosts leave and join a running job
(``ddlrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh``,
see :mod:`ddl_tf.membership.reform` for how the job re-forms). The
training function keeps its progress in a *state* object:

* ``sync()`` broadcasts the tracked variables and attributes from rank 0
  (every rank, newcomers included, starts from the same state);
* ``commit()`` saves the current values in host memory and checks for host
  changes (``HostsUpdatedInterrupt`` on every rank when there are some);
* ``restore()`` puts the last committed values back;
* :func:`run` calls the function; when a rank fails
  (:class:`~ddl_tf.errors.HorovodInternalError`) it restores the last commit,
  re-forms the job without the failed host and calls it again; when hosts
  change it re-forms the job at the commit and goes on. Reset callbacks run
  after every change.

In a job launched without elastic options the membership is fixed: ``run``
syncs and calls the function once, and a failure ends the job as before.

The protocol and ``run`` are framework-neutral (:mod:`ddl_tf.membership.state`);
this module adds the TensorFlow variables and Keras models to it.

Example (one process):
    >>> import tensorflow as tf
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> v = tf.Variable([1.0, 2.0])
    >>> state = hvd.elastic.TensorFlowState([v], epoch=3)
    >>> state.sync(); _ = v.assign([5.0, 5.0]); state.epoch = 4; state.restore()
    >>> v.numpy().tolist(), state.epoch
    ([1.0, 2.0], 3)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ddl_tf.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl_tf.membership.mirror import MirrorError
from ddl_tf.membership.state import ObjectState, State, run
from ddl_tf.tensorflow import bridge
from ddl_tf.tensorflow.functions import broadcast_variables

__all__ = [
    "State",
    "ObjectState",
    "TensorFlowState",
    "TensorFlowKerasState",
    "run",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]


class TensorFlowState(ObjectState):
    """State of a list of TensorFlow variables plus keyword attributes.

    Args:
        variables: Variables to track (default: ``tf.compat.v1.global_variables()``).
        session: For ``tf.compat.v1`` graphs, the session holding the variables
            (default: the default session).
        **kwargs: Attributes to track.
    """

    def __init__(self, variables: Sequence | None = None, session=None, **kwargs: Any) -> None:
        self.variables = list(variables or tf.compat.v1.global_variables())
        self.session = session or (
            None if tf.executing_eagerly() else tf.compat.v1.get_default_session()
        )
        self._bcast_op = None
        if not tf.executing_eagerly():
            with bridge.outside_chain():  # run alone by sync(), never with the training step
                self._bcast_op = broadcast_variables(self.variables, 0)
        self._values: list = []
        self._save_variables()
        super().__init__(**kwargs)

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values, strict=True):
            if self.session is not None:
                variable.load(value, self.session)
            else:
                variable.assign(value)
        super().restore()

    def mirror_payload(self) -> Any:
        return {**super().mirror_payload(), "variables": list(self._values)}

    def load_mirror(self, payload: Any) -> None:
        _check_fits(self, self.variables, payload["variables"])
        self._values = list(payload["variables"])
        super().load_mirror(payload)

    def sync(self) -> None:
        if self.session is not None:
            if self._bcast_op is not None:
                self.session.run(self._bcast_op)
        else:
            broadcast_variables(self.variables, root_rank=0)
        self._save_variables()
        super().sync()

    def _save_variables(self) -> None:
        if self.session is not None:
            self._values = self.session.run(self.variables)
        else:
            self._values = [variable.numpy() for variable in self.variables]


class TensorFlowKerasState(ObjectState):
    """State of a built Keras model, its optimizer and keyword attributes.

    Args:
        model: A built Keras model.
        optimizer: The optimizer (default: ``model.optimizer``).
        backend: Accepted for Horovod compatibility (ignored).
        **kwargs: Attributes to track.

    Raises:
        ValueError: The model is not built yet.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any) -> None:
        if not model.built:
            raise ValueError(
                "TensorFlowKerasState needs a built model. Received an unbuilt "
                f"{type(model).__name__}; call model.build(input_shape) or run it on a batch first."
            )
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self._saved: list = []
        self._reader: Any = None  # one traced function reading every variable (see _save_model)
        self._read_key: tuple[int, ...] = ()
        self._save_model()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        optimizer = self.optimizer
        if optimizer is not None and not getattr(optimizer, "built", True):
            # a rank that joins has not trained yet: its optimizer must hold the same
            # slots as those of the ranks it receives them from
            optimizer.build(self.model.trainable_variables)
        optimizer_vars = list(optimizer.variables) if optimizer is not None else []
        return list(self.model.variables) + optimizer_vars

    def reset(self) -> None:
        """Make Keras trace the model's step functions again, for the new membership."""
        for attr in ("train_function", "test_function", "predict_function"):
            if hasattr(self.model, attr):
                setattr(self.model, attr, None)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved, strict=False):
            variable.assign(value)
        super().restore()

    def mirror_payload(self) -> Any:
        return {**super().mirror_payload(), "variables": list(self._saved)}

    def load_mirror(self, payload: Any) -> None:
        _check_fits(self, self._variables(), payload["variables"])
        self._saved = list(payload["variables"])
        super().load_mirror(payload)

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        """Copy every variable to host memory, in one traced read (a commit's whole cost).

        One function call reads all the variables: MobileNetV2's 266 take 7 ms
        so, against 28 ms read one by one (measured here).
        """
        variables = self._variables()
        key = tuple(id(v) for v in variables)
        if key != self._read_key:  # the optimizer built its slots, or another model
            self._reader = tf.function(lambda: [tf.identity(v) for v in variables])
            self._read_key = key
        self._saved = [value.numpy() for value in self._reader()]


def _check_fits(state: ObjectState, variables: list, values: list) -> None:
    """Refuse a mirrored commit whose values do not match ``variables`` one to one."""
    shapes = [tuple(v.shape) for v in variables]
    given = [tuple(getattr(v, "shape", ())) for v in values]
    if shapes != given:
        raise MirrorError(
            f"the commit kept in host memory does not fit this {type(state).__name__}: its "
            f"values have shapes {given}, the state's variables {shapes}; the relaunched program "
            "must build the same model and optimizer as the crashed one"
        )
