"""What :class:`~tflms.LMSCallback` changes on a Keras model during one ``fit``, and how it is undone.

Keras 3 ``fit`` reads ``model.train_function`` before every step and never
tells a callback that it failed (``on_train_end`` runs only on success). So
the callback changes as little as it can, for as short as it can:

* ``model.train_step`` and ``model.jit_compile`` are never left changed: the
  rewriting train step is handed to ``make_train_function`` and the
  attribute is put back at once (Keras captures the step when it builds the
  function).
* ``model.train_function`` is the one change that lasts the fit. It is
  installed at the first step (so a failing ``on_train_begin`` of another
  callback finds the model untouched) as a :class:`GuardedTrainFunction`.
* Everything is restored by :meth:`FitSession.restore`, which runs on
  ``on_train_end``, on any exception (``KeyboardInterrupt`` included) raised
  by a training step, by a callback hook of the same ``fit`` or by its
  validation, and - should an exception escape from between those (Keras'
  own loop code) - on the first call of a later ``fit``: a guarded train
  function called from a ``fit`` that is not its own restores the model and
  runs the original train function instead.

The running ``fit``'s data and callback list, which Keras passes to no
callback, come from :mod:`tflms.keras.compat`; without them - a callback
driven by hand - only the batch-size lookup and the hook guards are skipped.

Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("sgd", "mse", jit_compile=False)
    >>> check_xla(model)  # XLA off: nothing to switch off
    False
    >>> model.jit_compile = True  # what jit_compile="auto" stores on a GPU machine
    >>> check_xla(model)
    True
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable

import keras
import tensorflow as tf

from tflms.errors import ConfigError
from tflms.keras.compat import RunningFit, peeked_batches, running_fit

__all__ = [
    "FitSession",
    "GuardedTrainFunction",
    "fit_batch_size",
    "leading_dim",
    "check_xla",
]

logger = logging.getLogger(__name__)

_MISSING = object()
GUARDED_HOOKS = (
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_batch_begin",
    "on_test_batch_end",
)
"""Hooks of the running fit's ``CallbackList`` that restore the model when another callback raises."""


_KERAS_TRAIN_STEP = keras.Model.train_step
"""Keras's own ``train_step`` (the TensorFlow trainer's), which uses ``model.optimizer``."""


def check_xla(model) -> bool:
    """Refuse XLA auto-clustering; say whether the model's own step would be XLA-compiled.

    XLA clusters ignore the host placement of swap ops. TensorFlow's global
    auto-clustering (``tf.config.optimizer.set_jit``) is the user's explicit
    choice for every function, so it is refused with the fix. A model's
    ``jit_compile`` is usually Keras's own choice: ``compile``'s default
    ``jit_compile="auto"`` turns XLA on when Keras sees a GPU, and Keras stores
    the resolved ``True``, which cannot be told from an explicit
    ``jit_compile=True``; the caller switches it off for the rewritten train
    function only (:meth:`FitSession.install`) and says so.

    Args:
        model: the compiled Keras model.

    Returns:
        Whether ``model.jit_compile`` is on (the fit must switch it off).

    Raises:
        ConfigError: XLA auto-clustering is on.
    """
    if tf.config.optimizer.get_jit():
        raise ConfigError(
            f"TensorFlow XLA auto-clustering is on (tf.config.optimizer.get_jit()="
            f"{tf.config.optimizer.get_jit()!r}); XLA clusters ignore the host placement of swap "
            "ops. Call tf.config.optimizer.set_jit(False) (and unset TF_XLA_FLAGS) before training "
            "with LMS."
        )
    return bool(model.jit_compile)


