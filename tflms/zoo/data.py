"""Synthetic batches for any compiled model: inputs and targets of the right shapes.

Example:
    >>> from tflms.zoo.sequence import mlp
    >>> x, y = synthetic_data(mlp(features=8, widths=(16,)), 5)
    >>> x.shape, y.shape, str(y.dtype), int(y.max()) < 10
    ((5, 8), (5,), 'int32', True)
"""

from __future__ import annotations

import numpy as np

from tflms.keras.step import input_specs, target_specs

__all__ = ["synthetic_data"]


def synthetic_data(model, n: int, *, seed: int = 0):
    """``(x, y)`` numpy arrays of ``n`` samples for ``model`` (see :func:`tflms.keras.step.target_specs`).

    Inputs are standard normal (integer inputs: token ids below the first
    ``Embedding``'s vocabulary); sparse targets are uniform class indices in
    ``[0, classes)``; a loss with ``binary_labels = True`` (one {0, 1} map per
    label, e.g. :class:`~tflms.zoo.isensee.WeightedDiceLoss`) gets {0, 1}
    float maps; other dense targets are standard normal.

    Args:
        model: a compiled Keras model with symbolic inputs and outputs.
        n: number of samples.
        seed: the generator's seed.

    Returns:
        ``(x, y)``; lists of arrays for several inputs or outputs.
    """
    rng = np.random.default_rng(seed)
    binary = bool(getattr(getattr(model, "loss", None), "binary_labels", False))

    def inputs(spec):
        if spec.dtype.is_integer:  # token ids, below the first embedding's vocabulary
            return rng.integers(0, _vocabulary(model), (n, *spec.shape[1:])).astype("int32")
        return rng.standard_normal((n, *spec.shape[1:])).astype(spec.dtype.as_numpy_dtype)

    def targets(spec, out_shape):
        if spec.dtype.is_integer:
            classes = out_shape[-1]
            return rng.integers(0, classes, (n, *spec.shape[1:])).astype("int32")
        if binary:
            return rng.integers(0, 2, (n, *spec.shape[1:])).astype("float32")
        return rng.standard_normal((n, *spec.shape[1:])).astype("float32")

    x_specs, y_specs = input_specs(model), target_specs(model)
    x = [inputs(s) for s in (x_specs if isinstance(x_specs, list) else [x_specs])]
    ys = y_specs if isinstance(y_specs, list) else [y_specs]
    y = [targets(s, tuple(o.shape)) for s, o in zip(ys, model.outputs, strict=True)]
    return (x[0] if len(x) == 1 else x), (y[0] if len(y) == 1 else y)


def _vocabulary(model) -> int:
    """The input size of the model's first ``Embedding`` (2 without one: ids 0 and 1)."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            return int(layer.input_dim)
    return 2
