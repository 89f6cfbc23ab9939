"""The training step of a compiled Keras model, as ``fit`` traces it: its graph and its view.

:func:`train_step_graph` traces ``model.train_step`` (the very function
:class:`~tflms.LMSCallback` rewrites) in a fresh ``tf.function`` and returns
its ``FuncGraph``; :func:`analyze` returns the analysis view of that graph,
ready for :func:`tflms.make_plan`, :func:`tflms.simulate` or
:func:`tflms.autotune`. Each call traces anew, so a plan can be applied to
the graph without touching the model or later traces.

Sizes are only trustworthy with a batch size: the batch dimension comes from
``batch_size``, else from the data given, and an unknown one is refused
rather than sized per sample.

Example:
    >>> import keras, tflms
    >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8)])
    >>> model.compile("sgd", "mse")
    >>> view = tflms.analyze(model, batch_size=64)
    >>> view.graph["batch_size"], view.graph["batch_source"]
    (64, 'input signature')
    >>> tflms.analyze(model)
    Traceback (most recent call last):
    ...
    tflms.errors.ConfigError: The batch size of the training step is unknown ...
"""

from __future__ import annotations

import logging
import weakref

import networkx as nx
import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import ConfigError, UnsupportedGraphError
from tflms.graph.view import build_view

__all__ = ["train_step_graph", "analyze", "input_specs", "target_specs", "sparse_labels"]

logger = logging.getLogger(__name__)


def sparse_labels(loss) -> bool:
    """Whether ``loss`` takes class indices (not one-hot or dense targets).

    A loss object may say so itself with a ``sparse_labels = True`` attribute.

    Args:
        loss: what the model was compiled with (a name, a function or a loss object).

    Returns:
        ``True`` for sparse categorical losses.
    """
    if isinstance(loss, str):
        return "sparse" in loss
    if getattr(loss, "sparse_labels", False):
        return True
    fn = getattr(loss, "fn", None) or loss
    names = (type(loss).__name__, getattr(fn, "__name__", ""))
    return any("sparse" in name.lower() for name in names)


def _spec(shape, dtype, batch_size: int | None) -> tf.TensorSpec:
    shape = list(shape)
    if batch_size is not None and shape:
        shape[0] = batch_size
    return tf.TensorSpec(shape, tf.as_dtype(dtype))


def _structure(items: list):
    return items[0] if len(items) == 1 else items


def input_specs(model, batch_size: int | None = None):
    """``tf.TensorSpec`` (or a list, one per input) of the model's inputs.

    Args:
        model: a built functional or sequential Keras model.
        batch_size: the leading dimension; ``None`` leaves it as the model has it.

    Returns:
        A spec, or a list of specs for several inputs.

    Raises:
        ConfigError: the model has no symbolic inputs (a subclassed model); pass ``x``.
    """
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConfigError(
            f"Model {model.name!r} has no symbolic inputs (a subclassed model?), so its input "
            "shapes are unknown. Pass x=tf.TensorSpec([batch, ...]) or a sample batch."
        )
    return _structure([_spec(t.shape, t.dtype, batch_size) for t in inputs])


def target_specs(model, batch_size: int | None = None):
    """``tf.TensorSpec`` (or a list) of the targets ``fit`` would pass for the model's outputs.

    Sparse categorical losses (see :func:`sparse_labels`) take int32 class
    indices: the output shape without its class axis; other losses take
    float32 targets of the output's shape.

    Args:
        model: a compiled Keras model with symbolic outputs.
        batch_size: the leading dimension; ``None`` leaves it as the model has it.

    Returns:
        A spec, or a list of specs for several outputs.

    Raises:
        ConfigError: the targets cannot be inferred (no symbolic outputs, or
            one loss per output); pass ``y``.
    """
    outputs = getattr(model, "outputs", None)
    loss = getattr(model, "loss", None)
    if not outputs or isinstance(loss, (list, tuple, dict)):
        raise ConfigError(
            f"The targets of model {model.name!r} cannot be inferred (no symbolic outputs, or "
            "one loss per output). Pass y=tf.TensorSpec([batch, ...], dtype) or a sample batch."
        )
    sparse = sparse_labels(loss)
    specs = [
        _spec(t.shape[:-1], tf.int32, batch_size)
        if sparse
        else _spec(t.shape, tf.float32, batch_size)
        for t in outputs
    ]
    return _structure(specs)


def _as_specs(data, batch_size: int | None):
    def one(item):
        if isinstance(item, tf.TensorSpec):
            return _spec(item.shape, item.dtype, batch_size)
        tensor = tf.convert_to_tensor(item)
        return _spec(tensor.shape, tensor.dtype, batch_size)

    return tf.nest.map_structure(one, data)


def _batch_of(specs) -> set:
    return {s.shape[0] if s.shape.rank else None for s in tf.nest.flatten(specs)}


