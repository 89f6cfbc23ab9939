"""A bounded start: ranks that call ``init()`` fail in time, naming the ranks that did not.

Where ``init()`` would wait for ever (measured with Open MPI 5.0 from its
wheel, a job of 2 ranks where rank 1 sleeps or exits instead of calling
``init()``):

* ``MPI_Init`` (``import mpi4py.MPI``, in :func:`ddl_tf.core.numerics.mpi.load`)
  returns only when every process of the job has called it. Rank 0 waited
  there, silently, as long as rank 1 slept; a rank 1 that exited (status 0)
  before rank 0 reached ``MPI_Init`` left it waiting for good, mpirun
  reporting nothing. ``MPI_Init`` also holds Python's GIL while it waits, so
  no thread of the process can do anything about it.
* The first collective of ``init()`` (:meth:`ddl_tf.core.job.Job.create`), when
  MPI was already initialized (the program imported ``mpi4py.MPI`` itself)
  and a rank never calls ``init()``.

The bounds, all set by ``DDL_START_TIMEOUT`` (:attr:`ddl_tf.config.DDLConfig.start_timeout_seconds`,
60 s by default, 0 for none):

1. Under ``ddlrun`` (which sets ``DDL_START_ADDR``), each rank reports to
   ddlrun's start-up check (:mod:`ddl_tf.launch.startup`) *before* MPI
   starts, and waits there, in Python, for its verdict
   (:func:`check_in_with_launcher`): either every rank has come, or, within
   the timeout of the first rank's report, the list of those that did not,
   which every waiting rank raises as :class:`~ddl_tf.errors.StartupError`.
   Then each rank reports once more when ``MPI_Init`` has returned; if that
   does not happen within the timeout (a rank died in between), ddlrun says
   which ranks and ends the job. The same holds for each launch of an
   elastic job (its first ranks, and those of a relaunch after a node
   crash); ranks that a growing job spawns are bounded by the spawn's own
   timeout instead (``DDL_ELASTIC_SPAWN_TIMEOUT``).
2. Under any launcher, once MPI is up and before the first collective,
   :func:`check_in_over_mpi` exchanges non-blocking point-to-point messages
   with the first rank of the job, polled until the timeout: ranks whose MPI
   runs but who never call ``init()`` are named on every rank that did.
3. Under other launchers ``MPI_Init`` itself cannot say who is missing;
   :func:`mpi_init_guard` bounds it with a watchdog process that, past the
   timeout, writes why on the rank's standard error and ends the rank (then
   mpirun ends the job).

Example:
    >>> from ddl_tf.core.startup import not_started_message
    >>> print(not_started_message([1, 3], 4, 60.0))  # doctest: +NORMALIZE_WHITESPACE
    Rank(s) 1, 3 of 4 did not call ddl_tf.init() within 60 s of the first rank's init()
    (DDL_START_TIMEOUT=60): they never reached it, hang before it, or died before it (see
    their output above). Every rank of the job must call init() (and a program that starts
    MPI itself before init(), e.g. by importing mpi4py.MPI, must do so on every rank); if
    some start slowly, raise DDL_START_TIMEOUT (0 waits for ever).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ddl_tf.errors import StartupError

__all__ = [
    "check_in_with_launcher",
    "check_in_over_mpi",
    "mpi_init_guard",
    "not_started_message",
    "CONNECT_SECONDS",
    "UNIX_PREFIX",
    "VERDICT_MARGIN_SECONDS",
    "TAG_ARRIVED",
    "TAG_ACK",
    "TAG_VERDICT",
]

logger = logging.getLogger(__name__)

UNIX_PREFIX = "unix:"
"""How ``DDL_START_ADDR`` names a Unix socket (``unix:/tmp/ddlrun-start-.../check``)."""

CONNECT_SECONDS = 10.0
"""How long a rank tries to reach ddlrun's start-up check before it gives up."""

VERDICT_MARGIN_SECONDS = 10.0
"""How long past the timeout a waiting rank gives the deciding side (ddlrun's check, or the
first rank of the job) to send its verdict before concluding that it is gone."""

TAG_ARRIVED, TAG_ACK, TAG_VERDICT = 32201, 32202, 32203
"""Point-to-point tags of :func:`check_in_over_mpi` (below the 32767 every MPI allows)."""

_POLL_FIRST, _POLL_MAX = 0.001, 0.05

_UNFINISHED: list = []
"""Start-up reports still in flight (kept referenced: MPI owns their buffers until they end)."""


def not_started_message(missing: Sequence[int], size: int, timeout: float) -> str:
    """What every rank (and ddlrun) says about ranks that did not call ``init()`` in time.

    Args:
        missing: The ranks that did not.
        size: Ranks in the job.
        timeout: The ``DDL_START_TIMEOUT`` in force.

    Returns:
        The message, with the fix.
    """
    ranks = ", ".join(str(r) for r in missing)
    return (
        f"Rank(s) {ranks} of {size} did not call ddl_tf.init() within {timeout:g} s of the first "
        f"rank's init() (DDL_START_TIMEOUT={timeout:g}): they never reached it, hang before it, "
        "or died before it (see their output above). Every rank of the job must call init() "
        "(and a program that starts MPI itself before init(), e.g. by importing mpi4py.MPI, "
        "must do so on every rank); if some start slowly, raise DDL_START_TIMEOUT (0 waits "
        "for ever)."
    )