def fit_batch_size(fit: RunningFit | None) -> tuple[int | None, str]:
    """The batch size the running ``fit`` feeds, and where it was found.

    Looks, in order, at the data adapter's batch size (``fit(batch_size=...)``
    for arrays, a static batch dimension of a ``tf.data`` element spec), the
    batches Keras peeked from a Python generator, the first batch of a
    ``keras.utils.PyDataset``, and the first element of a ``tf.data.Dataset``
    whose batch dimension is dynamic.

    Args:
        fit: the running fit (:func:`~tflms.keras.compat.running_fit`), or ``None``.

    Returns:
        ``(batch size, source)``; ``(None, reason)`` when it cannot be known.
    """
    adapter = fit.adapter if fit is not None else None
    if adapter is None:
        return None, "no running fit was found"
    try:
        size = adapter.batch_size
    except (AttributeError, TypeError, ValueError):
        size = None
    if isinstance(size, int) and size > 0:
        return size, "the batch size fit feeds (its batch_size, or the dataset's element spec)"
    peeked = peeked_batches(adapter)  # Keras peeks generators for their specs
    if peeked:
        size = leading_dim(peeked[0])
        if size:
            return size, "the first batch of the generator"
    dataset = fit.data if fit is not None else None
    if isinstance(dataset, keras.utils.PyDataset):
        try:
            size = leading_dim(dataset[0])  # Keras reads the first batch the same way
        except (IndexError, KeyError, TypeError, ValueError):
            size = None
        if size:
            return size, "the first batch of the PyDataset"
    if isinstance(dataset, tf.data.Dataset):
        for element in dataset.take(1):
            size = leading_dim(element)
            if size:
                return size, "the first batch of the dataset"
    return None, f"the data ({type(adapter).__name__}) has no static batch size"


def leading_dim(batch) -> int | None:
    """The first static dimension of the first tensor-like in ``batch`` that has one.

    Args:
        batch: A (nested) batch of arrays, eager or symbolic tensors.

    Returns:
        That dimension, or None when no item has a known first dimension.
    """
    for item in tf.nest.flatten(batch):
        shape = getattr(item, "shape", None)
        try:
            dims = list(shape) if shape is not None else []
        except (TypeError, ValueError):  # a TensorShape of unknown rank
            continue
        if dims and dims[0] is not None:
            return int(dims[0])
    return None


class GuardedTrainFunction:
    """``model.train_function`` during an LMS fit: the rewritten function behind guards.

    Args:
        function: the train function Keras built with the rewriting step.
        session: the :class:`FitSession` that installed it.
    """

    def __init__(self, function: Callable, session: FitSession):
        self.function = function
        self.session = session

    def __call__(self, iterator):
        session = self.session
        if not session.owns_call():  # a later fit without the callback: put the model back
            return session.restore_and_run(iterator)
        try:
            outputs = self.function(iterator)
        except BaseException:
            session.restore()
            raise
        session.trained()
        return outputs


