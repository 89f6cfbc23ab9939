"""Horovod's documented semantics for calls ddl_tf used to refuse or did not have.

Expected values are computed here from the documented definitions (sum,
mean truncated toward zero for integers, scale factors in float64 for
integers and float32 for 16-bit floats), not copied from Horovod's tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd


def per_rank(r: int, dtype, shape=(4, 3)) -> np.ndarray:
    """Small distinct values (negative ones too unless unsigned; no 8-bit overflow on 2 ranks)."""
    values = np.arange(np.prod(shape)).reshape(shape) * (r + 3)
    if np.dtype(dtype).kind != "u":
        values = values - 7
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_average_of_integers_is_the_truncated_mean(rank, size, dtype):
    mine = per_rank(rank, dtype)
    got = hvd.allreduce(tf.constant(mine), op=hvd.Average).numpy()
    total = sum(per_rank(r, dtype).astype(np.float64) for r in range(size))
    expected = np.trunc(total * (1.0 / size)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.float32])
def test_scale_factors_follow_horovods_precision(rank, size, dtype):
    factor = 0.3710101  # not a power of two: rounding mode and precision matter
    mine = per_rank(rank, dtype)
    pre = hvd.allreduce(tf.constant(mine), op=hvd.Sum, prescale_factor=factor).numpy()
    post = hvd.allreduce(tf.constant(mine), op=hvd.Sum, postscale_factor=factor).numpy()
    work = np.float64 if np.dtype(dtype).kind == "i" else np.float32

    def scaled(x):
        return (x.astype(work) * work(factor)).astype(dtype)

    expected_pre = sum(scaled(per_rank(r, dtype)).astype(work) for r in range(size)).astype(dtype)
    expected_post = scaled(sum(per_rank(r, dtype).astype(work) for r in range(size)).astype(dtype))
    np.testing.assert_array_equal(pre, expected_pre)
    np.testing.assert_array_equal(post, expected_post)


def test_fp16_compression_takes_and_returns_tensors():
    for dtype in (tf.float16, tf.float32, tf.float64):
        wire, ctx = hvd.Compression.fp16.compress(tf.ones([3], dtype))
        assert wire.dtype == tf.float16
        assert hvd.Compression.fp16.decompress(wire, ctx).dtype == dtype
    for dtype in (tf.int32, tf.uint8, tf.bool):
        wire, ctx = hvd.Compression.fp16.compress(tf.ones([3], dtype))
        assert wire.dtype == dtype and hvd.Compression.fp16.decompress(wire, ctx).dtype == dtype


def test_grouped_allgather_keeps_dtypes_and_uneven_first_dimensions(rank, size):
    a = tf.fill([rank + 1, 2], rank)
    b = tf.cast(tf.fill([2 * rank + 1], rank), tf.bool)
    got_a, got_b = hvd.grouped_allgather([a, b])
    expected_a = np.concatenate([np.full((r + 1, 2), r) for r in range(size)])
    expected_b = np.concatenate([np.full(2 * r + 1, bool(r)) for r in range(size)])
    np.testing.assert_array_equal(got_a.numpy(), expected_a)
    np.testing.assert_array_equal(got_b.numpy(), expected_b)


def test_grouped_reducescatter_splits_rows_first_ranks_first(rank, size):
    rows = 2 * size + 1
    tensors = [tf.constant(per_rank(rank, np.float32, (rows, 2))), tf.fill([size * 3], 1.0)]
    summed, ones = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
    full = sum(per_rank(r, np.float32, (rows, 2)) for r in range(size))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_allclose(summed.numpy(), full[start : start + counts[rank]])
    np.testing.assert_array_equal(ones.numpy(), np.full(3, float(size)))
    averaged = hvd.grouped_reducescatter([tf.fill([size], 2 * rank + 1)], op=hvd.Average)[0]
    assert averaged.numpy().tolist() == [size]  # mean of 1, 3, 5, ... is size; int dtype kept


def test_broadcast_in_place_assigns_variables_and_returns_values(rank, size):
    variables = [tf.Variable(tf.fill([2, 2], float(rank))), tf.Variable([rank, rank + 1])]
    values = hvd.broadcast_(variables, root_rank=size - 1)
    root = size - 1
    for variable, value, expected in zip(
        variables, values, [np.full((2, 2), float(root)), [root, root + 1]], strict=True
    ):
        np.testing.assert_array_equal(variable.numpy(), expected)
        np.testing.assert_array_equal(value.numpy(), expected)


def test_broadcast_in_place_of_reference_variables_in_a_session(rank, size):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        ref = tf.compat.v1.Variable(tf.fill([3], float(rank)), use_resource=False)
        session.run(tf.compat.v1.global_variables_initializer())
        (value,) = hvd.broadcast_([ref], root_rank=0)
        assert session.run(value).tolist() == [0.0, 0.0, 0.0]
        assert session.run(ref).tolist() == [0.0, 0.0, 0.0]
        hook = hvd.BroadcastGlobalVariablesHook(root_rank=size - 1)
        session.run(ref.assign(tf.fill([3], float(rank))))
        hook.begin()
        hook.after_create_session(session, None)
        assert session.run(ref).tolist() == [size - 1.0] * 3


def test_rank_and_size_ops_are_read_when_the_graph_runs(rank, size):
    assert int(hvd.rank_op()) == rank and int(hvd.size_op()) == size
    graph = tf.Graph()
    with graph.as_default():
        ops = [hvd.rank_op(), hvd.local_rank_op(), hvd.size_op(), hvd.local_size_op()]
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run(ops)
    assert values == [rank, hvd.local_rank(), size, hvd.local_size()]
    assert int(hvd.process_set_included_op()) == 1


def test_broadcast_global_variables_is_graph_mode_only(size):
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS=1"):
        hvd.add_process_set([0])


def test_alltoall_with_splits_returns_received_splits(rank, size):
    splits = [r + 1 for r in range(size)]  # rank k sends k+1 rows... to rank k
    rows = tf.fill([sum(splits), 2], rank)
    received, received_splits = hvd.alltoall(rows, splits=splits)
    assert received_splits.numpy().tolist() == [rank + 1] * size
    expected = np.concatenate([np.full((rank + 1, 2), r) for r in range(size)])
    np.testing.assert_array_equal(received.numpy(), expected)
