"""Optimizer state on the host (``LMSConfig(offload_optimizer=True)``, ``OffloadedOptimizer``).

The test stand-in for a GPU is a second logical CPU device (tests/harness.py):
the weights live on the "device" (``CPU:1``), the optimizer state on the
host (``CPU:0``). Both run the same CPU kernels, so training must be bit for
bit that of plain training.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms.errors import ConfigError, PlanInfeasibleError
from tflms.keras import OffloadedOptimizer, offload_state
from tflms.keras.offload import is_offloaded, variable_bytes
from tflms.utils.devices import same_device

BATCH = 8


def _model(devices, seed=3):
    keras.utils.set_random_seed(seed)
    with tf.device(devices.compute):  # the weights live on the device
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(64, activation="gelu"),
                keras.layers.LayerNormalization(),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(BATCH * 6, 16)).astype("float32"), rng.normal(
        size=(BATCH * 6, 4)
    ).astype("float32")


def _fit(model, devices, callbacks=()):
    x, y = _data()
    with tf.device(devices.compute):
        model.fit(
            x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=list(callbacks)
        )


def _slot_devices(optimizer):
    return {v.value.device for v in optimizer.variables if len(v.shape)}


def _same_weights(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


@pytest.mark.parametrize(
    "make", [lambda: keras.optimizers.AdamW(0.01), lambda: keras.optimizers.RMSprop(0.01)]
)
def test_an_offloaded_optimizer_keeps_its_state_on_the_host_and_trains_bitwise(devices, make):
    plain = _model(devices)
    plain.compile(optimizer=make(), loss="mse")
    _fit(plain, devices)
    model = _model(devices)
    model.compile(optimizer=OffloadedOptimizer(make(), host_device=devices.host), loss="mse")
    _fit(model, devices)
    assert _same_weights(plain, model)
    assert all(same_device(d, devices.host) for d in _slot_devices(model.optimizer))
    assert all(same_device(v.value.device, devices.compute) for v in model.trainable_variables)
    assert int(model.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy()) == 12


def test_lms_callback_moves_a_built_optimizer_to_the_host_and_the_plan_sees_it_gone(
    devices, caplog
):
    plain = _model(devices)
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    _fit(plain, devices)
    options = dict(batch_size=BATCH, device=devices.compute, host_device=devices.host)
    kept = tflms.LMSCallback(**options)
    model = _model(devices)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    _fit(model, devices, [kept])
    moved = tflms.LMSCallback(**options, offload_optimizer=True)
    offloaded = _model(devices)
    offloaded.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    with caplog.at_level("WARNING", logger="tflms"):
        _fit(offloaded, devices, [moved])
    assert "moved the optimizer's state" not in caplog.text  # fit builds it in its first step
    trained = _model(devices)
    trained.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    _fit(trained, devices)  # its state is built, on the device
    with caplog.at_level("WARNING", logger="tflms"):
        _fit(trained, devices, [tflms.LMSCallback(**options, offload_optimizer=True)])
    assert "moved the optimizer's state" in caplog.text  # it had to fit there once
    assert all(same_device(d, devices.host) for d in _slot_devices(trained.optimizer))
    assert isinstance(offloaded.optimizer, OffloadedOptimizer)
    assert all(same_device(d, devices.host) for d in _slot_devices(offloaded.optimizer))
    assert _same_weights(plain, offloaded) and _same_weights(plain, model)
    # the simulator counts each variable where it lives: Adam's two slots per weight left
    weights = sum(v.numpy().nbytes for v in offloaded.trainable_variables)
    on_device = kept.simulate().variable_bytes
    offloaded_on_device = moved.simulate().variable_bytes
    assert on_device - offloaded_on_device >= 2 * weights
    assert offloaded_on_device >= weights
    # ... and counts them on the host, which holds them all step long
    assert moved.simulate().host_peak_bytes >= 2 * weights > kept.simulate().host_peak_bytes


def test_mixed_precision_keeps_the_loss_scale_on_the_device_and_trains_bitwise(devices):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        plain = _model(devices)
        plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        _fit(plain, devices)
        model = _model(devices)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        offload_state(model, devices.host)
        _fit(model, devices)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, OffloadedOptimizer)
    assert _same_weights(plain, model)
    assert float(model.optimizer.dynamic_scale.numpy()) == float(
        plain.optimizer.dynamic_scale.numpy()
    )


def test_a_saved_offloaded_model_loads_with_its_state(devices, tmp_path):
    model = _model(devices)
    model.compile(optimizer=OffloadedOptimizer(keras.optimizers.AdamW(0.01)), loss="mse")
    _fit(model, devices)
    path = tmp_path / "offloaded.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.optimizer, OffloadedOptimizer)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_what_cannot_offload_is_refused_with_the_fix(devices):
    built = keras.optimizers.Adam()
    built.build([keras.Variable(np.zeros(2, "float32"))])
    with pytest.raises(ConfigError, match="offload_state"):
        OffloadedOptimizer(built)
    with pytest.raises(ConfigError, match="OffloadedOptimizer"):
        tflms.function(lambda: None, config=tflms.LMSConfig(offload_optimizer=True))
    with pytest.raises(ConfigError, match="offload_optimizer must be True, False or None"):
        tflms.LMSConfig(offload_optimizer="yes")


def test_lms_callback_offloads_under_ddl_tfs_distributed_optimizer(devices):
    import ddl_tf.keras as hvd

    hvd.init()
    try:
        plain = _model(devices)
        plain.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        _fit(plain, devices)
        model = _model(devices)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        callback = tflms.LMSCallback(
            batch_size=BATCH,
            device=devices.compute,
            host_device=devices.host,
            offload_optimizer=True,
        )
        _fit(model, devices, [callback])
        assert isinstance(model.optimizer, hvd.DistributedOptimizer)  # it still reduces
        assert isinstance(model.optimizer.inner_optimizer, OffloadedOptimizer)
        assert _same_weights(plain, model)
        sharded = _model(devices)
        sharded.compile(
            optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), sharding="optimizer"),
            loss="mse",
        )
        with pytest.raises(ConfigError, match="sharded across ranks"):
            _fit(sharded, devices, [callback])
    finally:
        hvd.shutdown()


def test_the_simulator_times_the_gradients_crossing_to_the_host_update(devices):
    model = _model(devices)
    model.compile(
        optimizer=OffloadedOptimizer(keras.optimizers.Adam(0.01), host_device=devices.host),
        loss="mse",
    )
    callback = tflms.LMSCallback(
        batch_size=BATCH,
        device=devices.compute,
        host_device=devices.host,
        swap=False,
        recompute=True,
    )
    _fit(model, devices, [callback])
    from tflms.simulation.schedule import compile_view, relinked

    slow = compile_view(callback.view, device="V100-16GB", link="pcie3")
    fast = compile_view(callback.view, device="V100-16GB", link="nvlink2")
    crossing = [i for i, b in enumerate(slow.crossing) if b]
    weights = sum(v.numpy().nbytes for v in model.trainable_variables)
    # every gradient goes to the host once, and every updated weight comes back
    assert sum(slow.crossing) >= 2 * weights
    assert {slow.lanes[i] for i in crossing} <= {"host", "compute"}
    assert sum(slow.durations[i] for i in crossing) > sum(fast.durations[i] for i in crossing)
    again = relinked(slow, callback.view, "nvlink2")  # what the plan simulator reuses
    assert again.durations == pytest.approx(fast.durations, rel=1e-12)


# ------------------------------------------------- a memory budget moves the state itself

MiB = 1 << 20


def _wide(devices, optimizer):
    """Weights that dwarf the activations: AdamW's state decides whether the step fits.

    Simulated (tensors accounting): weights 5.0 MiB, AdamW's state 10.0 MiB;
    at batch 8 the step peaks at 25.1 MiB with the state on the device (no
    plan lower) and 10.1 MiB with it on the host; at batch 256, 25.4 and 12.3.
    """
    keras.utils.set_random_seed(5)
    with tf.device(devices.compute):
        model = keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    return model


def _fit_wide(model, devices, callbacks=(), batch=BATCH):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4 * batch, 256)).astype("float32")
    y = rng.normal(size=(4 * batch, 4)).astype("float32")
    with tf.device(devices.compute):
        model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=list(callbacks))


def _budget(devices, budget, **options):
    return tflms.LMSCallback(
        memory_budget=budget,
        safety_margin=0.0,
        device=devices.compute,
        host_device=devices.host,
        **options,
    )


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_state_that_cannot_fit_beside_the_weights_is_built_on_the_host(devices, caplog, policy):
    # weights + gradients + state = 20.1 MiB > 16: the state is never made on the device
    keras.mixed_precision.set_global_policy(policy)
    try:
        plain = _wide(devices, keras.optimizers.AdamW(1e-3))
        _fit_wide(plain, devices)
        optimizer = keras.optimizers.AdamW(1e-3)
        model = _wide(devices, optimizer)
        callback = _budget(devices, 16 * MiB)
        with caplog.at_level("WARNING", logger="tflms"):
            _fit_wide(model, devices, [callback])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    offloaded = model.optimizer
    if policy == "mixed_float16":  # the loss scale stays on the device, around it
        assert float(offloaded.dynamic_scale.numpy()) == float(
            plain.optimizer.dynamic_scale.numpy()
        )
        offloaded = offloaded.inner_optimizer
    assert isinstance(offloaded, OffloadedOptimizer)
    assert offloaded.inner_optimizer is optimizer  # the user's optimizer, state on the host
    assert all(same_device(d, devices.host) for d in _slot_devices(optimizer))
    assert "LMSCallback built that state on" in caplog.text
    assert callback.summary().startswith("memory_budget: the weights (5.02 MiB)")
    assert "10.05 MiB on the host (the optimizer's state" in callback.tuning.summary()
    assert _same_weights(plain, model)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_state_that_fits_beside_the_weights_goes_to_the_host_when_activations_leave_no_plan(
    devices, caplog, policy
):
    # weights + gradients + state = 20.1 MiB fit 22, but with the state on the device the step
    # peaks at 25.4 MiB at least; with it on the host, 12.3: a trace with a copy of the
    # optimizer, planned on the device, finds that out before the user's state is built
    keras.mixed_precision.set_global_policy(policy)
    try:
        optimizer = keras.optimizers.AdamW(1e-3)
        model = _wide(devices, optimizer)
        callback = _budget(devices, 22 * MiB)
        with caplog.at_level("WARNING", logger="tflms"):
            _fit_wide(model, devices, [callback], batch=256)
        plain = _wide(devices, keras.optimizers.AdamW(1e-3))
        _fit_wide(plain, devices, batch=256)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert "no plan fits the step (the best peaks at" in caplog.text
    assert callback.state_moved is not None and "fit beside each other" in callback.state_moved
    offloaded = model.optimizer
    if policy == "mixed_float16":  # the loss scale stays on the device, around it
        offloaded = offloaded.inner_optimizer
    assert isinstance(offloaded, OffloadedOptimizer) and offloaded.inner_optimizer is optimizer
    assert all(same_device(d, devices.host) for d in _slot_devices(optimizer))
    assert callback.tuning.result.device_peak_bytes <= 22 * MiB
    assert _same_weights(plain, model)


def test_a_state_that_fits_with_the_activations_stays_on_the_device(devices):
    # batch 8: 25.1 MiB with the state on the device fits 26, so nothing moves; the copy the
    # first trace planned is gone, the user's optimizer built once, on the device
    optimizer = keras.optimizers.AdamW(1e-3)
    model = _wide(devices, optimizer)
    callback = _budget(devices, 26 * MiB)
    _fit_wide(model, devices, [callback])
    assert callback.state_moved is None
    assert model.optimizer is optimizer and not is_offloaded(optimizer)
    assert all(same_device(d, devices.compute) for d in _slot_devices(optimizer))
    plain = _wide(devices, keras.optimizers.AdamW(1e-3))
    _fit_wide(plain, devices)
    assert _same_weights(plain, model)


def test_a_state_built_on_the_device_stays_there_and_the_error_says_what_would_fit(devices):
    # an optimizer built by an earlier fit cannot move: the error names the route that works
    optimizer = keras.optimizers.AdamW(1e-3)
    model = _wide(devices, optimizer)
    _fit_wide(model, devices)  # its state is built on the device now
    with pytest.raises(PlanInfeasibleError, match="a plan may fit") as refused:
        _fit_wide(model, devices, [_budget(devices, 22 * MiB)], batch=256)
    assert "LMSCallback(offload_optimizer=True)" in str(refused.value)
    assert model.optimizer is optimizer and not is_offloaded(optimizer)
    assert all(same_device(d, devices.compute) for d in _slot_devices(optimizer))


def test_a_budget_leaves_the_state_where_it_is_when_forbidden_or_when_moving_it_cannot_help(
    devices,
):
    optimizer = keras.optimizers.AdamW(1e-3)
    model = _wide(devices, optimizer)
    with pytest.raises(PlanInfeasibleError, match="offload_optimizer=True") as forbidden:
        _fit_wide(model, devices, [_budget(devices, 16 * MiB, offload_optimizer=False)])
    assert "Moving the optimizer's state" not in str(forbidden.value)
    with pytest.raises(PlanInfeasibleError, match="would not be enough"):
        _fit_wide(model, devices, [_budget(devices, 4 * MiB)])  # the weights alone are 5 MiB
    assert model.optimizer is optimizer and not is_offloaded(optimizer)
    assert all(same_device(d, devices.compute) for d in _slot_devices(optimizer))


def test_an_optimizer_wrapped_for_a_fit_that_plans_nothing_comes_back_unwrapped(devices):
    # the device fits once the state is on the host, but the host then pins 15 MiB: over 12
    optimizer = keras.optimizers.AdamW(1e-3)
    model = _wide(devices, optimizer)
    callback = _budget(devices, 16 * MiB, host_memory_budget=12 * MiB)
    with pytest.raises(PlanInfeasibleError, match="host_memory_budget"):
        _fit_wide(model, devices, [callback])
    assert callback.state_moved is None
    assert model.optimizer is optimizer and not is_offloaded(optimizer)
    plain = _wide(devices, keras.optimizers.AdamW(1e-3))
    plain.optimizer.build(plain.trainable_variables)
    for a, b in zip(optimizer.variables, plain.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # nothing trained, nothing lost
    _fit_wide(model, devices)  # and the model trains without LMS (its state on the host)
    _fit_wide(plain, devices)
    assert _same_weights(plain, model)


def test_the_simulator_counts_a_state_only_the_loss_scale_cond_reads(devices):
    # under mixed_float16 Keras updates behind a cond: the slots are read inside its
    # branch functions alone, and still live on the device all step
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _wide(devices, keras.optimizers.AdamW(1e-3))
        callback = tflms.LMSCallback(
            device=devices.compute, host_device=devices.host, swap=False, recompute=True
        )
        _fit_wide(model, devices, [callback])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = variable_bytes(model.trainable_variables)
    simulated = callback.simulate(accounting="tensors")
    assert simulated.variable_bytes >= 3 * weights  # the weights and AdamW's two slots