class FitSession:
    """The changes one ``fit`` with LMS makes to a model, and their undoing (see the module docs).

    Args:
        model: the Keras model.
    """

    def __init__(self, model):
        self.model = model
        self._original_function = model.train_function
        self._callbacks = None  # weakref to the CallbackList of this session's fit
        self._patched: list[tuple[object, str, object]] = []
        self._jit_compile_before: bool | None = None  # set when the fit switched XLA off
        self.installed = False
        self.closed = False
        self._undo_untrained: list[Callable[[], None]] = []  # until a step has run

    def guard_hooks(self, callback_list) -> None:
        """Restore the model when a hook of ``callback_list`` (another callback) raises.

        Args:
            callback_list: The ``keras.callbacks.CallbackList`` of the running fit;
                anything else is ignored.
        """
        if not isinstance(callback_list, keras.callbacks.CallbackList):
            return
        self._callbacks = weakref.ref(callback_list)
        for name in GUARDED_HOOKS:
            self._patch(callback_list, name, self._guarded(getattr(callback_list, name)))

    def install(self, rewriting_step: Callable, function: Callable | None = None) -> Callable:
        """Build the train function around ``rewriting_step`` and make it ``model.train_function``.

        The optimizer is built first, eagerly, when Keras's own train step will
        use it on variables that exist: Keras would otherwise create its slots
        inside the first trace, and a trace that fails (a plan that does not
        fit) would leave them uninitialized for every later fit. A model built
        by its first step (a ``Sequential`` without ``Input``, a subclassed
        model) has no variables yet, and a custom ``train_step`` (a GAN's) may
        not use ``model.optimizer`` at all: then the first trace builds what
        the step uses, as without the callback.

        Args:
            rewriting_step: A train step (called like ``model.train_step``) that
                rewrites the traced graph.
            function: A train function an earlier fit built around the same
                kind of step (its traces, already rewritten, are reused); None
                builds one.

        Returns:
            The train function (unguarded), for reuse by a later fit.
        """
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        keras_step = type(model).train_step is _KERAS_TRAIN_STEP
        if optimizer is not None and not optimizer.built and keras_step:
            if model.built and model.trainable_variables:
                optimizer.build(model.trainable_variables)
        if model.jit_compile:  # XLA ignores the swap ops' placement: off for this fit only
            self._jit_compile_before = model.jit_compile
            model.jit_compile = False
            logger.warning(
                "tflms: XLA is off for the training step of %s while LMSCallback trains it: "
                "XLA clusters ignore the host placement of swap ops (jit_compile='auto' turns "
                "XLA on when Keras sees a GPU). The model's jit_compile is restored after fit; "
                "compile with jit_compile=False to silence this.",
                getattr(model, "name", "the model"),
            )
        if function is None:
            own_step = vars(model).get("train_step", _MISSING)
            model.train_step = rewriting_step
            try:
                model.make_train_function(force=True)  # Keras captures the step it is given here
                function = model.train_function
            finally:
                if own_step is _MISSING:
                    del model.train_step
                else:
                    model.train_step = own_step
        model.train_function = GuardedTrainFunction(function, self)
        self._patch(model, "evaluate", self._guarded(model.evaluate))  # validation inside fit
        self.installed = True
        return function

    def owns_call(self) -> bool:
        """Whether the running train-function call comes from this session's fit.

        A ``fit`` on the stack whose callback list is not this session's is a
        later fit (the one this session belonged to ended without
        ``on_train_end``); without a ``fit`` on the stack (hooks driven by
        hand), the call is this session's until it is restored.
        """
        if self.closed:
            return False
        fit = running_fit(self.model)
        if fit is None:
            return True
        ours = self._callbacks() if self._callbacks is not None else None
        return ours is not None and fit.callbacks is ours

    def undo_if_untrained(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` if the fit ends before its first step has run (a plan it could not make).

        Args:
            undo: Puts back a change made to the model before its first step.
        """
        self._undo_untrained.append(undo)

    def trained(self) -> None:
        """A step ran: changes made before it stay, whatever ends the fit."""
        self._undo_untrained.clear()

    def restore(self) -> None:
        """Put back everything this session changed; safe to call more than once.

        The changes made for the first step (:meth:`undo_if_untrained`) are
        put back too if no step ran.
        """
        if self.closed:
            return
        self.closed = True
        while self._undo_untrained:
            self._undo_untrained.pop()()
        for owner, name, before in reversed(self._patched):
            if before is _MISSING:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, before)
        self._patched.clear()
        if self._jit_compile_before is not None:
            self.model.jit_compile = self._jit_compile_before
            self._jit_compile_before = None
        if self.installed and isinstance(self.model.train_function, GuardedTrainFunction):
            self.model.train_function = self._original_function
        logger.debug("tflms: model %s restored after fit", getattr(self.model, "name", "?"))

    def restore_and_run(self, iterator):
        """Restore the model, then run the train function it had (built anew if it had none).

        Args:
            iterator: The data iterator Keras passes to the train function.

        Returns:
            What the model's own train function returns for ``iterator`` (the
            step's logs).
        """
        logger.info(
            "tflms: a fit without LMSCallback reached the train function an interrupted LMS fit "
            "left on model %s; restoring the model's own train function",
            getattr(self.model, "name", "?"),
        )
        self.restore()
        self.model.make_train_function()
        return self.model.train_function(iterator)

    # -------------------------------------------------------------- internals
    def _patch(self, owner, name: str, value) -> None:
        self._patched.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)

    def _guarded(self, method: Callable) -> Callable:
        def guarded(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except BaseException:
                self.restore()
                raise

        # sets guarded.__wrapped__ = method, nothing else (no name or docstring copied)
        return functools.update_wrapper(guarded, method, assigned=(), updated=())
