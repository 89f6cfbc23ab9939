"""Process sets and join() in one process: arguments, registration rules, errors that name the fix.

The multi-rank behaviour (sets running side by side, join with uneven data) is
tested under mpirun in ``tests/parallel/test_ddl_join_process_sets.py``.
"""

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.process_sets import registered
from ddl_tf.errors import ConfigError


@pytest.fixture
def dynamic():
    hvd.init(process_sets="dynamic")
    yield hvd
    hvd.shutdown()


@pytest.mark.parametrize(
    ("ranks", "match"),
    [([], "distinct, non-negative"), ([0, 0], "distinct"), ([-1], "non-negative"), ("ab", "list")],
)
def test_process_set_arguments_are_checked(ranks, match):
    with pytest.raises(ConfigError, match=match):
        hvd.ProcessSet(ranks)


def test_a_communicator_is_refused_with_the_alternative():
    from mpi4py import MPI

    with pytest.raises(ConfigError, match="lists of ranks"):
        hvd.ProcessSet(MPI.COMM_WORLD)


def test_adding_after_init_needs_dynamic_process_sets():
    hvd.init()
    try:
        with pytest.raises(ConfigError, match="HOROVOD_DYNAMIC_PROCESS_SETS=1"):
            hvd.add_process_set([0])
    finally:
        hvd.shutdown()


def test_a_set_of_every_rank_given_to_init_is_the_global_set():
    first = hvd.ProcessSet([0])  # one process: rank 0 is the whole job
    hvd.init(process_sets=[first])
    try:
        assert first.process_set_id == 0 and first.included() and first.rank() == 0  # Horovod's
        assert registered() == {0: [0]}
        assert int(hvd.size_op(process_set_id=0)) == 1
        assert hvd.allreduce(tf.constant([2.0]), process_set=first).numpy().tolist() == [2.0]
        assert not hvd.remove_process_set(first)
    finally:
        hvd.shutdown()
    with pytest.raises(ConfigError, match="list of ProcessSet or 'dynamic'"):
        hvd.init(process_sets="static")
    assert not hvd.is_initialized()


def test_registration_rules(dynamic):
    """One process: every set of ranks is the global set (the sets of other ranks, removal
    and id reuse run on 4 ranks in tests/parallel/test_ddl_join_process_sets.py)."""
    assert str(hvd.global_process_set) == "ProcessSet(process_set_id=0, ranks=[0], mpi_comm=None)"
    one = hvd.ProcessSet([0])
    assert repr(one) == "ProcessSet(process_set_id=None, ranks=[0], mpi_comm=None)"
    with pytest.raises(ValueError, match="ranks of the global process set"):
        hvd.add_process_set(one)
    assert one.process_set_id is None
    with pytest.raises(ConfigError, match="outside the job"):
        hvd.add_process_set([0, 5])
    assert not hvd.remove_process_set(hvd.global_process_set)
    assert not hvd.remove_process_set(one)
    with pytest.raises(ConfigError, match="not registered with this job"):
        hvd.allreduce(tf.ones(1), process_set=one)
    with pytest.raises(ConfigError, match="process_set_id=1"):
        hvd.process_set_included_op(process_set_id=1)


def test_a_set_does_not_outlive_its_job():
    one = hvd.ProcessSet([0])
    hvd.init(process_sets=[one])
    hvd.shutdown()
    one.process_set_id = 1  # as if it had been registered in a larger job
    hvd.init(process_sets="dynamic")
    try:
        with pytest.raises(ConfigError, match="not registered with this job"):
            hvd.allgather(tf.ones(1), process_set=one)
    finally:
        hvd.shutdown()


def test_join_alone_returns_this_rank(dynamic):
    assert int(hvd.join()) == 0

    @tf.function
    def joined():
        return hvd.join()

    assert int(joined()) == 0
    assert basics.engine().allreduce([np.ones(1)], ReduceSpec.of("sum"))[0].tolist() == [1.0]