# --------------------------------------------------------------------------- under ddlrun


def check_in_with_launcher(
    address: str, rank: int, size: int, timeout: float, members: Sequence[int] | None = None
) -> Callable[[], None]:
    """Report to ddlrun's start-up check and wait until every rank has (before MPI starts).

    Args:
        address: ``host:port``, or ``unix:PATH``, from ``DDL_START_ADDR``.
        rank: This rank (the launcher's numbering, which is MPI's).
        size: Ranks in the job.
        timeout: ``DDL_START_TIMEOUT`` (ddlrun counts it from the first report).
        members: The ranks that call ``init()`` (``init(comm=[...])``); None: all.

    Returns:
        ``started()``: call it once ``MPI_Init`` has returned (it tells ddlrun
        and closes the connection).

    Raises:
        StartupError: Ranks did not report within the timeout (the message
            names them), or ddlrun's check cannot be reached or does not answer.
    """
    report: dict[str, Any] = {"rank": rank, "size": size, "timeout": timeout, "pid": os.getpid()}
    if members is not None:
        report["members"] = sorted(int(r) for r in members)
    try:
        conn = _connect(address)
    except (OSError, ValueError) as err:
        raise StartupError(
            f"Rank {rank} cannot reach ddlrun's start-up check at {address} (DDL_START_ADDR): "
            f"{err}. Run the job through ddlrun from a host the ranks can connect to, or unset "
            "DDL_START_ADDR (and DDL_START_TIMEOUT=0 to wait for ever) to start without it."
        ) from err
    try:
        conn.sendall(json.dumps(report).encode() + b"\n")
        conn.settimeout(timeout + VERDICT_MARGIN_SECONDS)
        reader = conn.makefile("rb")
        line = reader.readline()
    except OSError as err:  # socket.timeout included
        conn.close()
        raise StartupError(
            f"Rank {rank}: ddlrun's start-up check at {address} gave no verdict within "
            f"{timeout + VERDICT_MARGIN_SECONDS:g} s ({err}); ddlrun may have died. "
            "Restart the job."
        ) from err
    if not line:
        conn.close()
        raise StartupError(
            f"Rank {rank}: ddlrun's start-up check at {address} closed the connection without "
            "a verdict (ddlrun stopped?). Restart the job."
        )
    verdict = json.loads(line)
    if verdict.get("missing"):
        conn.close()
        raise StartupError(verdict["message"])

    def started() -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b'{"started": true}\n')
        conn.close()

    return started


def _connect(address: str) -> socket.socket:
    """A connection to ddlrun's check at ``host:port``, or ``unix:PATH`` (a Unix socket).

    ddlrun gives a Unix socket's path to ranks that share its files but not
    its network (the ``--rehearse`` cluster's virtual nodes, each in a network
    namespace of its own: a socket file is reached across namespaces).
    """
    if address.startswith(UNIX_PREFIX):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(CONNECT_SECONDS)
        try:
            conn.connect(address[len(UNIX_PREFIX) :])
        except OSError:
            conn.close()
            raise
        return conn
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS)


# --------------------------------------------------------------------------- over MPI


def check_in_over_mpi(comm: Any, members: Sequence[int], timeout: float) -> None:
    """Every rank of ``members`` reports to the first; all learn who did not come in time.

    Non-blocking point-to-point messages on ``comm``, polled, so that no rank
    waits beyond the timeout (plus :data:`VERDICT_MARGIN_SECONDS` for the
    verdict) for a rank that never calls ``init()``. The first member
    acknowledges each report as it comes, so a waiting rank knows it is alive;
    a rank that gets no acknowledgement within the timeout names the first
    member. Nothing here is a collective: ranks that never call it cannot
    block it.

    Args:
        comm: An intracommunicator (``COMM_WORLD`` or the one ``init`` was given).
        members: The ranks of ``comm`` that call ``init()``, in order; the first decides.
        timeout: Seconds; 0 skips the check.

    Raises:
        StartupError: Members did not report within the timeout (named).
    """
    members = [int(r) for r in members]
    if len(members) < 2 or timeout <= 0:
        return
    me, root = comm.Get_rank(), members[0]
    if me == root:
        _decide(comm, members, timeout)
    else:
        _report(comm, me, root, members, timeout)