def train_step_graph(model, *, batch_size: int | None = None, x=None, y=None) -> tf.Graph:
    """Trace one training step of a compiled Keras model and return its graph.

    Args:
        model: a compiled Keras 3 model (TensorFlow backend).
        batch_size: the batch each step sees; wins over the data's leading dimension.
        x: sample inputs or ``tf.TensorSpec`` (nested like the model's inputs);
            default: the model's input shapes.
        y: sample targets or specs; default: inferred from the outputs and
            the loss (see :func:`target_specs`).

    Returns:
        The ``FuncGraph`` of ``model.train_step`` - forward pass, gradients,
        optimizer update - traced in a fresh ``tf.function``.

    Raises:
        ConfigError: the model is not compiled or not built (a subclassed
            model before its first call: nothing is changed then), the batch
            size is unknown, or inputs/targets cannot be inferred.
    """
    if getattr(model, "optimizer", None) is None:
        raise ConfigError(
            f"Model {getattr(model, 'name', model)!r} is not compiled, so it has no training step. "
            "Call model.compile(optimizer, loss) first."
        )
    name = getattr(model, "name", "model")
    if not model.built:
        raise ConfigError(
            f"Model {name!r} is not built yet (a subclassed model makes its weights at its "
            "first call), so its training step has no variables to trace; nothing was "
            f"changed. Build it first, e.g. {name}.build(input_shape) or {name}(x[:1]), then "
            "analyze it; or train with tflms.LMSCallback, which plans the step fit traces "
            "after Keras builds the model."
        )
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ConfigError(f"batch_size must be an int >= 1. Received batch_size={batch_size!r}.")
    x_specs = _as_specs(x, batch_size) if x is not None else input_specs(model, batch_size)
    y_specs = _as_specs(y, batch_size) if y is not None else target_specs(model, batch_size)
    batches = _batch_of(x_specs) | _batch_of(y_specs)
    if None in batches:
        raise ConfigError(
            f"The batch size of the training step is unknown (the model's inputs leave it open), "
            f"so tensor sizes would be per sample. Pass batch_size=..., e.g. "
            f"tflms.analyze({name}, batch_size=32)."
        )
    optimizer = model.optimizer
    # optimizer slots are variables: made outside the trace, on a stand-in when the
    # user's optimizer is not built yet, so that fit later builds the user's own
    stand_in = optimizer if optimizer.built else _stand_in(model, optimizer)
    step = tf.function(model.train_step, jit_compile=False)
    model.optimizer = stand_in
    try:
        return step.get_concrete_function((x_specs, y_specs)).graph
    except (TypeError, ValueError) as err:
        raise UnsupportedGraphError(
            f"Could not trace the training step of {name!r} with inputs "
            f"{x_specs} and targets {y_specs}: {err}. Pass x= and y= matching what fit receives."
        ) from err
    finally:
        model.optimizer = optimizer


_STAND_INS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Built stand-ins by the user's unbuilt optimizer: one per optimizer, not one per analysis."""


def _stand_in(model, optimizer):
    """A built copy of an unbuilt optimizer: the same class and settings, none of its state.

    Made in the model's distribution strategy, on the model's trainable
    variables, and kept for later analyses of the same optimizer. An optimizer
    Keras cannot copy (not serializable) is built itself instead, as ``fit``
    would build it at its first step, with a warning.
    """
    import keras

    variables = model.trainable_variables
    key = tuple(id(v) for v in variables)
    kept = _STAND_INS.get(optimizer)
    if kept is not None and kept[0] == key:
        return kept[1]
    try:
        with model.distribute_strategy.scope():
            copy = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
            copy.build(variables)
    except Exception as err:  # noqa: BLE001 - any failure to copy: build the user's own
        logger.warning(
            "tflms: could not copy the unbuilt optimizer of %r (%s: %s) to trace its step; "
            "building the optimizer itself on the model's trainable variables, as fit would",
            getattr(model, "name", "model"),
            type(err).__name__,
            err,
        )
        optimizer.build(variables)
        return optimizer
    _STAND_INS[optimizer] = (key, copy)
    return copy


def analyze(
    model,
    *,
    batch_size: int | None = None,
    x=None,
    y=None,
    config: LMSConfig | None = None,
) -> nx.DiGraph:
    """The analysis view of a compiled Keras model's training step (see :func:`train_step_graph`).

    Args:
        model: a compiled Keras 3 model.
        batch_size: the batch each step sees.
        x: sample inputs or specs, as for :func:`train_step_graph`.
        y: sample targets or specs, as for :func:`train_step_graph`.
        config: devices for placement classes (default ``LMSConfig()``).

    Returns:
        The ``networkx.DiGraph`` of :func:`tflms.build_view`, sized for ``batch_size``.

    Raises:
        ConfigError: as for :func:`train_step_graph`.
    """
    graph = train_step_graph(model, batch_size=batch_size, x=x, y=y)
    return build_view(graph, config=config)
