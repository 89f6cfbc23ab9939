"""LMSCallback hooks and its behaviour inside real `fit` calls."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, cnn_bn, mlp, swap_ops_in
from tflms import zoo
from tflms.errors import ConfigError, PlanInfeasibleError
from tflms.keras.session import GuardedTrainFunction

OPTIONS = dict(batch_size=BATCH, swapout_threshold=8, swapin_ahead=3, min_tensor_bytes=1024)


def weights_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def _state(model):
    """What LMSCallback may touch: it must come out of every fit as it went in."""
    return (vars(model).get("train_step"), model.train_function, model.jit_compile)


def test_hooks_change_only_the_train_function_and_only_during_the_fit():
    model, _, _ = mlp(8)
    model.make_train_function()
    before = _state(model)
    callback = tflms.LMSCallback(**OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    assert _state(model) == before  # nothing changes before the first step
    callback.on_train_batch_begin(0)
    assert isinstance(model.train_function, GuardedTrainFunction)
    assert "train_step" not in vars(model) and model.jit_compile is False
    callback.on_train_end()
    assert _state(model) == before


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


class _Raise(keras.callbacks.Callback):
    def __init__(self, hook, error):
        super().__init__()
        setattr(self, hook, self._raise)
        self.error = error

    def _raise(self, *args, **kwargs):
        raise self.error


FAILURES = {
    "plan infeasible": (dict(memory_budget="1KiB"), (), {}, PlanInfeasibleError),
    "other callback, first step": (
        {},
        [_Raise("on_train_batch_begin", RuntimeError("boom"))],
        {},
        RuntimeError,
    ),
    "other callback, after a step": (
        {},
        [_Raise("on_train_batch_end", RuntimeError("boom"))],
        {},
        RuntimeError,
    ),
    "other callback, on_train_begin": (
        {},
        [_Raise("on_train_begin", RuntimeError("boom"))],
        {},
        RuntimeError,
    ),
    "KeyboardInterrupt at epoch end": (
        {},
        [_Raise("on_epoch_end", KeyboardInterrupt())],
        {},
        KeyboardInterrupt,
    ),
    "validation error": (
        {},
        (),
        {"validation_data": (np.ones((4, 3), "float32"), np.ones((4,), "int32"))},
        ValueError,
    ),
    "unknown device": (dict(device="/device:GPU:9"), (), {}, ConfigError),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failing_fit_leaves_the_model_as_it_went_in(failure, devices):
    options, others, fit_kwargs, error = FAILURES[failure]
    model, x, y = mlp(BATCH * 4)
    model.make_train_function()
    before = _state(model)
    callbacks = [tflms.LMSCallback(**{**OPTIONS, **options}), *others]
    with tf.device(devices.compute):
        try:
            model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=callbacks, **fit_kwargs)
        except error:
            pass
        else:
            pytest.fail(f"fit did not raise {error.__name__}")
        assert _state(model) == before
        # a later fit without the callback trains plainly
        history = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert not isinstance(model.train_function, GuardedTrainFunction)
    assert not swap_ops_in(model.train_function) and np.isfinite(history.history["loss"]).all()


def test_an_escaped_failure_is_healed_by_the_next_fit(devices):
    """If an exception escapes between the guards, the next fit restores the model first."""
    model, x, y = mlp(BATCH * 4)
    model.make_train_function()
    original = model.train_function
    callback = tflms.LMSCallback(**OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_train_batch_begin(0)  # what fit does; then, say, Ctrl-C in Keras' own loop
    assert isinstance(model.train_function, GuardedTrainFunction)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0)  # no callback
    assert model.train_function is original  # put back, then run
    assert not callback.traces  # the LMS step never traced


def test_xla_chosen_by_keras_on_a_gpu_machine_is_switched_off_for_the_fit(
    monkeypatch, caplog, devices
):
    model, x, y = mlp(BATCH * 2)
    # What Keras does on a GPU machine with jit_compile="auto": it resolves to True and
    # stores True, indistinguishable from an explicit jit_compile=True.
    monkeypatch.setattr(model, "_resolve_auto_jit_compile", lambda: True)
    model.compile(optimizer="sgd", loss=model.loss)
    assert model.jit_compile is True
    callback = tflms.LMSCallback(**OPTIONS)
    with caplog.at_level("WARNING", logger="tflms"), tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    warnings = [r.getMessage() for r in caplog.records if "XLA is off" in r.getMessage()]
    assert len(warnings) == 1 and "jit_compile='auto'" in warnings[0]
    assert callback.plan.swaps  # the rewritten step ran, without XLA
    assert model.jit_compile is True  # the model's own setting is back after fit


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
    assert all(plan.summary().splitlines()[0] in printed for plan in callback.plans)


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
    hardware = dict(device="V100-16GB", link="nvlink2")
    plain = tflms.simulate(callback.view, **hardware)
    assert result.baseline is not None
    assert result.baseline.device_peak_bytes == plain.device_peak_bytes
    with_plan = tflms.simulate(callback.view, callback.plan, **hardware)
    assert result.device_peak_bytes == with_plan.device_peak_bytes
    assert result.bytes_swapped_out == callback.plan.bytes_swapped > 0
    assert result.swap_outs == len(callback.plan.swaps)


def test_a_calibrated_callback_simulates_with_its_factor(devices):
    model, x, y = mlp(BATCH * 2)
    callback = tflms.LMSCallback(memory_budget="V100-16GB", tensor_factor=1.5)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    result = callback.simulate()
    assert result.stack == "tf2+calibrated"
    assert result.memory_terms["calibration"] == round(0.5 * result.memory_terms["tensors"])
    assert "calibration" not in callback.simulate(stack="tf2").memory_terms


def test_the_swap_ops_check_sees_a_rewritten_train_function(devices):
    model, x, y = mlp(BATCH * 2)
    seen = []

    class Look(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(swap_ops_in(self.model.train_function.function))

    with tf.device(devices.compute):
        model.fit(
            x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS), Look()]
        )
    assert seen and all(seen)


def _conv(seed=0):
    # per sample the step peaks near 3 MiB, at batch 32 near 100 MiB (simulated)
    return zoo.cnn(64, (32, 32, 32, 32), batch_norm=False, seed=seed)


def test_sizes_are_those_of_the_batch_fit_feeds_not_per_sample(devices):
    model = _conv()
    x, y = zoo.synthetic_data(model, 40)
    callback = tflms.LMSCallback(memory_budget="80MiB", safety_margin=0.0)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert callback.batch_size == 32 and "batch_size" in callback.batch_source
    assert callback.plan.batch_size == 32
    assert callback.tuning.lms_needed  # the old verdict said "LMS not needed: 3 MiB"
    assert callback.tuning.baseline.device_peak_bytes > 80 << 20


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_a_dataset_gives_its_batch_size(drop_remainder, devices):
    model = _conv()
    x, y = zoo.synthetic_data(model, 20)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=drop_remainder)
    callback = tflms.LMSCallback(**{**OPTIONS, "batch_size": None})
    with tf.device(devices.compute):
        model.fit(data, epochs=1, verbose=0, callbacks=[callback])
    assert callback.batch_size == 8 and callback.plan.batch_size == 8
    expected = "element spec" if drop_remainder else "first batch of the dataset"
    assert expected in callback.batch_source


def test_a_py_dataset_gives_the_batch_size_of_its_first_batch(devices):
    model = _conv()
    x, y = zoo.synthetic_data(model, 8)

    class Data(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]

    callback = tflms.LMSCallback(**{**OPTIONS, "batch_size": None})
    with tf.device(devices.compute):
        model.fit(Data(), epochs=1, verbose=0, callbacks=[callback])
    assert callback.plan.batch_size == 4 and "PyDataset" in callback.batch_source


def test_an_unknown_batch_size_is_refused_with_the_fix(devices):
    # Driven by hand (no fit on the stack) over data whose batch dimension is open:
    # nothing says the batch size, so the trace is refused and the model restored.
    model = _conv()
    x, y = zoo.synthetic_data(model, 8)
    spec = (
        tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype)),
        tf.TensorSpec([None, *y.shape[1:]], tf.as_dtype(y.dtype)),
    )
    data = tf.data.Dataset.from_generator(lambda: iter([(x[:4], y[:4])]), output_signature=spec)
    model.make_train_function()
    before = _state(model)
    callback = tflms.LMSCallback(**{**OPTIONS, "batch_size": None})
    callback.set_model(model)
    callback.on_train_begin()
    assert callback.batch_size is None and callback.batch_source == "no running fit was found"
    callback.on_train_batch_begin(0)
    with tf.device(devices.compute), pytest.raises(ConfigError, match=r"LMSConfig\(batch_size=N\)"):
        model.train_function(iter(data))
    assert _state(model) == before


def test_a_second_trace_of_the_same_shapes_is_labelled_as_such(devices):
    # With metrics=["accuracy"] TensorFlow traces the step again after the first trace
    # created the metric's variables: same input shapes, not "another input shape".
    model, x, y = mlp(BATCH * 2)
    model.compile(optimizer="sgd", loss=model.loss, metrics=["accuracy"], jit_compile=False)
    callback = tflms.LMSCallback(**OPTIONS)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    text = callback.summary()
    assert len(callback.traces) == 2 and "another input shape" not in text
    assert "kept by TensorFlow for the same input shapes" in text


def test_summary_of_the_one_trace_in_use_has_no_trace_header(devices):
    # Every batch has the same shape (no partial batch): TensorFlow traces the step once,
    # and the summary is that trace's plan, without a "trace k of n" header.
    model, x, y = mlp(BATCH * 2)
    callback = tflms.LMSCallback(**OPTIONS)
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    text = callback.summary()
    assert [trace.in_use for trace in callback.traces] == [True]
    assert callback.plan is callback.trace.plan and callback.plan.swaps
    assert "trace 1 of" not in text and callback.plan.summary().splitlines()[0] in text


def test_a_second_fit_reuses_the_rewritten_step_until_compile_or_options_change(devices):
    # Keras keeps a model's train function between fits; so does the callback, with its
    # rewritten one: no retrace, no replanning, same training as without the callback.
    plain, x, y = mlp(BATCH * 4)
    model, _, _ = mlp(BATCH * 4)
    options = {k: v for k, v in OPTIONS.items() if k != "batch_size"}  # sized by each fit
    callback = tflms.LMSCallback(**options)
    with tf.device(devices.compute):
        for fit in range(3):
            plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[callback])
            assert callback.reused is (fit > 0) and len(callback.traces) == 1
            assert weights_equal(plain, model)
        first_plan = callback.plan
        assert callback.summary().startswith("reused from an earlier fit")
        model.fit(x, y, batch_size=BATCH * 2, verbose=0, callbacks=[callback])  # other sizes
        assert not callback.reused and callback.plan.batch_size == BATCH * 2
        model.fit(x, y, batch_size=BATCH * 2, verbose=0, callbacks=[callback])
        assert callback.reused
        model.compile(optimizer="sgd", loss=model.loss, jit_compile=False)  # new compile: replan
        model.fit(x, y, batch_size=BATCH * 2, verbose=0, callbacks=[callback])
        assert not callback.reused and callback.plan is not first_plan
        other = tflms.LMSCallback(**{**options, "swapout_threshold": 4})
        model.fit(x, y, batch_size=BATCH * 2, verbose=0, callbacks=[other])
        assert not other.reused
        model.fit(x, y, batch_size=BATCH * 2, verbose=0)  # and without: the model's own step
    assert not isinstance(model.train_function, GuardedTrainFunction)


def _unbuilt_sequential():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    return model


def test_a_model_built_by_its_first_step_trains_with_the_callback(devices):
    # A Sequential without Input has no variables before fit: Keras builds it (and its
    # optimizer) inside the first step. The callback must not build the optimizer over [].
    x = np.random.default_rng(0).normal(size=(BATCH * 2, 32)).astype("float32")
    y = np.zeros((BATCH * 2, 4), "float32")
    plain, lms = _unbuilt_sequential(), _unbuilt_sequential()
    with tf.device(devices.compute):
        plain.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False)
        lms.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=2,
            verbose=0,
            shuffle=False,
            callbacks=[tflms.LMSCallback(**{**OPTIONS, "min_tensor_bytes": 0})],
        )
        lms.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)  # and a plain fit after it
        plain.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    assert weights_equal(plain, lms)


class TwoOptimizers(keras.Model):
    """The GAN pattern: its own optimizers, compile() without one (Keras adds RMSprop)."""

    def __init__(self):
        super().__init__()
        self.generator = keras.layers.Dense(8)
        self.critic = keras.layers.Dense(1)
        self.g_opt = keras.optimizers.SGD(0.01)

    def call(self, x):
        return self.critic(self.generator(x))

    def train_step(self, data):
        x, _ = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x)))
        variables = self.generator.trainable_variables
        self.g_opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return {"loss": loss}


def test_an_optimizer_the_train_step_never_uses_is_not_built(devices):
    model = TwoOptimizers()
    model.compile(jit_compile=False)  # Keras fills in model.optimizer, which stays unused
    x = np.ones((BATCH * 2, 4), "float32")
    with tf.device(devices.compute):
        model.fit(
            x,
            x,
            batch_size=BATCH,
            verbose=0,
            callbacks=[tflms.LMSCallback(**{**OPTIONS, "min_tensor_bytes": 0})],
        )
    assert model.g_opt.built and not model.optimizer.built  # no model-sized unused slots


def test_mirrored_strategy_is_refused_at_fit_start_with_the_alternative():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model, x, y = mlp(BATCH * 2)
    with pytest.raises(ConfigError, match=r"2 replicas in one graph.*ddlrun -np N"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tflms.LMSCallback(**OPTIONS)])
    train_step, function, jit = _state(
        model
    )  # Keras made its own train function; we changed nothing
    assert train_step is None and jit is False and not isinstance(function, GuardedTrainFunction)
    model.fit(x, y, batch_size=BATCH, verbose=0)  # and it trains without the callback


def test_one_device_strategy_trains_with_swaps_and_identical_results(devices):
    # One replica, one graph: the plan is the one device's, as without a strategy. The
    # strategy places the step when it runs, not its ops, so the CPU stand-in for a GPU
    # is named (on a GPU machine unplaced ops are the GPU's, tflms's default).
    strategy = tf.distribute.OneDeviceStrategy(devices.compute)
    with strategy.scope():
        plain, x, y = mlp(BATCH * 4)
        model, _, _ = mlp(BATCH * 4)
    callback = tflms.LMSCallback(**OPTIONS, device=devices.compute, host_device=devices.host)
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.plan.swaps and callback.plan.batch_size == BATCH
    assert weights_equal(plain, model)
