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
from typing import Any

from ddl_tf import env

__all__ = ["ADMIT_TAG", "DEFAULT_TIMEOUT", "wait_for_admission"]

logger = logging.getLogger(__name__)

ADMIT_TAG = 4517
"""Message tag of rank 0's word to ranks it started ahead (``admit`` or ``leave``), and of the
intercommunicator that joins them to the job."""

DEFAULT_TIMEOUT = 600.0
"""Seconds to wait for ``--min-np`` slots (horovodrun's ``--elastic-timeout`` default); a rank
started ahead waits as long to be admitted."""


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
    while not bridge.Iprobe(source=0, tag=ADMIT_TAG):
        if time.monotonic() > deadline:
            logger.error(
                "this rank, started ahead for a growing elastic job, was not admitted within "
                "%g s (--elastic-timeout); it leaves",
                timeout,
            )
            _exit_now(1)
        time.sleep(0.01)
    word = bridge.recv(source=0, tag=ADMIT_TAG)
    if word != "admit":
        logger.info("this rank, started ahead for a growing elastic job, leaves: told %r", word)
        _exit_now(0)
    return bridge


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MPI_Finalize would wait for the job that did not take this rank
