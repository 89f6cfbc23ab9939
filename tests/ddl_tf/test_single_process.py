"""The Horovod API in one process (MPI singleton): semantics, graph structure, Keras pieces."""

import importlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
import ddl_tf.keras as hvd_keras
from ddl_tf.core import basics
from ddl_tf.core.numerics.aligned import BufferPool, aligned_empty
from ddl_tf.errors import ConfigError, NotInitializedError
from ddl_tf.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from ddl_tf.tensorflow import bridge


@pytest.fixture
def ddl():
    hvd.init()
    yield hvd
    hvd.shutdown()


def test_importing_ddl_tf_starts_neither_mpi_nor_tensorflow():
    code = (
        "import sys, ddl_tf, ddl_tf.keras.callbacks, ddl_tf.ddlrun; "
        "print('mpi4py.MPI' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    core = "import sys, ddl_tf, ddl_tf.core.collectives.engine, ddl_tf.ddlrun; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", core], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_queries_before_init_name_the_fix():
    assert not hvd.is_initialized()
    with pytest.raises(NotInitializedError, match="Call ddl_tf.init()"):
        hvd.rank()


def test_init_is_idempotent_and_single_process_values(ddl):
    assert hvd.init() is basics.engine()
    assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank()) == (1, 0, 1, 0)
    assert (hvd.cross_size(), hvd.cross_rank(), hvd.is_homogeneous()) == (1, 0, True)
    assert hvd.mpi_built() and not hvd.nccl_built()
    with pytest.raises(ConfigError, match="must be a ddl_tf ProcessSet"):
        hvd.allreduce(tf.ones(2), process_set=object())


def test_collectives_preserve_dtype_and_shape_eagerly(ddl):
    for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
        x = tf.reshape(tf.cast(tf.range(6), dtype), [2, 3])
        y = hvd.allreduce(x, compression=hvd.Compression.fp16)
        assert y.dtype == dtype and y.shape == (2, 3)
    ints = hvd.allreduce(tf.constant([1, 2]), op=hvd.Sum)
    assert ints.dtype == tf.int32
    assert hvd.allreduce(tf.constant([1, 2])).numpy().tolist() == [1, 2]  # Horovod: int Average
    assert hvd.allgather(tf.zeros([0, 4])).shape == (0, 4)
    assert hvd.broadcast_object([1, "a"]) == [1, "a"]
    assert hvd.allgather_object({"r": 0}) == [{"r": 0}]
    received, splits = hvd.alltoall(tf.ones([3, 2]), splits=[3])
    assert received.shape == (3, 2) and splits.numpy().tolist() == [3]
    hvd.barrier()


def test_eager_collectives_copy_the_data_once_and_never_write_into_inputs(ddl):
    x = tf.random.uniform([1 << 16])
    view = bridge._to_numpy(x)  # a host tensor is read in place, read-only
    assert np.shares_memory(view, np.asarray(memoryview(x))) and not view.flags.writeable
    before = x.numpy()
    for kwargs in (
        {},
        {"op": hvd.Sum},
        {"compression": hvd.Compression.fp16},
        {"prescale_factor": 3.0, "postscale_factor": 0.5},
    ):
        y = hvd.allreduce(x, **kwargs)
        assert y.shape == x.shape
    assert x.numpy().tobytes() == before.tobytes()
    y = hvd.grouped_allreduce([x, tf.ones([3, 5]), tf.zeros([0])], op=hvd.Sum)
    assert [t.shape for t in y] == [(1 << 16,), (3, 5), (0,)]
    # results adopt the engine's aligned buffer instead of being copied once more ...
    buf = aligned_empty(1000, np.float32)
    buf[:] = 1
    adopted = bridge._to_tensor(buf, tf.float32)
    buf[0] = 42
    assert float(adopted[0]) == 42
    # ... and are copied when TensorFlow could not adopt them safely
    misaligned = np.ones(1001, np.float32)[1:]
    copied = bridge._to_tensor(misaligned, tf.float32)
    misaligned[0] = 42
    assert float(copied[0]) == 1
    read_only = aligned_empty(4, np.float32)
    read_only[:] = 1
    read_only.flags.writeable = False
    assert float(bridge._to_tensor(read_only, tf.float32)[0]) == 1
    half = bridge._to_tensor(aligned_empty(3, tf.bfloat16.as_numpy_dtype), tf.bfloat16)
    assert half.dtype == tf.bfloat16 and half.shape == (3,)


