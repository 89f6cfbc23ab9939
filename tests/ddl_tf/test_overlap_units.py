"""Overlap pieces in one process: the bucket plan, production order, settings, timeline marks."""

import json

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.config import DEFAULT_BUCKET_BYTES, DDLConfig
from ddl_tf.core.collectives.fusion import plan_gradient_buckets
from ddl_tf.core.timeline import Timeline, merge_traces
from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.functions import allreduce_gradients
from ddl_tf.tensorflow.overlap import production_levels, production_order, resolve


def members(buckets):
    return [b.members for b in buckets]


def test_buckets_follow_the_given_order_and_close_at_the_byte_limit():
    sizes = [100, 50, 50, 200, 10]
    assert members(plan_gradient_buckets([4, 3, 2, 1, 0], sizes, 200)) == [
        (4,),
        (3,),
        (2, 1, 0),
    ]
    assert members(plan_gradient_buckets([0, 1, 2, 3, 4], sizes, 0)) == [(i,) for i in range(5)]
    everything = plan_gradient_buckets([0, 1, 2, 3, 4], sizes, 1 << 30)
    assert members(everything) == [(0, 1, 2, 3, 4)] and everything[0].nbytes == 410


def test_sparse_and_unknown_sizes_travel_alone():
    buckets = plan_gradient_buckets([0, 1, 2, 3], [8, 8, None, 8], 100, alone=[0, 1, 0, 0])
    assert members(buckets) == [(0,), (1,), (2,), (3,)]


@pytest.mark.parametrize(
    ("order", "limit", "message"),
    [([0, 0], 10, "every gradient index once"), ([1, 0], -1, "bucket_bytes=-1")],
)
def test_bad_plans_are_refused(order, limit, message):
    with pytest.raises(ConfigError, match=message):
        plan_gradient_buckets(order, [1, 1], limit)


def test_production_order_of_a_real_backward_pass_is_last_layer_first():
    layers = [tf.Variable(tf.random.normal([8, 8]), name=f"w{i}") for i in range(4)]
    captured = {}

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for w in layers:
                h = tf.tanh(h @ w)
            loss = tf.reduce_sum(h)
        grads = tape.gradient(loss, layers)
        captured["levels"] = production_levels(grads)
        captured["order"] = production_order(grads)
        return loss

    step.get_concrete_function(tf.TensorSpec([2, 8]))
    assert captured["order"] == [3, 2, 1, 0]
    levels = captured["levels"]
    assert levels[3] < levels[2] < levels[1] < levels[0]


def test_ties_keep_list_order():
    captured = {}

    @tf.function
    def step(x):
        a, b = x * 2.0, x * 3.0  # same level
        captured["order"] = production_order([b, a])
        return a + b

    step.get_concrete_function(tf.TensorSpec([3]))
    assert captured["order"] == [0, 1]


def test_production_levels_skip_the_back_edge_of_a_tf1_while_loop():
    # A TF1 while loop (control flow v1: Enter/Merge/Switch/NextIteration/Exit) among a
    # gradient's ancestors: Merge reads NextIteration, whose input depends on Merge.
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
            _, looped = tf.compat.v1.while_loop(
                lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), [tf.constant(0), x]
            )
            grad = tf.gradients(tf.reduce_sum(looped * x), x)[0]
    finally:
        tf.compat.v1.enable_control_flow_v2()
    types = {op.type for op in graph.get_operations()}
    assert {"NextIteration", "Merge"} <= types  # the cycle is really there
    level_x, level_loop, level_grad = production_levels([x, looped, grad])
    assert level_x == 0 < level_loop < level_grad


def test_settings_come_from_the_environment_and_are_validated():
    assert DDLConfig().overlap is True and DDLConfig().bucket_bytes == DEFAULT_BUCKET_BYTES
    cfg = DDLConfig.from_env({"DDL_OVERLAP": "0", "DDL_BUCKET_BYTES": "1024"})
    assert (cfg.overlap, cfg.bucket_bytes) == (False, 1024)
    assert DDLConfig().fingerprint() != DDLConfig(overlap=False).fingerprint()
    assert DDLConfig().fingerprint() != DDLConfig(bucket_bytes=1).fingerprint()
    with pytest.raises(ConfigError, match="DDL_OVERLAP must be 1 or 0"):
        DDLConfig.from_env({"DDL_OVERLAP": "maybe"})
    with pytest.raises(ConfigError, match="bucket_bytes=-5"):
        DDLConfig(bucket_bytes=-5)


def test_resolve_prefers_arguments_over_the_job_settings():
    hvd.init()
    try:
        assert resolve(None, None) == (True, DEFAULT_BUCKET_BYTES)
        assert resolve(False, 10) == (False, 10)
        with pytest.raises(ConfigError, match="bucket_bytes='big'"):
            resolve(None, "big")
        with pytest.raises(ConfigError, match="overlap='yes'"):
            resolve("yes", None)
    finally:
        hvd.shutdown()


def test_bad_gradient_options_fail_when_the_optimizer_or_tape_is_made():
    import keras

    import ddl_tf.keras as hvd_keras

    hvd.init()
    try:
        with pytest.raises(ConfigError, match="bucket_bytes=-1; e.g. bucket_bytes="):
            hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=-1)
        with pytest.raises(ConfigError, match="overlap='on'; e.g. overlap=False"):
            hvd.DistributedGradientTape(tf.GradientTape(), overlap="on")
        with pytest.raises(ConfigError, match="gradient_predivide_factor must be a number > 0"):
            hvd.DistributedGradientTape(tf.GradientTape(), gradient_predivide_factor=-2.0)
        with pytest.raises(ConfigError, match="Unknown compression"):
            hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp8")
        # resolved when made: the job's settings for None, the arguments otherwise
        made = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=64)
        assert made.reducer.bucketing == (True, 64) and made.bucket_bytes == 64
        tape = hvd.DistributedGradientTape(tf.GradientTape(), overlap=False)
        assert tape._bucketing == (False, DEFAULT_BUCKET_BYTES)
    finally:
        hvd.shutdown()


def test_one_process_returns_gradients_untouched_in_graphs_too():
    hvd.init()
    try:
        grads = {}

        @tf.function
        def step(x):
            out = allreduce_gradients([x * 2.0, None, x], bucket_bytes=4)
            grads["out"] = out
            return out[0] + out[2]

        np.testing.assert_allclose(step(tf.ones([3])).numpy(), [3.0, 3.0, 3.0])  # exact in float32
        assert grads["out"][1] is None
    finally:
        hvd.shutdown()


def test_instant_events_are_written_and_merged(tmp_path):
    path = tmp_path / "trace.json"
    tl = Timeline(path, rank=0)
    with tl.phase("allreduce 'g_b0'"):
        tl.instant("gradients ready", tid=1, bucket="g_b1")
    merge_traces(path, [tl.close()])
    events = json.loads(path.read_text())["traceEvents"]
    ready = [e for e in events if e["name"] == "gradients ready"]
    phase = [e for e in events if e["ph"] == "X"]
    assert ready[0]["ph"] == "i" and ready[0]["tid"] == 1 and ready[0]["args"]["bucket"] == "g_b1"
    assert phase[0]["ts"] <= ready[0]["ts"] <= phase[0]["ts"] + phase[0]["dur"]
