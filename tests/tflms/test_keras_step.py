"""``tflms.analyze`` / ``train_step_graph``: the step fit would run, traced without changing the model.

Analysis must leave the user's model and optimizer as it found them: an
unbuilt subclassed model is refused before anything is built, and an unbuilt
optimizer is traced through a stand-in copy, so that the user's later ``fit``
builds its own optimizer and trains exactly as it would have.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tflms
from tflms.errors import ConfigError


class Net(keras.Model):
    """A subclassed model: it makes its weights at its first call."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(32, activation="relu", kernel_initializer="ones")
        self.out = keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, x):
        return self.out(self.hidden(x))


def _compiled() -> Net:
    model = Net()
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=False)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 8)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


def test_an_unbuilt_subclassed_model_is_refused_and_left_as_it_was():
    model = _compiled()
    x, y = _data()
    with pytest.raises(ConfigError, match=r"not built yet.*net\.build\(input_shape\)"):
        tflms.analyze(model, x=x, y=y)
    assert not model.built and not model.optimizer.built
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # the user's own fit still trains
    assert int(model.optimizer.iterations) == 2


def test_analysis_with_an_unbuilt_optimizer_leaves_it_unbuilt_and_training_unchanged():
    x, y = _data()
    analysed, plain = _compiled(), _compiled()
    for model in (analysed, plain):
        model(x[:1])  # built as the user would, before analysis
    view = tflms.analyze(analysed, x=x[:16], y=y[:16])
    assert view.graph["batch_size"] == 16
    assert any(d["type"] == "AssignVariableOp" for _, d in view.nodes(data=True))  # updates
    assert not analysed.optimizer.built  # traced through a stand-in, not built
    for model in (analysed, plain):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    for a, b in zip(analysed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(analysed.optimizer.variables) == len(plain.optimizer.variables)
