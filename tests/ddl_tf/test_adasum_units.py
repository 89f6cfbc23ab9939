"""Adasum in one process: Horovod's rules and errors that name the fix (the arithmetic across
ranks is checked against numpy under mpirun in tests/parallel/test_ddl_adasum.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.core.algorithms.adasum import check_size, pair_coefficients
from ddl_tf.errors import ConfigError, UnsupportedError


@pytest.mark.parametrize(("size", "fix"), [(3, "launch 2 or 4"), (6, "launch 4 or 8")])
def test_a_width_that_is_not_a_power_of_two_is_refused_naming_the_fix(size, fix):
    with pytest.raises(NotImplementedError, match=f"Received {size} ranks; {fix}"):
        check_size(size)
    check_size(8)


def test_the_pairwise_rule_and_its_zero_sides():
    a, b = np.array([3.0, 4.0]), np.array([6.0, 8.0])  # parallel: the mean of the magnitudes
    ca, cb = pair_coefficients(a @ b, a @ a, b @ b)
    assert np.allclose(ca * a + cb * b, (a + b) / 2)
    ca, cb = pair_coefficients([0.0, 0.0], [0.0, 4.0], [9.0, 0.0])  # one side zero
    assert ca.tolist() == [1.0, 1.0] and cb.tolist() == [1.0, 1.0]


def test_one_rank_returns_its_tensors_and_non_floats_are_refused():
    hvd.init()
    try:
        x = tf.constant([[1.5, -2.0]], tf.float16)
        assert hvd.allreduce(x, op=hvd.Adasum).numpy().tolist() == [[1.5, -2.0]]
        with pytest.raises(ConfigError, match="cast to float32 first"):
            hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum)
        slices = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), tf.constant([3, 2]))
        with pytest.raises(UnsupportedError, match="sparse_as_dense=True"):
            hvd.allreduce(slices, op=hvd.Adasum)
        with pytest.raises(ConfigError, match="average_aggregated_gradients"):
            hvd.DistributedOptimizer(
                keras.optimizers.SGD(0.1),
                op=hvd.Adasum,
                backward_passes_per_step=2,
                average_aggregated_gradients=True,
            )
    finally:
        hvd.shutdown()
