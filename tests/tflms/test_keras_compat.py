"""The Keras internals tflms.keras.compat reads exist, inside a real fit, in the pinned Keras.

If a Keras upgrade moves one of them, these tests say which, before users see
a callback that lost its batch-size lookup or its hook guard.
"""

import configparser
import logging
from pathlib import Path

import keras
import numpy as np
import pytest

from tflms.keras import compat
from tflms.keras.session import fit_batch_size

REPO = Path(__file__).resolve().parents[2]


class _Probe(keras.callbacks.Callback):
    """Records what compat finds at each hook of the fit it runs in."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_begin(self, logs=None):
        self.seen.append(compat.running_fit(self.model))

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(compat.running_fit(self.model))


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=False)
    return model


def test_running_fit_finds_the_callback_list_adapter_and_data():
    model, probe = _model(), _Probe()
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[probe])
    assert len(probe.seen) == 3 and all(fit is not None for fit in probe.seen)
    for fit in probe.seen:
        assert isinstance(fit.callbacks, keras.callbacks.CallbackList)
        assert probe in fit.callbacks.callbacks and fit.data is x
        assert fit.adapter is not None and fit.adapter.batch_size == 4
    assert fit_batch_size(probe.seen[0])[0] == 4
    assert compat.running_fit(model) is None  # after the fit


def test_peeked_batches_of_a_generator():
    model, probe = _model(), _Probe()

    def batches():
        while True:
            yield np.ones((5, 3), "float32"), np.ones((5, 1), "float32")

    model.fit(batches(), steps_per_epoch=2, epochs=1, verbose=0, callbacks=[probe])
    peeked = compat.peeked_batches(probe.seen[0].adapter)
    assert peeked and peeked[0][0].shape == (5, 3)
    assert fit_batch_size(probe.seen[0]) == (5, "the first batch of the generator")
    assert compat.peeked_batches(object()) == []


def test_the_pinned_keras_range_is_the_one_compat_reads(caplog):
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    requires = [r.strip() for r in parser["options"]["install_requires"].splitlines()]
    low, high = compat.KERAS_RANGE
    assert f"keras>={low},<{high}" in requires
    assert compat.check_keras_version()  # the installed Keras is inside
    with caplog.at_level(logging.WARNING, logger="tflms.keras.compat"):
        assert not compat.check_keras_version("9.0.0")
        assert not compat.check_keras_version("9.0.0")
    warnings = [r for r in caplog.records if "outside that range" in r.getMessage()]
    assert len(warnings) == 1 and "LMSConfig(batch_size=N)" in warnings[0].getMessage()


@pytest.mark.parametrize("version", ["3.14.0", "3.16.0", "4.0.0"])
def test_versions_outside_the_range_are_named(version):
    assert not compat.check_keras_version(version)
