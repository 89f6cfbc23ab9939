"""One-process units behind Horovod parity: scaling arithmetic, refusals on the wire, typed
errors in eager and graph code, TF-aware compression, the compat.v1 chain rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf import errors
from ddl_tf.core.collectives.negotiation import REFUSALS, Descriptor
from ddl_tf.core.numerics.scaling import postscale_factor, scale
from ddl_tf.tensorflow import bridge, tf_errors


@pytest.fixture
def ddl():
    hvd.init()
    yield
    hvd.shutdown()


def test_integer_scaling_is_float64_math_truncated_toward_zero():
    x = np.array([7, -7, 5, 100], np.int32)
    np.testing.assert_array_equal(scale(x, 0.5), [3, -3, 2, 50])
    big = np.array([2**40 + 1], np.int64)
    assert scale(big, 1.0 / 3)[0] == int(np.trunc((2**40 + 1) * (1.0 / 3)))
    assert scale(x, 1.0) is x  # nothing to do: no copy


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_precision_scaling_rounds_the_factor_to_float32(dtype):
    factor = 0.1234567890123
    x = np.array([1.5, -3.25, 1000.0], dtype)
    expected = (x.astype(np.float32) * np.float32(factor)).astype(dtype)
    np.testing.assert_array_equal(scale(x, factor), expected)


def test_average_is_one_multiplication_by_postscale_over_size():
    assert postscale_factor(3.0, average=True, size=4) == 0.75
    assert postscale_factor(3.0, average=False, size=4) == 3.0
    with pytest.raises(errors.ConfigError, match="Boolean"):
        scale(np.array([True]), 2.0)


def test_refusals_travel_with_their_class_and_message():
    err = errors.UnsupportedError("Min is not supported with tf.IndexedSlices")
    descriptor = Descriptor.refusal("allreduce", "grads", err)
    decoded = Descriptor.decode(descriptor.encode(seq=9))
    assert decoded.seq == 9 and REFUSALS[decoded.error - 1] is errors.UnsupportedError
    assert (
        decoded.text
        == "allreduce 'grads': UnsupportedError: Min is not supported with tf.IndexedSlices"
    )
    plain = Descriptor.make("allreduce", None, ("float32", (2,)))
    assert Descriptor.decode(plain.encode(seq=1)).error == 0


def test_typed_errors_are_both_ddl_and_tensorflow_errors():
    mismatch = tf_errors.typed(errors.CollectiveMismatchError("rank 1 sent float32[3]"))
    assert isinstance(mismatch, tf.errors.FailedPreconditionError)
    assert isinstance(mismatch, errors.CollectiveMismatchError)
    bad = tf_errors.typed(errors.CollectiveArgumentError("splits"))
    assert isinstance(bad, tf.errors.InvalidArgumentError) and isinstance(bad, ValueError)
    other = errors.StallError("late")
    assert tf_errors.typed(other) is other
    assert issubclass(errors.UnsupportedError, NotImplementedError)
    assert issubclass(errors.ExecutionModeError, RuntimeError)


def test_a_mismatch_inside_a_graph_fails_the_step_as_failed_precondition(ddl):
    calls = []

    def mismatching(x):
        calls.append(1)
        raise errors.CollectiveMismatchError("rank 1 issued allgather")

    @tf.function
    def step(x):
        out = bridge.run(mismatching, [x], [tf.float32], [x.shape], name="DDLTest_gate")
        return out[0] + 1.0

    with pytest.raises(tf.errors.FailedPreconditionError, match="CollectiveMismatchError"):
        step(tf.ones([2]))
    assert calls == [1]
    with pytest.raises(tf_errors.CollectiveMismatchError, match="issued allgather"):
        bridge.run(mismatching, [tf.ones([2])], [tf.float32], [None], name="eager")


def test_compat_v1_collectives_stay_chained_in_program_order(ddl):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        hvd.allreduce(tf.ones([2]), name="first")
        second = hvd.allreduce(tf.ones([3]), name="second")
        session.run(second)
        third = hvd.allreduce(tf.ones([4]), name="third")  # built after a run: still chained
        chain = bridge.collective_ops(graph)
        assert [op.name for op in chain] == [
            "DDLAllreduce_first",
            "DDLAllreduce_second",
            "DDLAllreduce_third",
        ]
        assert chain[0] in chain[1].control_inputs and chain[1] in chain[2].control_inputs
        gates = [op for op in chain[2].control_inputs if op.type == "IdentityN"]
        assert [g.name for g in gates] == ["DDLAllreduce_second_gate"]  # waits for the check
        assert session.run(third).tolist() == [1.0] * 4


def test_tensor_compression_keeps_numpy_and_tensor_paths(ddl):
    wire, ctx = hvd.Compression.fp16.compress(np.ones(3, np.float64))
    assert (
        wire.dtype == np.float16 and hvd.Compression.fp16.decompress(wire, ctx).dtype == np.float64
    )
    wire, ctx = hvd.Compression.bf16.compress(tf.ones([2]))
    assert wire.dtype == tf.bfloat16
    assert (
        hvd.allreduce(tf.ones([2], tf.float64), compression=hvd.Compression.fp16).dtype
        == tf.float64
    )
    assert hvd.Compression.get("fp16") is hvd.Compression.fp16


def test_single_process_api_additions(ddl):
    assert int(hvd.rank_op()) == 0 and int(hvd.local_size_op()) == 1
    with pytest.raises(ValueError, match="process_set_id=3"):
        hvd.size_op(process_set_id=3)
    assert hvd.global_process_set.included() and hvd.global_process_set.size() == 1
    graph = tf.Graph()
    with graph.as_default():
        assert hvd.broadcast_global_variables(0) is None  # no global variables: nothing to do
    assert hvd.broadcast_object_fn(root_rank=0)({"a": 1}) == {"a": 1}
    assert [t.shape for t in hvd.grouped_reducescatter([tf.ones([3, 2])], op=hvd.Sum)] == [
        tf.TensorShape([3, 2])
    ]
    assert hvd.allreduce(tf.ones([2]), op=hvd.Adasum).numpy().tolist() == [1.0, 1.0]  # one rank


def test_the_session_hook_broadcast_does_not_run_the_training_collectives(ddl):
    graph = tf.Graph()
    with graph.as_default():
        batch = tf.compat.v1.placeholder(tf.float32, [2])  # must be fed when the step runs
        grads = hvd.allreduce(batch * 2.0, name="grads")
        weights = tf.compat.v1.Variable([5.0, 6.0])
        hook = hvd.BroadcastGlobalVariablesHook(root_rank=0)
        hook.begin()  # builds its broadcast after the gradients' allreduce, outside the chain
        later = hvd.allreduce(batch, name="later")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(weights.initializer)
            hook.after_create_session(session, None)  # would fail if it ran `grads` (no feed)
            assert session.run(weights).tolist() == [5.0, 6.0]
            assert session.run(later, {batch: [1.0, 2.0]}).tolist() == [1.0, 2.0]
        chain = [op.name for op in bridge.collective_ops(graph)]
        assert chain == ["DDLAllreduce_grads", "DDLAllreduce_later"]
        del grads
