"""LMSCallback hooks and its behaviour inside real `fit` calls."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, cnn_bn, mlp
from tflms.errors import ConfigError
from tflms.keras_callback import _RewritingTrainStep

OPTIONS = dict(batch_size=BATCH, swapout_threshold=8, swapin_ahead=3, min_tensor_bytes=1024)


def weights_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def test_hooks_wrap_and_restore_the_train_step():
    model, _, _ = mlp(8)
    callback = tflms.LMSCallback(**OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    assert isinstance(model.train_step, _RewritingTrainStep)
    assert model.train_function is not None
    callback.on_train_end()
    assert not isinstance(model.train_step, _RewritingTrainStep)
    assert model.train_step.__func__ is type(model).train_step
    assert model.train_function is None


def test_state_is_reset_so_an_instance_can_be_reused(devices):
    plain, x, y = mlp(BATCH * 6)
    model, _, _ = mlp(BATCH * 6)
    callback = tflms.LMSCallback(**OPTIONS)
    with tf.device(devices.compute):
        for _ in range(2):
            plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[callback])
            assert callback.plan is not None and callback.plan.swaps
            assert len(callback.plans) <= 2  # this fit's traces only
    assert weights_equal(plain, model)
    # evaluate and predict are untouched and agree with the plain model
    np.testing.assert_array_equal(model.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert model.evaluate(x, y, verbose=0) == plain.evaluate(x, y, verbose=0)


def test_steps_per_execution_greater_than_one(devices):
    plain, x, y = cnn_bn(BATCH * 9)
    model, _, _ = cnn_bn(BATCH * 9)
    for m in (plain, model):
        m.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=m.loss,
            steps_per_execution=3,
            jit_compile=False,
        )
    callback = tflms.LMSCallback(**OPTIONS)
    with tf.device(devices.compute):
        plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.plan.swaps
    assert weights_equal(plain, model)


def test_an_interrupted_fit_does_not_stack_wrappers(devices):
    model, x, y = mlp(BATCH * 4)

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("interrupted")

    with tf.device(devices.compute), pytest.raises(RuntimeError, match="interrupted"):
        model.fit(
            x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS), Boom()]
        )
    assert isinstance(model.train_step, _RewritingTrainStep)  # on_train_end never ran
    callback = tflms.LMSCallback(**OPTIONS)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    assert callback.plan.swaps
    assert (
        model.train_step.__func__ is type(model).train_step
    )  # restored, not a wrapper of a wrapper


def test_forced_xla_is_refused():
    model, x, y = mlp(BATCH)
    model.compile(optimizer="sgd", loss=model.loss, jit_compile=True)
    with pytest.raises(ConfigError, match="compiled with jit_compile=True"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS)])


def test_xla_chosen_by_keras_is_turned_off_with_a_warning(caplog, monkeypatch, devices):
    model, x, y = mlp(BATCH * 2)
    # What Keras does on a GPU machine with jit_compile="auto":
    monkeypatch.setattr(model, "_resolve_auto_jit_compile", lambda: True)
    model.jit_compile = True
    callback = tflms.LMSCallback(**OPTIONS)
    with caplog.at_level(logging.WARNING, logger="tflms"), tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    assert "turning off XLA" in caplog.text
    assert model.jit_compile is False and callback.plan.swaps


def test_global_xla_autoclustering_is_refused():
    model, x, y = mlp(BATCH)
    tf.config.optimizer.set_jit(True)
    try:
        with pytest.raises(ConfigError, match="auto-clustering is on"):
            model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS)])
    finally:
        tf.config.optimizer.set_jit(False)


def test_eager_models_are_refused():
    model, x, y = mlp(BATCH)
    model.compile(optimizer="sgd", loss=model.loss, run_eagerly=True)
    with pytest.raises(ConfigError, match="run_eagerly=False"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS)])


def test_verbose_prints_the_plan_summary(capsys, devices):
    model, x, y = mlp(BATCH * 2)
    callback = tflms.LMSCallback(verbose=1, **OPTIONS)
    assert "no train function traced yet" in callback.summary()
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    printed = capsys.readouterr().out
    assert "tflms plan for one_step_on_data" in printed and "bytes swapped per layer" in printed
    assert callback.summary().splitlines()[0] in printed


def test_silent_by_default(capsys, devices):
    model, x, y = mlp(BATCH * 2)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS)])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(verbose=-1), "verbose must be an int >= 0"),
        (dict(swapin_ahead=0), "LMSConfig.swapin_ahead"),
        (dict(bogus=1), r"Unknown LMS option\(s\) \['bogus'\]"),
        (dict(config={"swapin_ahead": 2}), "config must be an LMSConfig"),
    ],
)
def test_bad_options_fail_at_construction(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        tflms.LMSCallback(**kwargs)


def test_simulate_predicts_the_traced_step_with_and_without_the_plan(devices):
    model, x, y = mlp(BATCH * 2)
    callback = tflms.LMSCallback(**OPTIONS)
    with pytest.raises(ConfigError, match="call fit first"):
        callback.simulate()
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    result = callback.simulate(device="V100-16GB", link="nvlink2")
    assert (
        result.baseline is not None
        and result.device_peak_bytes <= result.baseline.device_peak_bytes
    )
    assert result.bytes_swapped_out == callback.plan.bytes_swapped