def test_result_buffers_are_reused_only_once_tensorflow_released_them():
    pool = BufferPool(1 << 30, min_bytes=0)
    first = pool.take(1 << 16, np.float32)
    address = first.ctypes.data
    eager = bridge._to_tensor(first, tf.float32)  # adopted: TensorFlow holds the buffer
    del first
    assert pool.take(1 << 16, np.float32).ctypes.data != address
    graph_out = tf.function(
        lambda: tf.numpy_function(lambda: pool.take(1 << 16, np.float32), [], tf.float32)
    )()
    held = np.asarray(memoryview(graph_out)).ctypes.data
    del eager
    again = pool.take(1 << 16, np.float32)
    assert again.ctypes.data == address  # the eager tensor is gone: its buffer comes back
    assert pool.take(1 << 16, np.float32).ctypes.data != held  # the graph output still lives
    del graph_out, again


def test_graph_collectives_are_chained_in_program_order(ddl):
    @tf.function
    def step(x):
        a = hvd.allreduce(x, name="first")
        b = hvd.allgather(x, name="second")
        c = hvd.broadcast(x, 0, name="third")
        return a, b, c

    x = tf.ones([2])
    step(x)
    graph = step.get_concrete_function(x).graph
    chain = bridge.collective_ops(graph)
    assert [op.name for op in chain] == [
        "DDLAllreduce_first",
        "DDLAllgather_second",
        "DDLBroadcast_third",
    ]
    assert chain[0] in chain[1].control_inputs and chain[1] in chain[2].control_inputs
    assert all(op.type == "PyFunc" for op in chain)


def test_collectives_inside_xla_are_refused_with_the_fix(ddl):
    @tf.function(jit_compile=True, autograph=False)
    def compiled(x):
        return hvd.allreduce(x)

    with pytest.raises(ConfigError, match="jit_compile=False"):
        compiled(tf.ones(2))


def test_gradients_flow_through_collectives(ddl):
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        s = tf.reduce_sum(hvd.allreduce(v * v) + hvd.allgather(v) + hvd.broadcast(v, 0))
        m = tf.reduce_sum(hvd.allreduce(v, op=hvd.Max))
    np.testing.assert_allclose(tape.gradient(s, v).numpy(), [4.0, 6.0])  # small integers: exact
    # Horovod 0.28.1 defines every allreduce's gradient as the allreduce of the gradient, same op
    np.testing.assert_allclose(tape.gradient(m, v).numpy(), [1.0, 1.0])


def test_distributed_optimizer_config_round_trip_and_save_load(ddl, tmp_path):
    opt = hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.5),
        compression=hvd.Compression.bf16,
        backward_passes_per_step=2,
    )
    clone = hvd_keras.DistributedOptimizer.from_config(opt.get_config())
    assert clone.backward_passes_per_step == 2 and clone.compression == "bf16"
    kept = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(), scale_local_gradients=False)
    assert (
        hvd_keras.DistributedOptimizer.from_config(kept.get_config()).scale_local_gradients is False
    )
    assert isinstance(clone.inner_optimizer, keras.optimizers.SGD)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = hvd_keras.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, hvd_keras.DistributedOptimizer)
    assert int(loaded.optimizer.iterations.numpy()) == 1
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    plain.compile(optimizer="sgd", loss="mse")
    plain.save(tmp_path / "plain.keras")
    wrapped = hvd_keras.load_model(tmp_path / "plain.keras")
    assert isinstance(wrapped.optimizer, hvd_keras.DistributedOptimizer)
    wrapped.fit(np.ones((4, 3)), np.ones((4, 2)), epochs=1, verbose=0)


