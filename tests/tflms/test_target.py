"""``Target``: the device, link, budget, accounting and stack, resolved once.

The keyword APIs (``tflms.simulate(view, device=..., link=...)``,
``tflms.autotune(view, budget, ...)``, ``LMSConfig(memory_budget=...)``) build
a target; passing one must give the same answers as the keywords it stands for.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tflms
from tflms.cost.gpu_memory import STACKS
from tflms.cost.target import DEFAULT_DEVICE, Target
from tflms.errors import ConfigError


@pytest.fixture(scope="module")
def view():
    g = tf.Graph()
    with g.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [256, 1024], name="x")
        keep = []
        for i in range(12):
            h = tf.nn.relu(h * 1.5, name=f"act{i}")
            keep.append(h)
        for i, k in enumerate(reversed(keep)):
            h = tf.maximum(h, k, name=f"back{i}")
    return tflms.build_view(g)


def test_a_budget_preset_names_the_device_and_the_realistic_accounting():
    target = Target.for_budget("a100-80gb")
    assert target.device.name == "A100-80GB" == target.budget_preset
    assert target.budget_bytes == 80 << 30 and target.accounting == "realistic"
    in_bytes = Target.for_budget("16GiB")
    assert in_bytes.device.name == DEFAULT_DEVICE and in_bytes.accounting == "tensors"
    assert in_bytes.budget_preset is None
    assert Target.for_budget(None).budget_bytes is None


def test_the_config_resolves_its_own_target():
    config = tflms.LMSConfig(memory_budget="V100-32GB", link="nvlink2", tensor_factor=1.5)
    target = config.target()
    assert (target.device.name, target.link.name) == ("V100-32GB", "nvlink2")
    assert target.stack.tensor_factor == 1.5 and target.stack.name == "tf2+calibrated"
    assert config.target(link="ideal", budget="16GiB", accounting="realistic").link.name == "ideal"
    with pytest.raises(ConfigError, match="tensor_factor=1.5 calibrates"):
        config.target(budget="16GiB")  # a size: judged by 'tensors', which has no calibration


def test_simulate_with_a_target_equals_simulate_with_its_keywords(view):
    by_keywords = tflms.simulate(view, device="A100-80GB", link="nvlink2", stack="tf1")
    target = Target.for_device("A100-80GB", "nvlink2", stack=STACKS["tf1"])
    by_target = tflms.simulate(view, target=target)
    assert by_target.device_peak_bytes == by_keywords.device_peak_bytes
    assert by_target.step_time_s == by_keywords.step_time_s
    assert by_target.accounting == "realistic" == by_keywords.accounting
    with pytest.raises(ConfigError, match="not both"):
        tflms.simulate(view, device="A100-80GB", target=target)


def test_autotune_with_a_target_equals_autotune_with_its_keywords(view):
    config = tflms.LMSConfig(safety_margin=0)
    by_keywords = tflms.autotune(view, "12MiB", config=config, link="nvlink2")
    by_target = tflms.autotune(
        view, config=config, target=config.target(budget="12MiB", link="nvlink2")
    )
    assert by_target.plan == by_keywords.plan and by_target.config == by_keywords.config
    assert by_target.result.device_peak_bytes == by_keywords.result.device_peak_bytes
    assert by_keywords.target == by_target.target and by_target.link == "nvlink2"
    with pytest.raises(ConfigError, match="not both"):
        tflms.autotune(view, "12MiB", target=by_target.target)
    budgeted = tflms.LMSConfig(memory_budget="12MiB")
    with pytest.raises(ConfigError, match="No memory budget"):  # the target's, not the config's
        tflms.autotune(view, config=budgeted, target=Target.for_device())


def test_errors_name_the_fix():
    with pytest.raises(ConfigError, match="Unknown device model 'P100'"):
        Target.for_device("P100")
    with pytest.raises(ConfigError, match="accounting must be one of"):
        Target.for_device(accounting="bytes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Received 'lots'"):
        Target.for_budget("lots")


def test_autotune_plans_every_candidate_on_its_own_target(view, monkeypatch):
    """Recomputations are timed on the device autotune was given, not the config's default."""
    from tflms.compose import levers

    seen = []
    original = levers.plan_recomputes

    def spy(view, config, target, **options):
        seen.append(target.device.name)
        return original(view, config, target, **options)

    monkeypatch.setattr(levers, "plan_recomputes", spy)
    budget = tflms.simulate(view, device="A100-80GB", accounting="tensors").device_peak_bytes
    config = tflms.LMSConfig(min_tensor_bytes=0)
    tuned = tflms.autotune(view, budget // 2, config=config, device="A100-80GB", safety_margin=0)
    assert seen and set(seen) == {"A100-80GB"}, seen
    assert tuned.target.device.name == "A100-80GB"


def test_the_callbacks_simulation_uses_the_target_its_plan_was_made_for(view):
    import weakref

    from tflms.keras.callback import LMSCallback, Trace

    callback = LMSCallback(memory_budget="A100-80GB", link="nvlink2")
    graph = tf.Graph()
    callback.traces.append(Trace(tflms.SwapPlan(), None, view, weakref.ref(graph), ()))
    result = callback.simulate()
    expected = tflms.simulate(view, target=callback.config.target())
    assert result == expected
    assert result.device == "A100-80GB"
    assert callback.simulate(link="pcie3") == tflms.simulate(
        view, target=callback.config.target(link="pcie3")
    )


def test_a_fit_with_a_budget_resolves_its_target_once_for_every_trace(monkeypatch):
    """The walk of ``memory_budget`` from LMSCallback: the target is resolved when fit
    begins, and every traced step is planned and auto-tuned on that very target."""
    from tflms import zoo

    made = []
    resolve = Target.for_budget.__func__

    def counted(cls, *args, **kwargs):
        made.append((args, kwargs))
        return resolve(cls, *args, **kwargs)

    monkeypatch.setattr(Target, "for_budget", classmethod(counted))
    model = zoo.mlp(features=64, widths=(256, 256))
    x, y = zoo.synthetic_data(model, 24)
    lms = tflms.LMSCallback(memory_budget="1GiB")
    # 24 samples in batches of 16: a full and a partial batch, two traces at most
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[lms], shuffle=False)
    assert len(made) == 1, made
    assert lms.tunings and all(t.target is lms.tunings[0].target for t in lms.tunings)


def test_a_decorated_function_resolves_its_target_once_for_all_its_traces(monkeypatch):
    made = []
    resolve = Target.for_budget.__func__

    def counted(cls, *args, **kwargs):
        made.append(args)
        return resolve(cls, *args, **kwargs)

    monkeypatch.setattr(Target, "for_budget", classmethod(counted))
    w = tf.Variable(tf.ones([64, 64]))

    @tflms.function(config=tflms.LMSConfig(memory_budget="1GiB"))
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(x @ w) @ w)
        w.assign_sub(1e-3 * tape.gradient(loss, w))
        return loss

    for rows in (8, 16):  # two input shapes: two traces, each planned and auto-tuned
        step(tf.ones([rows, 64]))
    assert len(step.plans) == 2
    assert len(made) == 1, made
