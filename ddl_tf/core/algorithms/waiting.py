"""Wait for MPI requests without burning a core: spin briefly, then yield, then sleep.

Open MPI's blocking calls (``Sendrecv``, ``Wait``) poll the network at 100%
of a core until the data has moved. That is harmless when a collective runs
alone, but an overlapped bucket (:mod:`ddl_tf.tensorflow.overlap`) waits *while* the
backward pass computes on the same processor: on a 2-core machine one
spinning rank took about 0.7 of the 1 s it waited away from the compute of
both ranks (measured with ``tf.numpy_function`` waiting next to matmuls).
:func:`wait_all` tests the requests instead: a short spin keeps small
messages fast, then it yields, then it sleeps in steps of at most 0.5 ms
(the GIL is released while it sleeps; each test drives MPI's progress).

Example (one process: a message to itself):
    >>> import numpy as np
    >>> from ddl_tf.core.numerics import mpi
    >>> from ddl_tf.core.algorithms.waiting import wait_all
    >>> MPI = mpi.load()
    >>> comm = MPI.COMM_SELF
    >>> out, into = np.arange(3.0), np.zeros(3)
    >>> wait_all([comm.Isend(out, 0, 7), comm.Irecv(into, 0, 7)])
    >>> into.tolist()
    [0.0, 1.0, 2.0]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["wait_all", "SPIN_SECONDS", "MAX_SLEEP_SECONDS"]

SPIN_SECONDS = 0.0002
"""Test in a tight loop for this long first (small messages finish here)."""

MAX_SLEEP_SECONDS = 0.0005
"""Longest sleep between two tests once spinning and yielding gave up."""


def wait_all(requests: Sequence[Any]) -> None:
    """Complete every mpi4py request in ``requests``, politely.

    Args:
        requests: ``MPI.Request`` objects (e.g. from ``Isend``/``Irecv``).

    Raises:
        MPI.Exception: A request failed.
    """
    if not requests:
        return
    test_all = type(requests[0]).Testall
    started = time.perf_counter()
    polls = 0
    while not test_all(list(requests)):
        polls += 1
        waited = time.perf_counter() - started
        if waited < SPIN_SECONDS:
            continue
        if waited < 4 * SPIN_SECONDS:
            os.sched_yield()
        else:
            time.sleep(min(MAX_SLEEP_SECONDS, 0.00005 * 2 ** min(polls // 50, 4)))
