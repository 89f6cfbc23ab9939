"""tflms.function: a tf.function whose traced graphs are rewritten."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, cnn_bn
from tests.tflms.models import tape_step
from tflms.errors import ConfigError

CONFIG = tflms.LMSConfig(
    batch_size=BATCH, swapout_threshold=8, swapin_ahead=3, min_tensor_bytes=1024
)


def custom_loop(decorate, steps=20):
    model, x, y = cnn_bn(BATCH * steps)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    train_step = decorate(tape_step(model, optimizer, loss_fn))

    losses = [
        float(train_step(x[i : i + BATCH], y[i : i + BATCH])) for i in range(0, len(x), BATCH)
    ]
    return model, losses, train_step


def test_custom_loop_trains_bitwise_identically(devices):
    with tf.device(devices.compute):
        plain, plain_losses, _ = custom_loop(tf.function)
        lms, lms_losses, step = custom_loop(tflms.function(config=CONFIG))
    assert lms_losses == plain_losses
    for a, b in zip(plain.get_weights(), lms.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert step.plans and all(isinstance(p, tflms.SwapPlan) for p in step.plans)
    x = tf.zeros([BATCH, 16, 16, 3])
    y = tf.zeros([BATCH], tf.int64)
    assert step.plan_for(x, y).swaps  # the concrete function in use was rewritten


def test_each_trace_gets_its_own_plan():
    @tflms.function(config=CONFIG.replace(swapout_threshold=2, min_tensor_bytes=0))
    def f(x):
        h = x
        for _ in range(6):
            h = tf.nn.relu(h @ tf.ones([h.shape[-1], h.shape[-1]]))
        return h + x

    f(tf.ones([2, 8]))
    f(tf.ones([2, 16]))
    assert len(f.plans) == 2
    assert f.plan_for(tf.ones([2, 8])) is not f.plan_for(tf.ones([2, 16]))
    assert f.__name__ == "f" and f.python_function.__name__ == "f"


def test_tf_function_options_pass_through():
    spec = [tf.TensorSpec([None, 4])]

    @tflms.function(config=CONFIG, input_signature=spec, reduce_retracing=True)
    def f(x):
        return tf.nn.relu(x)

    f(tf.ones([1, 4]))
    f(tf.ones([3, 4]))
    assert len(f.plans) == 1  # one signature, one trace


def test_methods_can_be_decorated():
    class Model:
        def __init__(self):
            self.w = tf.Variable(tf.ones([8, 8]))

        @tflms.function(config=CONFIG.replace(swapout_threshold=1, min_tensor_bytes=0))
        def step(self, x):
            h = x
            for _ in range(4):
                h = tf.nn.relu(h @ self.w)
            return tf.reduce_sum(h + x)

    m = Model()
    assert float(m.step(tf.ones([2, 8]))) > 0
    assert Model.step.plans


def test_jit_compile_is_refused():
    with pytest.raises(ConfigError, match="does not accept jit_compile=True"):
        tflms.function(lambda x: x, jit_compile=True)


def test_config_must_be_an_lms_config():
    with pytest.raises(ConfigError, match="config must be an LMSConfig"):
        tflms.function(lambda x: x, config={"swapin_ahead": 2})


class _Trainer(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([8, 8]))

    @tflms.function(config=CONFIG.replace(swapout_threshold=1, min_tensor_bytes=0))
    def step(self, x):
        first = h = tf.nn.relu(x @ self.w)
        for _ in range(4):
            h = tf.nn.relu(h @ self.w)
        return tf.reduce_sum(h * first)  # `first` lives long: worth a swap


def test_a_bound_method_keeps_the_lms_api():
    t = _Trainer()
    x = tf.ones([2, 8])
    t.step(x)
    plan = t.step.plan_for(x)  # on the bound method, not only through the class
    assert plan.swaps and plan in t.step.plans
    assert isinstance(t.step, tflms.LMSFunction) and t.step.config is _Trainer.step.config
    other = _Trainer()
    other.step(x)  # each instance traces its own graph, with its own plan
    assert other.step.plan_for(x) is not plan


def test_it_behaves_like_a_tf_function():
    spec = [tf.TensorSpec([4, 8])]

    @tflms.function(input_signature=spec)
    def f(x):
        return tf.nn.relu(x) * 2.0

    @tf.function(input_signature=spec)
    def g(x):
        return tf.nn.relu(x) * 2.0

    assert isinstance(f, tf.types.experimental.PolymorphicFunction)
    for name in ("input_signature", "function_spec", "python_function", "__name__", "__wrapped__"):
        assert hasattr(f, name), name
    assert f.input_signature == g.input_signature
    assert f.experimental_get_tracing_count() == 0
    np.testing.assert_array_equal(f(tf.ones([4, 8])), g(tf.ones([4, 8])))
    assert f.experimental_get_tracing_count() == 1
    assert f.get_concrete_function().structured_outputs.shape == [4, 8]


def test_a_module_with_an_lms_method_exports_as_a_saved_model(tmp_path):
    t = _Trainer()
    x = tf.ones([2, 8])
    expected = float(t.step(x))
    tf.saved_model.save(t, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    assert float(loaded.step(x)) == expected


def test_an_open_batch_dimension_is_refused_unless_the_batch_size_is_given():
    spec = [tf.TensorSpec([None, 64])]
    options = dict(swapout_threshold=1, min_tensor_bytes=0)

    def body(x):
        h = x
        for _ in range(4):
            h = tf.nn.relu(h @ tf.ones([64, 64]))
        return h + x

    f = tflms.function(body, config=tflms.LMSConfig(**options), input_signature=spec)
    with pytest.raises(
        ConfigError, match=r"batch size of .* is unknown.*LMSConfig\(batch_size=N\)"
    ):
        f(tf.ones([4, 64]))
    g = tflms.function(body, config=tflms.LMSConfig(batch_size=4, **options), input_signature=spec)
    g(tf.ones([4, 64]))
    assert g.plans[0].batch_size == 4
    shaped = tflms.function(body, config=tflms.LMSConfig(**options), reduce_retracing=True)
    shaped(tf.ones([4, 64]))  # the first trace has the call's shapes
    assert shaped.plans[0].batch_size == 4


def test_tf1_lms_on_an_empty_graph_says_what_to_do():
    from tflms.errors import UnsupportedGraphError

    with pytest.raises(UnsupportedGraphError, match="runs eagerly.*Did you mean"):
        tflms.LMS().run(tf.compat.v1.get_default_graph())
    with pytest.raises(UnsupportedGraphError, match="has no ops"):
        tflms.LMS().run(tf.Graph())


@pytest.mark.parametrize(
    "option", [dict(host_device="/device:CPU:7"), dict(device="/device:GPU:3")]
)
def test_devices_the_machine_lacks_are_refused_when_a_live_graph_is_planned(option):
    g = tf.Graph()
    with g.as_default():
        tf.nn.relu(tf.compat.v1.placeholder(tf.float32, [4, 4]))
    with pytest.raises(ConfigError, match="is not a device of this machine; its logical devices"):
        tflms.LMS(**option).run(g)
