"""``DistributedOptimizer(sharding=...)`` in one process: the plan, the refusals, checkpoints.

Training on real ranks against replicated training: tests/parallel/test_ddl_sharding.py.
"""

import keras
import numpy as np
import pytest

import ddl_tf.keras as hvd
from ddl_tf.errors import ConfigError
from ddl_tf.keras.shard_plan import ShardPlan, first_difference, variable_signature


@pytest.fixture
def ddl():
    hvd.init()
    yield hvd
    hvd.shutdown()


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 6)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")


def test_the_plan_balances_bytes_and_is_the_same_on_every_rank():
    variables = [keras.Variable(np.zeros(n, "float32")) for n in (100, 10, 60, 50, 5, 5)]
    plans = [ShardPlan.balance(variables, size=3, rank=r) for r in range(3)]
    assert len({p.owners for p in plans}) == 1
    assert sorted(i for p in plans for i in p.mine()) == list(range(6))
    loads = [plans[0].bytes_of(r) for r in range(3)]
    assert sum(loads) == 230 * 4 and max(loads) == 100 * 4  # the largest alone, the rest shared
    assert ShardPlan.balance(variables, size=8, rank=7).mine() == []  # more ranks than variables


@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_one_process_sharded_fit_equals_plain_keras_and_saves_the_replicated_layout(
    ddl, tmp_path, sharding
):
    x, y = _data()
    plain = _model()
    plain.compile(optimizer=keras.optimizers.AdamW(0.01, global_clipnorm=0.1), loss="mse")
    plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    sharded = _model()
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.AdamW(0.01, global_clipnorm=0.1), sharding=sharding
    )
    sharded.compile(optimizer=optimizer, loss="mse")
    sharded.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), sharded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert optimizer.sharding == sharding
    assert optimizer.get_config()["optimizer"]["config"]["global_clipnorm"] == 0.1

    path = tmp_path / "model.keras"
    hvd.save_model(sharded, path)
    loaded = hvd.load_model(path)
    assert loaded.optimizer.sharding == sharding
    expected = [np.asarray(v) for v in plain.optimizer.variables]
    state = loaded.optimizer.inner_optimizer.gathered_values()
    for a, b in zip(expected, state, strict=True):
        np.testing.assert_array_equal(a, b)
    # a replicated DistributedOptimizer reads the same file
    replicated = _model()
    replicated.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(0.01)), loss="mse")
    replicated.optimizer.build(replicated.trainable_variables)
    replicated.load_weights(path)
    for a, b in zip(expected, replicated.optimizer.inner_optimizer.variables, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_what_sharding_cannot_do_is_refused_with_the_fix(ddl):
    with pytest.raises(ConfigError, match="sharding must be None"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), sharding="weights")
    with pytest.raises(ConfigError, match="Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), sharding="optimizer", op=hvd.Adasum)
    with pytest.raises(ConfigError, match="use_ema"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(use_ema=True), sharding="optimizer")
    clipped = keras.optimizers.Adam(global_clipnorm=1.0, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        hvd.DistributedOptimizer(clipped, sharding="gradients")
    model = _model()
    partial = hvd.PartialDistributedOptimizer(
        keras.optimizers.SGD(), local_layers=[model.layers[0]], sharding="optimizer"
    )
    model.compile(optimizer=partial, loss="mse")
    with pytest.raises(ConfigError, match="local variables"):
        model.fit(*_data(), verbose=0)


def test_a_sharded_optimizer_refuses_variables_it_was_not_built_with(ddl):
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), sharding="optimizer")
    a, b = keras.Variable([1.0]), keras.Variable([2.0])
    optimizer.apply([keras.ops.ones(1)], [a])
    with pytest.raises(ConfigError, match="built on other variables"):
        optimizer.apply([keras.ops.ones(1)], [b])


def test_variable_lists_that_differ_between_ranks_are_named_by_their_first_difference():
    keras.utils.set_random_seed(0)
    a = variable_signature(_model().trainable_variables)
    assert first_difference([a, a, a]) is None
    shorter = first_difference([a, a, a[:3]])
    assert shorter == (
        "rank 0 has 4 trainable variables but rank 2 has 3 "
        f"(the first one only rank 0 has: {a[3][0]!r})"
    )
    longer = [*a, ("extra/bias", (2,), "float32")]
    assert "rank 1 has 5 (the first one only rank 1 has: 'extra/bias')" in first_difference(
        [a, longer]
    )
    half = [(path, shape, "float16") for path, shape, _ in a]
    assert first_difference([a, half]).startswith(f"variable #0 is {a[0][0]!r} float32")


class _WithUnused(keras.layers.Layer):
    """A Dense whose second kernel gets no gradient (a branch the loss does not use)."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 2), initializer="ones")
        self.unused = self.add_weight(shape=(3,), initializer="ones")

    def call(self, x):
        return x @ self.kernel


@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_a_variable_without_gradient_is_left_alone_as_keras_leaves_it(ddl, sharding):
    x, y = _data()
    weights = {}
    for label, wrap in (("plain", lambda o: o), ("sharded", None)):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), _WithUnused()])
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        if wrap is None:
            optimizer = hvd.DistributedOptimizer(optimizer, sharding=sharding)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        weights[label] = model.get_weights()
    np.testing.assert_array_equal(weights["plain"][1], np.ones(3, "float32"))
    for a, b in zip(weights["plain"], weights["sharded"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_sharding_wraps_only_wrappers_that_update_each_variable_alone(ddl):
    class Wrapping(keras.optimizers.Optimizer):
        def __init__(self, inner):
            super().__init__(learning_rate=0.0)
            self.inner_optimizer = inner

    with pytest.raises(ConfigError, match="per_variable_update"):
        hvd.DistributedOptimizer(Wrapping(keras.optimizers.SGD()), sharding="optimizer")
    from tflms.keras import OffloadedOptimizer

    clipped = OffloadedOptimizer(keras.optimizers.AdamW(global_clipnorm=1.0))
    sharded = hvd.DistributedOptimizer(clipped, sharding="gradients")
    config = sharded.get_config()["optimizer"]["config"]["optimizer"]["config"]
    assert config["global_clipnorm"] == 1.0  # saved where the user set it