def test_ignored_horovod_options_warn_once_each(ddl, caplog):
    from ddl_tf.keras import optimizer as optimizer_module

    optimizer_module._IGNORED_WARNED.clear()
    with caplog.at_level("WARNING", logger="ddl_tf.keras.optimizer"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD())  # Horovod's defaults: silent
        assert not caplog.records
        for _ in range(2):
            hvd_keras.DistributedOptimizer(
                keras.optimizers.SGD(), device_dense="/gpu:0", num_groups=2, groups=None
            )
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one per kind of option, not per optimizer
    assert "device_dense='/gpu:0'" in messages[0] and "no device to choose" in messages[0]
    assert "num_groups=2" in messages[1] and "groups=" not in messages[1].split("num_groups")[0]


def test_distributed_optimizer_rejects_what_it_cannot_wrap(ddl):
    with pytest.raises(ConfigError, match="wraps Keras 3 optimizers"):
        hvd_keras.DistributedOptimizer(tf.Variable(1.0))
    with pytest.raises(ConfigError, match="backward_passes_per_step"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ConfigError, match="Average, Sum or Adasum"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)


def test_one_process_fit_equals_plain_keras_bitwise(ddl):
    def train(wrap):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.05, momentum=0.9)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(opt) if wrap else opt, loss="mse")
        rng = np.random.default_rng(0)
        model.fit(
            rng.normal(size=(32, 4)),
            rng.normal(size=(32, 1)),
            batch_size=8,
            epochs=2,
            shuffle=False,
            verbose=0,
        )
        return model.get_weights()

    for a, b in zip(train(True), train(False), strict=True):
        np.testing.assert_array_equal(a, b)


