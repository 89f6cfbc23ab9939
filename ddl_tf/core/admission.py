"""A rank a growing elastic job started ahead: in the job's next membership, not yet admitted.

The membership layer (:mod:`ddl_tf.membership.reform`) starts such ranks while
the job trains on. Each connects to the job's ranks (:func:`join_job`), and
every rank, old and new, builds the *next* membership's job right away (the
old ranks in a background thread); the old ranks keep training with theirs.
So the new rank's ``init()`` returns at once with its final rank and size,
and its program builds the model meanwhile, while its collectives are held
at the :class:`Admission` gate:

* inside ``hvd.elastic.run``, the training function first runs as a
  *warm-up*: up to its first collective (the first step's, after Keras
  traced it), which ends the warm-up (:class:`NotAdmittedError`, caught by
  ``run``). The traced step is kept; the job's size in it is the final one.
* the first collective tells rank 0 the rank is ready (``READY_TAG``), and
  the rank waits, off the CPU, for rank 0's word: ``admit`` at the first
  commit after every new rank was ready, or ``leave`` when the job ended
  first, or their host left. A collective outside ``run`` (e.g. a sharded
  optimizer's build) just waits for the word and then runs.

This sits in the core because ``init()`` (:mod:`ddl_tf.core.basics`) and the
engine's collectives (:mod:`ddl_tf.core.collectives.guard`) use it, below the
membership layer that sends the word.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ddl_tf import env
from ddl_tf.errors import DDLError

__all__ = [
    "ADMIT_TAG",
    "READY_TAG",
    "DEFAULT_TIMEOUT",
    "Admission",
    "NotAdmittedError",
    "install",
    "join_job",
    "pending",
    "timeout",
    "wait_quietly",
    "warm_up",
]

logger = logging.getLogger(__name__)

ADMIT_TAG = 4517
"""Message tag of rank 0's word to ranks it started ahead (``admit`` or ``leave``), and of the
intercommunicator that joins them to the job."""

READY_TAG = 4518
"""Message tag of a rank started ahead telling rank 0 it is ready (at its first collective), or
that its program failed before (the message then holds the error's text)."""

DEFAULT_TIMEOUT = 600.0
"""Seconds to wait for ``--min-np`` slots (horovodrun's ``--elastic-timeout`` default); a rank
started ahead waits as long to be admitted."""


def join_job(MPI: Any, parent: Any) -> Any:
    """In a rank started ahead: connect to the whole job (the caller builds the next job over it).

    The job's rank 0 alone spawned this rank (over ``MPI_COMM_SELF``, so that
    the job's other ranks do not spin in ``MPI_Comm_spawn`` while the new
    ranks import TensorFlow); ``parent`` is that intercommunicator. The new
    ranks merge with rank 0, build an intercommunicator to the job's ranks
    through it (``MPI_Intercomm_create``, rank 0 the bridge), and merge: the
    job's ranks first, then the new ranks in their spawn order.

    Returns:
        The merged communicator: the next membership's ranks, this one among them.
    """
    with_rank0 = parent.Merge(high=True)  # the job's rank 0, then the new ranks
    parent.Disconnect()
    inter = MPI.COMM_WORLD.Create_intercomm(0, with_rank0, 0, tag=ADMIT_TAG)
    bridge = inter.Merge(high=True)
    inter.Free()
    with_rank0.Free()
    return bridge


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


class NotAdmittedError(DDLError):
    """A warm-up reached its first collective (:meth:`Admission.warming_up`): it ends there."""


class Admission:
    """The gate in front of a not yet admitted rank's collectives (see the module docstring).

    Args:
        bridge: The next membership's communicator (the job's ranks first).
        state: The next job's engine state; its ``gate`` is this object until admitted.
        timeout: Seconds to wait for rank 0's word (``--elastic-timeout``).
        warm_up: Whether ``hvd.elastic.run`` warms the training function up before
            the admission (``DDL_ELASTIC_WARMUP``); without, this rank is ready at once.
    """

    def __init__(self, bridge: Any, state: Any, timeout: float, warm_up: bool = True) -> None:
        self.bridge = bridge
        self.warm_up = warm_up
        self._state = state
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.warming = False
        self.warm_up_ended = False  # the warm-up reached a collective (not another error)
        self._told = False
        self._lock = threading.Lock()

    def __call__(self, kind: str) -> None:
        """Before collective ``kind``: end the warm-up, or wait for admission.

        Raises:
            NotAdmittedError: During the warm-up.
        """
        if self.warming:
            self.tell(None)
            self.warm_up_ended = True
            raise NotAdmittedError(
                f"{kind}: this rank, started ahead for a growing elastic job, is not admitted yet "
                "(its warm-up ends at its first collective; hvd.elastic.run goes on from there)"
            )
        self.wait()

    def close_gate(self) -> None:
        """Hold the next job's collectives here until the admission."""
        self._state.gate = self

    @contextmanager
    def warming_up(self) -> Iterator[None]:
        """While inside, a collective raises :class:`NotAdmittedError` instead of waiting."""
        self.warming = True
        try:
            yield
        finally:
            self.warming = False

    def tell(self, failure: str | None) -> None:
        """Tell rank 0, once, that this rank is ready (None) or that its program failed."""
        with self._lock:
            if self._told:
                return
            self._told = True
        self.bridge.send(failure, dest=0, tag=READY_TAG)

    def wait(self) -> None:
        """Wait (off the CPU) for rank 0's word; leave the process unless it is ``admit``."""
        if self._state.gate is None:
            return
        self.tell(None)
        if not wait_quietly(self.bridge, 0, ADMIT_TAG, lambda: time.monotonic() > self.deadline):
            logger.error(
                "this rank, started ahead for a growing elastic job, was not admitted within "
                "%g s (--elastic-timeout); it leaves",
                self.timeout,
            )
            _exit_now(1)
        word = self.bridge.recv(source=0, tag=ADMIT_TAG)
        if word != "admit":
            logger.info("this rank, started ahead for a growing elastic job, leaves: told %r", word)
            _exit_now(0)
        self._state.gate = None
        global _pending
        _pending = None


_pending: Admission | None = None


def install(admission: Admission) -> None:
    """Hold this process's collectives at ``admission`` until rank 0 admits it (``init()`` calls it).

    Without a warm-up the rank tells rank 0 it is ready now.
    """
    global _pending
    _pending = admission
    admission.close_gate()
    if not admission.warm_up:
        admission.tell(None)


def pending() -> Admission | None:
    """This process's admission while it is not admitted yet, else None."""
    return _pending


def timeout() -> float:
    """Seconds a rank started ahead waits to be admitted (``--elastic-timeout``)."""
    return float(env.get(env.DDL_ELASTIC_TIMEOUT) or DEFAULT_TIMEOUT)


def warm_up() -> bool:
    """Whether ranks started ahead warm up before their admission (``DDL_ELASTIC_WARMUP``)."""
    return (env.get(env.DDL_ELASTIC_WARMUP) or "1").strip() != "0"


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MPI_Finalize would wait for the job that did not take this rank
