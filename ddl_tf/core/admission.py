"""A rank a growing elastic job started ahead waits in ``init()`` for the job to admit it.

The membership layer (:mod:`ddl_tf.membership.reform`) starts such ranks while
the job trains on; each merges with the job's ranks and then waits here,
connected, for rank 0's word: ``admit`` at the commit that takes it in, or
``leave`` when the job ended first or its host left. This sits in the core
because ``init()`` (:mod:`ddl_tf.core.basics`) runs it, below the membership
layer that sends the word.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ddl_tf import env

__all__ = ["ADMIT_TAG", "DEFAULT_TIMEOUT", "join_job", "wait_for_admission", "wait_quietly"]

logger = logging.getLogger(__name__)

ADMIT_TAG = 4517
"""Message tag of rank 0's word to ranks it started ahead (``admit`` or ``leave``), and of the
intercommunicator that joins them to the job."""

DEFAULT_TIMEOUT = 600.0
"""Seconds to wait for ``--min-np`` slots (horovodrun's ``--elastic-timeout`` default); a rank
started ahead waits as long to be admitted."""


def join_job(MPI: Any, parent: Any) -> Any:
    """In a rank started ahead: connect to the whole job, then wait to be admitted.

    The job's rank 0 alone spawned this rank (over ``MPI_COMM_SELF``, so that
    the job's other ranks do not spin in ``MPI_Comm_spawn`` while the new
    ranks import TensorFlow); ``parent`` is that intercommunicator. The new
    ranks merge with rank 0, build an intercommunicator to the job's ranks
    through it (``MPI_Intercomm_create``, rank 0 the bridge), and merge: the
    job's ranks first, then the new ranks in their spawn order.

    Returns:
        The merged communicator, once rank 0 admitted this rank
        (:func:`wait_for_admission`).
    """
    with_rank0 = parent.Merge(high=True)  # the job's rank 0, then the new ranks
    parent.Disconnect()
    inter = MPI.COMM_WORLD.Create_intercomm(0, with_rank0, 0, tag=ADMIT_TAG)
    bridge = inter.Merge(high=True)
    inter.Free()
    with_rank0.Free()
    return wait_for_admission(bridge)


def wait_quietly(comm: Any, source: int, tag: int, give_up: Callable[[], bool]) -> bool:
    """Wait for a message, probing with sleeps between: a blocking receive spins a core.

    Open MPI progresses a blocking call by polling; a rank waiting for seconds
    (in a background thread, or parked) would take a core from the training.

    Returns:
        True once the message is there (receive it), False when ``give_up()`` said so first.
    """
    while not comm.Iprobe(source=source, tag=tag):
        if give_up():
            return False
        time.sleep(0.01)
    return True


def wait_for_admission(bridge: Any) -> Any:
    """In a rank started ahead: wait for rank 0's word, then join the job (or leave).

    ``bridge`` is the job's ranks and the ranks started with this one, merged.
    Waits at most ``--elastic-timeout`` seconds (``DDL_ELASTIC_TIMEOUT``);
    polling keeps the waiting rank off the CPU.

    Returns:
        ``bridge``, now the job's communicator.
    """
    timeout = float(env.get(env.DDL_ELASTIC_TIMEOUT) or DEFAULT_TIMEOUT)
    deadline = time.monotonic() + timeout
    if not wait_quietly(bridge, 0, ADMIT_TAG, lambda: time.monotonic() > deadline):
        logger.error(
            "this rank, started ahead for a growing elastic job, was not admitted within "
            "%g s (--elastic-timeout); it leaves",
            timeout,
        )
        _exit_now(1)
    word = bridge.recv(source=0, tag=ADMIT_TAG)
    if word != "admit":
        logger.info("this rank, started ahead for a growing elastic job, leaves: told %r", word)
        _exit_now(0)
    return bridge


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MPI_Finalize would wait for the job that did not take this rank
