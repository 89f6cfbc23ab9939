"""The model's random-generator state, kept in its ``.keras`` checkpoints.

Keras 3 layers that draw random numbers in training (``Dropout``,
``GaussianNoise``, ``RandomFlip``, ...) draw them from a
``keras.random.SeedGenerator``, whose whole state is one variable (a seed
and a counter that every draw advances). ``model.save`` does not write
these variables, and a model rebuilt from its file starts them afresh (from
a random seed, unless one was given to the layer): a run resumed from a
checkpoint then drops out other units than the uninterrupted run would
have, so it is not the same run.

:func:`keep_random_state` makes every later ``model.save`` (and so
``keras.callbacks.ModelCheckpoint``) write each generator's state with the
model, under ``ddl_random_state/vars`` in ``model.weights.h5``; it is a
plain Keras saving hook (``Layer.save_own_variables``), so a file with the
state still loads with plain Keras, which ignores it. Reading it back:
:func:`ddl_tf.keras.load_model`, or ``model.load_weights(path)`` on a model
that :func:`keep_random_state` was called on. ``BroadcastGlobalVariablesCallback``
and :func:`ddl_tf.keras.save_model` call it, so a Horovod-style script needs
no extra line.

With several ranks the file holds rank 0's generators: the ranks draw the
same numbers when ``BroadcastGlobalVariablesCallback`` gave them rank 0's
variables at the start (``model.variables`` holds the generators' state),
and after a resume, where it broadcasts the restored state again.

Random ops called without a generator (``keras.random.normal(shape)``, seed
None) draw from Keras's global generator, which no file keeps: give such a
layer its own ``keras.random.SeedGenerator``, as Keras's layers do.

Example:
    >>> import keras
    >>> from ddl_tf.keras.random_state import keep_random_state, random_state_variables
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5)])
    >>> [tuple(v.shape) for v in random_state_variables(model)]
    [(2,)]
    >>> keep_random_state(model) is keep_random_state(model)  # once per model
    True
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import numpy as np

from ddl_tf.errors import ConfigError

__all__ = ["ATTRIBUTE", "RandomState", "keep_random_state", "random_state_variables"]

ATTRIBUTE = "ddl_random_state"
"""The model attribute holding the :class:`RandomState` (also its group in the weights file)."""


def random_state_variables(model: keras.Model) -> list:
    """The state variables of every ``SeedGenerator`` of ``model``, in ``model.variables`` order.

    Keras documents ``layer.variables`` as all of a layer's state, random
    seeds included, and ``layer.weights`` as the same without them, so the
    generators' states are the variables that are not weights.

    Args:
        model: A Keras model (built, or its generators do not exist yet).

    Returns:
        The variables (each of shape ``(2,)``: seed and counter).
    """
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


class RandomState(keras.layers.Layer):
    """The saving hook that writes (and reads) a model's generator states.

    Not a layer of the model (it is never called, and ``model.layers`` does
    not list it): Keras's saving visits every saveable attribute of the
    model, and a layer's ``save_own_variables``/``load_own_variables`` are
    where a layer decides what of it is written. Use :func:`keep_random_state`.

    Args:
        model: The model whose generators are kept (held weakly).
    """

    def __init__(self, model: keras.Model) -> None:
        super().__init__(name=ATTRIBUTE, trainable=False)
        self._owner = weakref.ref(model)

    def _variables_of_owner(self) -> list:
        model = self._owner()
        return [] if model is None else random_state_variables(model)

    def save_own_variables(self, store) -> None:
        """Write each generator's state (Keras's saving hook).

        Args:
            store: Keras's variable store for this object.
        """
        for i, variable in enumerate(self._variables_of_owner()):
            store[str(i)] = variable

    def load_own_variables(self, store) -> None:
        """Set each generator's state from ``store`` (Keras's loading hook).

        A file saved without the state (no :func:`keep_random_state` before the
        save) leaves the generators as they are.

        Args:
            store: Keras's variable store for this object (or a dict of arrays).

        Raises:
            ConfigError: The file holds another number of generators than the model has.
        """
        count = len(store.keys())
        if count:
            assign_random_state(self._variables_of_owner(), [store[str(i)] for i in range(count)])


def assign_random_state(variables: list, values: list[Any]) -> None:
    """Give each generator state variable its saved value.

    Args:
        variables: :func:`random_state_variables` of the model.
        values: The saved states, in the same order.

    Raises:
        ConfigError: Counts or shapes differ (the file is another model's).
    """
    if len(values) != len(variables):
        raise ConfigError(
            f"The checkpoint holds the state of {len(values)} random generator(s) but the model "
            f"has {len(variables)} (Dropout and other random layers each have one), so the file "
            "was saved from another model. Load it into the model it was saved from."
        )
    arrays = [np.asarray(value) for value in values]
    for variable, array in zip(variables, arrays, strict=True):
        if tuple(array.shape) != tuple(variable.shape):
            raise ConfigError(
                f"The checkpoint's random generator state has shape {array.shape} where the "
                f"model's {variable.path} has {tuple(variable.shape)}: the file was saved from "
                "another model. Load it into the model it was saved from."
            )
    for variable, array in zip(variables, arrays, strict=True):
        variable.assign(array.astype(variable.dtype))


def keep_random_state(model: keras.Model) -> RandomState:
    """Make ``model.save`` (and ``ModelCheckpoint``) keep the model's random-generator state.

    Idempotent. The state goes under ``ddl_random_state`` in the file's
    weights; :func:`ddl_tf.keras.load_model` and ``model.load_weights`` on a
    model this was called on restore it, so that a resumed run draws the
    same dropout masks as the uninterrupted one.

    Args:
        model: A Keras model.

    Returns:
        The model's :class:`RandomState` hook.
    """
    existing = model.__dict__.get(ATTRIBUTE)
    if isinstance(existing, RandomState):
        return existing
    holder = RandomState(model)
    # set past Keras's attribute tracking: the hook is not a layer of the model (no change to
    # model.layers, its variables or its config), only an object that saving visits
    object.__setattr__(model, ATTRIBUTE, holder)
    return holder
