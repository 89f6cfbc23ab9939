"""Fixtures of the Horovod-parity suite, run by every rank of one mpirun (see ../parity_main.py).

Every test starts and ends with a named barrier, so that the ranks run each
test together. If a test fails on one rank only and that rank moves on, the
others meet its barrier with a different collective: every rank gets a
CollectiveMismatchError at once (ddl_tf negotiates each collective), the
other ranks' test fails as well, and the barrier is retried until all ranks
are in it. A failure therefore never leaves the ranks out of step for the
tests after it; it shows up as failures of that one test.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.core import basics
from ddl_tf.errors import CollectiveMismatchError, DDLError

ALIGN_SECONDS = 90.0


@pytest.fixture(scope="session", autouse=True)
def job():
    """ddl_tf, initialized once per rank for the whole suite (parity_main shuts it down)."""
    hvd.init()
    return basics.engine()


def align(label: str) -> int:
    """Wait until every rank reaches the barrier named ``label``; returns the retries needed."""
    engine = basics.engine()
    deadline = time.monotonic() + ALIGN_SECONDS
    retries = 0
    while True:
        try:
            engine.barrier(name=label)
            return retries
        except CollectiveMismatchError:
            retries += 1
            if time.monotonic() > deadline:
                raise
        except DDLError:  # a refusal from a rank still inside the failing test
            retries += 1
            if time.monotonic() > deadline:
                raise


@pytest.fixture(autouse=True)
def in_step(request, job):
    """Enter and leave every test together with the other ranks; reseed TensorFlow."""
    align(f"enter {request.node.nodeid}")
    tf.random.set_seed(1234)
    np.random.seed(1234)
    yield
    align(f"leave {request.node.nodeid}")


@pytest.fixture
def rank(job) -> int:
    return hvd.rank()


@pytest.fixture
def size(job) -> int:
    if hvd.size() < 2:
        pytest.skip("needs at least 2 ranks")
    return hvd.size()
