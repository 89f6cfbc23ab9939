"""One rank's bad argument never hangs the others, and the next collective works.

Each case gives one rank (or every rank) an argument error that Horovod
reports, while the other ranks make a valid call. Every rank must raise the
same error class, quickly, and a following allreduce must return the right
sum on every rank: the ranks are still in step.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf import errors
from ddl_tf.tensorflow import tf_errors
from tests.timing import HANG_SECONDS

LIMIT = HANG_SECONDS  # the same error on every rank, never a hang (tests/timing.py)


def outcome(call) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the class is what the test compares
        return type(err).__name__, str(err), time.monotonic() - start
    return "none", "", time.monotonic() - start


def assert_same_everywhere(result, expected: type[BaseException]) -> list:
    name, message, seconds = result
    everyone = hvd.allgather_object((name, message, seconds))
    assert {e[0] for e in everyone} == {expected.__name__}, everyone
    assert len({e[1] for e in everyone}) == 1, "every rank reports the same message"
    assert all(e[2] < LIMIT for e in everyone), everyone
    return everyone


def assert_in_step(size: int) -> None:
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum).numpy()
    np.testing.assert_array_equal(total, [size, 2.0 * size])


def test_bad_alltoall_splits_on_one_rank_are_raised_on_every_rank(rank, size):
    rows = tf.ones([size, 2])
    splits = [1] * size if rank == 0 else [2] * size  # rank 1 and up: splits exceed the rows
    result = outcome(lambda: hvd.alltoall(rows, splits=splits))
    everyone = assert_same_everywhere(result, tf_errors.CollectiveArgumentError)
    assert "refused by rank(s) 1" in everyone[0][1] and "splits" in everyone[0][1]
    assert_in_step(size)


def test_uneven_alltoall_on_one_rank_is_an_invalid_argument_everywhere(rank, size):
    rows = size if rank == 0 else size + 1  # no splits: rows must be a multiple of size
    try:
        hvd.alltoall(tf.ones([rows]))
        raised = None
    except tf.errors.InvalidArgumentError as err:
        raised = err
    assert isinstance(raised, errors.CollectiveArgumentError)
    assert isinstance(raised, ValueError)
    assert_in_step(size)


def test_unsupported_sparse_op_on_one_rank_is_raised_on_every_rank(rank, size):
    def call():
        if rank == size - 1:  # the last rank passes IndexedSlices with Min: not in Horovod
            hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])), op=hvd.Min)
        else:
            hvd.allreduce(tf.ones([2]), op=hvd.Min)

    everyone = assert_same_everywhere(outcome(call), errors.UnsupportedError)
    assert f"refused by rank(s) {size - 1}" in everyone[0][1]
    assert_in_step(size)


def test_scale_factors_with_indexed_slices_are_not_implemented_everywhere(size):
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]))
    with pytest.raises(NotImplementedError, match="prescale_factor"):
        hvd.allreduce(sparse, op=hvd.Sum, prescale_factor=2.0)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(sparse, op=hvd.Adasum)
    assert_in_step(size)


def test_dtype_differs_between_ranks_eagerly_is_a_failed_precondition(rank, size):
    tensor = tf.ones([3], tf.int32 if rank % 2 == 0 else tf.float32)
    result = outcome(lambda: hvd.allreduce(tensor))
    assert_same_everywhere(result, tf_errors.CollectiveMismatchError)
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.reducescatter(tf.ones([4], tf.int32 if rank % 2 == 0 else tf.float32))
    assert_in_step(size)


def test_shape_differs_inside_tf_function_is_a_failed_precondition(rank, size):
    @tf.function
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum, name="graph_shape")

    start = time.monotonic()
    with pytest.raises(tf.errors.FailedPreconditionError, match="CollectiveMismatchError"):
        step(tf.ones([2 + rank]))
    assert time.monotonic() - start < LIMIT
    assert step(tf.ones([2])).numpy().tolist() == [size, size]  # the same function, in step
    assert_in_step(size)


def test_mismatch_in_a_compat_v1_session_is_a_failed_precondition(rank, size):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        bad = hvd.broadcast(tf.ones([3, 10 * (rank + 1)]), root_rank=0)
        with pytest.raises(tf.errors.FailedPreconditionError):
            session.run(bad)
        # chained after `bad` (program order), so running it runs `bad` again: same error
        chained = hvd.broadcast(tf.fill([2], float(rank)), root_rank=size - 1)
        with pytest.raises(tf.errors.FailedPreconditionError):
            session.run(chained)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        good = hvd.broadcast(tf.fill([2], float(rank)), root_rank=size - 1)
        assert session.run(good).tolist() == [size - 1.0, size - 1.0]
    assert_in_step(size)


def test_scalar_reducescatter_is_a_value_error_on_every_rank(size):
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.reducescatter(tf.constant(1.0))
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.grouped_reducescatter([tf.zeros([2, 1]), tf.constant(1.0)])
    assert_in_step(size)


def test_root_rank_differs_between_ranks(rank, size):
    with pytest.raises(tf.errors.FailedPreconditionError, match="from rank"):
        hvd.broadcast(tf.ones([2]), root_rank=rank)
    assert_in_step(size)