class _Model:
    """Just enough of a Keras model for calling callback hooks directly."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


def _sgd(lr=0.1, momentum=0.9):
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=momentum))
    opt.build([keras.Variable(np.ones(2, np.float32))])
    return opt


def test_warmup_ramps_from_lr_over_size_to_lr_and_logs_it(ddl, monkeypatch):
    monkeypatch.setattr(basics, "size", lambda: 4)
    cb = LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2, steps_per_epoch=10)
    cb.set_model(_Model(_sgd(0.4)))
    cb.on_train_begin()
    seen = []
    for epoch in range(3):
        cb.on_epoch_begin(epoch)
        for batch in range(10):
            cb.on_train_batch_begin(batch)
            seen.append(float(cb.model.optimizer.learning_rate))
    # learning rates live in float32 variables: one rounding from the Python value
    assert seen[0] == pytest.approx(0.4 / 4 * (0.1 * 3 / 2 + 1))
    assert seen[19] == pytest.approx(0.4)  # end of warmup: round value
    assert seen[20:] == [pytest.approx(0.4)] * 10
    assert seen == sorted(seen)
    logs = {}
    cb.on_epoch_end(2, logs)
    assert logs["learning_rate"] == pytest.approx(0.4)


def test_schedule_staircase_and_momentum_correction(ddl):
    opt = _sgd(0.1)
    velocity = opt.inner_optimizer.momentums[0]
    velocity.assign([1.0, 2.0])
    cb = LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=1)
    cb.set_model(_Model(opt))
    cb.on_train_begin()
    cb.on_epoch_begin(0)
    cb.on_train_batch_begin(0)
    assert float(opt.learning_rate) == pytest.approx(0.1)
    cb.on_epoch_begin(2)
    cb.on_train_batch_begin(0)
    assert float(opt.learning_rate) == pytest.approx(0.05)  # 0.1 * 0.5 ** (2 - 1)
    np.testing.assert_allclose(velocity.numpy(), [0.5, 1.0])  # rescaled by 0.05 / 0.1


def test_callbacks_validate_their_options():
    with pytest.raises(ConfigError, match="initial_lr > 0"):
        LearningRateScheduleCallback(initial_lr=0, multiplier=1.0)
    with pytest.raises(ConfigError, match="end_epoch > start_epoch"):
        LearningRateScheduleCallback(initial_lr=0.1, multiplier=1.0, start_epoch=3, end_epoch=2)
    with pytest.raises(ConfigError, match="root_rank"):
        BroadcastGlobalVariablesCallback(root_rank=-1)


def test_metric_average_and_broadcast_callbacks_in_one_process(ddl):
    logs = {"loss": 2.0, "accuracy": 0.5, "note": "text"}
    MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": 2.0, "accuracy": 0.5, "note": "text"}
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD()), loss="mse")
    cb = BroadcastGlobalVariablesCallback(0)
    cb.set_model(model)
    cb.on_train_begin()
    # an unbuilt optimizer holds nothing yet: its first step builds it alike on every rank,
    # where whatever builds it chooses (tflms's LMSCallback may build it on the host)
    assert cb.broadcast_done and not model.optimizer.built


def test_keras_module_mirrors_horovod_names():
    for name in (
        "init",
        "DistributedOptimizer",
        "callbacks",
        "load_model",
        "allreduce",
        "broadcast",
        "allgather",
        "Compression",
        "Average",
        "Sum",
    ):
        assert hasattr(hvd_keras, name), name
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd_keras.broadcast_global_variables(0)  # eagerly a RuntimeError, as in Horovod


def test_the_api_table_lists_exactly_what_basics_defines():
    import ddl_tf.tensorflow
    from ddl_tf.core import basics

    assert set(ddl_tf.tensorflow.BASICS) == set(basics.__all__) - {
        "engine",
        "job",
        "replace_job",
        "topology",
        "add_elastic_shutdown_hook",  # for the membership layer, not for users
    }
    for name, module in ddl_tf.tensorflow.API.items():
        assert name in importlib.import_module(module).__all__ or module.endswith(f".{name}"), name


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _fit_mixed(optimizer):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer, "mse", jit_compile=False)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model.fit(x, x[:, :1] * 2, batch_size=8, epochs=2, verbose=0, shuffle=False)
    return model


def test_a_wrapped_loss_scale_optimizer_trains_like_keras_own(ddl, mixed_float16):
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05), initial_scale=256)
    ours = _fit_mixed(hvd_keras.DistributedOptimizer(inner))
    assert type(ours.optimizer).__name__ == "DistributedLossScaleOptimizer"  # not wrapped twice
    plain = _fit_mixed(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05), initial_scale=256)
    )
    for a, b in zip(ours.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(ours.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy()) > 0


def test_a_distributed_loss_scale_optimizer_saves_its_reduction_and_keeps_local_layers(
    ddl, mixed_float16, tmp_path
):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    opt = hvd_keras.PartialDistributedOptimizer(
        keras.optimizers.SGD(0.05), local_layers=model.layers[0], op=hvd.Sum
    )
    assert type(opt).__name__ == "DistributedLossScaleOptimizer"
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD)  # reduced once, by the outer
    model.compile(opt, "mse", jit_compile=False)
    x = np.ones((8, 4), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "mixed.keras")
    loaded = hvd_keras.load_model(tmp_path / "mixed.keras")
    assert type(loaded.optimizer).__name__ == "DistributedLossScaleOptimizer"  # not wrapped again
    assert loaded.optimizer.reducer.op is hvd.Sum
    with pytest.raises(ConfigError, match="backward_passes_per_step > 1"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=2)


def test_a_policy_set_after_the_optimizer_is_refused_with_the_fix(ddl):
    late = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(ConfigError, match="after keras.mixed_precision.set_global_policy"):
            _fit_mixed(late)
    finally:
        keras.mixed_precision.set_global_policy("float32")