def _decide(comm: Any, members: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    others = members[1:]
    inbox = {r: np.zeros(1, np.int64) for r in others}
    pending = {r: comm.Irecv(inbox[r], source=r, tag=TAG_ARRIVED) for r in others}
    acks = []
    ack = np.zeros(1, np.int64)

    def arrived() -> bool:
        for r in [r for r, req in pending.items() if req.Test()]:
            del pending[r]
            acks.append(comm.Isend(ack, dest=r, tag=TAG_ACK))
        return not pending

    _poll(arrived, deadline)
    missing = sorted(pending)
    for req in pending.values():
        req.Cancel()
        req.Wait()
    verdict = np.full(len(members) + 1, -1, np.int64)
    verdict[0] = len(missing)
    verdict[1 : 1 + len(missing)] = missing
    sends = [comm.Isend(verdict, dest=r, tag=TAG_VERDICT) for r in others if r not in missing]
    # the receivers posted their receives before reporting: these complete at once
    _poll(
        lambda: all(req.Test() for req in acks + sends), time.monotonic() + VERDICT_MARGIN_SECONDS
    )
    if missing:
        raise StartupError(not_started_message(missing, len(members), timeout))


def _report(comm: Any, me: int, root: int, members: list[int], timeout: float) -> None:
    ack = np.zeros(1, np.int64)
    verdict = np.full(len(members) + 1, -1, np.int64)
    acked = comm.Irecv(ack, source=root, tag=TAG_ACK)
    decided = comm.Irecv(verdict, source=root, tag=TAG_VERDICT)
    sent = comm.Isend(np.array([me], np.int64), dest=root, tag=TAG_ARRIVED)
    _UNFINISHED.append(sent)  # until the root has it (never, if the root never comes)
    if not _poll(acked.Test, time.monotonic() + timeout):
        for req in (acked, decided):
            req.Cancel()
            req.Wait()
        raise StartupError(
            f"Rank {root} of {len(members)} did not call ddl_tf.init() within {timeout:g} s of "
            f"rank {me}'s init() (DDL_START_TIMEOUT={timeout:g}); rank {root} collects the "
            "ranks' start-up reports, so which other ranks are missing is not known here. It "
            "never reached init(), hangs before it, or died before it (see its output above). "
            "Every rank of the job must call init(); if some start slowly, raise "
            "DDL_START_TIMEOUT (0 waits for ever)."
        )
    if not _poll(decided.Test, time.monotonic() + timeout + VERDICT_MARGIN_SECONDS):
        decided.Cancel()
        decided.Wait()
        raise StartupError(
            f"Rank {root} acknowledged rank {me}'s start-up report but sent no verdict within "
            f"{timeout + VERDICT_MARGIN_SECONDS:g} s: it died or hangs (see its output above)."
        )
    sent.Wait()  # the root acknowledged it: complete
    _UNFINISHED.remove(sent)
    count = int(verdict[0])
    if count:
        raise StartupError(
            not_started_message([int(r) for r in verdict[1 : 1 + count]], len(members), timeout)
        )


def _poll(done: Callable[[], Any], deadline: float) -> bool:
    """Call ``done`` until it is true or ``deadline`` passes, sleeping ever longer (max 50 ms)."""
    pause = _POLL_FIRST
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX)


# --------------------------------------------------------------------------- other launchers

_WATCHDOG = """
import os, select, signal, sys
parent, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    try:
        os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


@contextlib.contextmanager
def mpi_init_guard(rank: int, size: int, timeout: float) -> Iterator[None]:
    """End this rank, saying why, if ``MPI_Init`` in the block lasts beyond ``timeout``.

    ``MPI_Init`` holds the GIL while it waits for the other ranks, so the
    watchdog is a small process of its own (Python, no imports beyond the
    standard library): it waits on a pipe that this process closes when the
    block ends (or when it dies), and past the timeout writes the reason on
    the shared standard error and kills this rank, which makes mpirun end
    the job.

    Args:
        rank: This rank (the launcher's numbering).
        size: Ranks in the job.
        timeout: Seconds; 0 means no guard.

    Yields:
        Nothing; run ``MPI_Init`` inside.
    """
    if timeout <= 0 or size < 2:
        yield
        return
    message = (
        f"ddl_tf: rank {rank}: MPI's start-up (MPI_Init) did not complete within {timeout:g} s "
        f"(DDL_START_TIMEOUT={timeout:g}): a rank of the {size} never called ddl_tf.init() or "
        "died before it. MPI does not say which, and under this launcher no rank can; under "
        "ddlrun the start-up check names them. Ending this rank. Every rank of the job must "
        "call init(); if some start slowly, raise DDL_START_TIMEOUT (0 waits for ever)."
    )
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(os.getpid()), str(timeout), message],
            stdin=subprocess.PIPE,
            close_fds=True,
        )
    except (OSError, ValueError) as err:  # no process to spare: start unguarded, as MPI would
        logger.warning("MPI start-up runs without its time limit: %s", err)
        yield
        return
    try:
        yield
    finally:
        assert watchdog.stdin is not None
        with contextlib.suppress(OSError):
            watchdog.stdin.close()  # the watchdog sees end of file and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(timeout=5)
