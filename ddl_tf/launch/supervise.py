"""Run the launcher process and supervise it: signals forwarded, the whole job ended, exit codes.

``ddlrun`` plans a job (:mod:`ddl_tf.ddlrun`, :mod:`~ddl_tf.launch.command`) and hands
the ``mpirun`` command to :func:`run_job`, which starts it in a session of its own,
forwards the first stop signal (SIGTERM, SIGINT, SIGHUP) to it, and makes sure
that the job is gone within :data:`STOP_GRACE_S` after that: whatever of the
session is still there (``mpirun`` and the ranks it started on this machine,
orphans included) is killed. What outlives an ``mpirun`` that ended by itself
is killed after :data:`ORPHAN_GRACE_S`. An elastic job's status is read from its output
(:class:`FinishedWatch`), since ``mpirun``'s says little under MPI's fault tolerance.
Any job that mpirun failed to start, before any rank ran (an intermittent failure of
Open MPI's runtime, :class:`StartWatch`), is launched again, at most twice
(:func:`run_fixed`, :func:`run_elastic`).

The processes of the session are found and signalled with ``psutil``, which
walks the process table portably and refuses to signal a process whose PID
has been reused since it was found. Two things stay our own code, because no
library does them: which session a process is in (``os.getsid``; psutil has no
session id), and reading Open MPI's messages in the job's output (its wording,
which :class:`FinishedWatch` matches, is Open MPI's own, not an interface).

What the supervisor has to say (a signal received, a failed job, an elastic
job that did not finish) goes to the ``report`` callable the caller passes;
``ddlrun`` prints it on its standard error.

Example (a command that ends by itself; nothing is signalled)::

    >>> import sys
    >>> from ddl_tf.launch.supervise import run_job
    >>> run_job([sys.executable, "-c", "raise SystemExit(3)"], {}, report=print)
    ddlrun: job failed with exit code 3
    3
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from typing import IO, Any

import psutil

from ddl_tf import env

__all__ = [
    "FORWARDED_SIGNALS",
    "STOP_GRACE_S",
    "SPAWN_FAILED_GRACE_S",
    "FinishedWatch",
    "run_job",
    "run_elastic",
    "run_fixed",
    "StartWatch",
    "Relaunch",
    "exit_code",
    "session_processes",
    "kill_session",
]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What ddlrun passes on to mpirun: a scheduler's stop (Slurm, PBS, Kubernetes and ``kill``
send SIGTERM), a terminal's Ctrl-C, a closed session."""

STOP_GRACE_S = 5.0
"""Seconds mpirun gets to end the ranks after a forwarded signal before the whole job is
killed (SIGKILL to every process of mpirun's session: mpirun and every rank it started here)."""

SPAWN_FAILED_GRACE_S = 1.0
"""Seconds an elastic job whose spawned ranks never connected gets to end by itself before ddlrun
kills what is left of it: the spawning ranks end themselves at once (each prints why first), and
only the unconnected ranks, which may hang, and mpirun are left; waiting longer delays the
relaunch without it."""

ORPHAN_GRACE_S = 2.0
"""Seconds processes of mpirun's session that outlive mpirun (which ended by itself) get to end
before they are killed: whatever of a job outlives its mpirun would otherwise run on unwatched
(seen: a rank of an elastic job that the job's MPI_Abort did not end, sleeping on)."""

KILL_WAIT_S = 2.0
"""Seconds to wait, after a SIGKILL, for the killed processes to be gone (they cannot refuse;
this only keeps ddlrun from exiting before the kernel has removed them)."""


def session_processes(session: int) -> list[psutil.Process]:
    """The live processes of this machine in session ``session`` (mpirun's: it and its local ranks).

    A rank whose mpirun died first is still found: it keeps its session when
    it is re-parented. Zombies (dead, waiting to be reaped) are left out.

    Args:
        session: The session id, which is the pid of the process that made it
            (``start_new_session=True``).
    """
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):  # gone, or not ours to ask about
            if os.getsid(proc.pid) == session and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def kill_session(session: int, signum: int = signal.SIGKILL) -> None:
    """Send ``signum`` to every process left in ``session``; after a SIGKILL, wait until they are gone.

    A killed process counts as gone once it is a zombie: it runs no more, and
    its parent (mpirun, or whoever adopted it) reaps it when it will. Waiting
    for the reaping too cost 1.7 s here, where the adopting process reaps late.

    Args:
        session: The session id (mpirun's pid).
        signum: The signal (SIGKILL: then wait at most :data:`KILL_WAIT_S` for them to go).
    """
    members = session_processes(session)
    for proc in members:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signum)  # psutil refuses a pid reused since the scan
    if signum == signal.SIGKILL and members:
        deadline = time.monotonic() + KILL_WAIT_S
        while any(_running(proc) for proc in members) and time.monotonic() < deadline:
            time.sleep(0.02)


def _running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs (a zombie does not)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone (or, not ours to ask about, past our signals anyway)
        return False


def run_job(
    command: list[str],
    child_env: dict[str, str],
    *,
    report: Callable[[str], None],
    watch: Callable[[IO[bytes], Any], None] | None = None,
    stop: threading.Event | None = None,
    grace: float = STOP_GRACE_S,
) -> int:
    """Run mpirun and wait; a stop signal ends the whole job within seconds.

    mpirun gets a session of its own, so that ddlrun alone decides what it
    receives: the first SIGTERM, SIGINT or SIGHUP is forwarded to it (Open
    MPI then terminates the ranks); if the job is still there after
    :data:`STOP_GRACE_S`, every process of its session is killed. ddlrun then
    exits with ``128 + signal`` (143 for SIGTERM), the status a shell gives a
    command the signal stopped.

    Args:
        command: The mpirun argument list.
        child_env: mpirun's environment.
        report: Called with each line ddlrun has to say (the signal received,
            a failed job).
        watch: ``watch(stream, sink)``, if given, reads mpirun's standard output
            and error (a thread each) instead of them going straight to
            ddlrun's, and passes them on to ``sink``.
        stop: If given and set while the job runs (the job cannot go on, as
            ``watch`` read in its output), the job gets ``grace`` seconds to
            end by itself; then every process of its session is killed.
        grace: Seconds a job stopped through ``stop`` gets (:data:`STOP_GRACE_S`;
            a forwarded signal always gets :data:`STOP_GRACE_S`).

    Returns:
        ``128 + N`` after ddlrun received signal N; else, without ``watch``,
        :func:`exit_code` of mpirun's status, and with it mpirun's status as
        is (``128 + N`` if a signal N ended it).
    """
    proc = subprocess.Popen(
        command,
        env=child_env,
        start_new_session=True,
        stdout=subprocess.PIPE if watch is not None else None,
        stderr=subprocess.PIPE if watch is not None else None,
    )
    readers = []
    if watch is not None:
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            readers.append(threading.Thread(target=watch, args=(stream, sink), daemon=True))
            readers[-1].start()
    received: list[int] = []

    def forward(signum, _frame) -> None:
        if not received:
            report(f"ddlrun: {signal.Signals(signum).name} received; stopping the job")
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
        received.append(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    stopped_at = None
    try:
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if (received or (stop is not None and stop.is_set())) and stopped_at is None:
                    stopped_at = time.monotonic()
                allowed = STOP_GRACE_S if received else grace
                if stopped_at is not None and time.monotonic() - stopped_at > allowed:
                    kill_session(proc.pid)
                    code = proc.wait()
                    break
        if received or stopped_at is not None or (stop is not None and stop.is_set()):
            # mpirun may return before its local ranks are gone: wait for them
            deadline = (stopped_at or time.monotonic()) + (STOP_GRACE_S if received else grace)
            psutil.wait_procs(
                session_processes(proc.pid), timeout=max(0.0, deadline - time.monotonic())
            )
            kill_session(proc.pid)
        elif left := session_processes(proc.pid):
            # mpirun ended by itself but left processes of its session behind: ranks of an
            # elastic job (MPI's fault tolerance) that an MPI_Abort did not end were seen
            # living on, orphans; they get ORPHAN_GRACE_S to go, then are killed
            psutil.wait_procs(left, timeout=ORPHAN_GRACE_S)
            kill_session(proc.pid)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for reader in readers:
            reader.join(timeout=STOP_GRACE_S)
    if received:
        return 128 + received[0]
    if watch is None:
        return exit_code(code, report=report)
    return 128 - code if code < 0 else code


class StartWatch:
    """Passes a job's output through and notes whether mpirun failed at its own start-up.

    The failure is :data:`START_FAILED`: OpenPMIx's server in mpirun could not
    start its listener, so mpirun ends during its own start-up, before it
    launches any rank, with status 213 (PRRTE's "error already reported").
    Here it happens when a killed mpirun left its session directory
    (``$TMPDIR/ompi.<pid>``, with its rendezvous files) behind and a new
    mpirun gets the same pid: PMIx will not take over the old files. The
    message comes from PMIx's server only (ranks are its clients), so it
    means that no rank ran; the next launch gets another pid and starts.

    The output is passed on as it comes, not by lines (progress bars that
    redraw with ``\\r`` stay live); the message is found across chunk edges.

    Args:
        report: Called with what :meth:`retry_start` has to say.
        retries: Most launches again per job (:data:`START_RETRIES`; 0: none).
    """

    START_FAILED = b"The PMIx server's listener thread failed to start"
    """What OpenPMIx's server in mpirun prints when it cannot start, before any rank runs: an
    intermittent failure (see the class docstring; seen in CI, and in 1 of 60 launches of a
    plain ``mpirun -np 2`` here while 60 killed mpiruns' session directories lay in /tmp)."""

    START_RETRIES = 2
    """Launches again after :data:`START_FAILED`, per job (ddlrun's ``--start-retries``)."""

    RETRY_PAUSE_S = 1.0
    """Seconds between a failed start and the next launch (a stop signal ends the wait)."""

    STOPPED_BY_DDLRUN = tuple(128 + s for s in FORWARDED_SIGNALS)
    """Statuses of a job that ddlrun stopped on a signal it received (never relaunched)."""

    def __init__(self, report: Callable[[str], None], retries: int = START_RETRIES) -> None:
        self.report = report
        self.retries = retries
        self.start_retries = 0
        self.start_failed = False
        self.stopped: int | None = None  # 128 + N: signal N came while waiting to launch again

    def __call__(self, stream, sink=None) -> None:
        sink = sink if sink is not None else sys.stdout
        keep = len(self.START_FAILED) - 1
        tail = b""
        while chunk := stream.read1(65536):
            if self.START_FAILED in tail + chunk:
                self.start_failed = True
            tail = (tail + chunk)[-keep:]
            sink.buffer.write(chunk)
            sink.flush()

    def retry_start(self, code: int, *, ran: bool = False) -> bool:
        """Whether to launch the same job again: mpirun failed at start-up (:data:`START_FAILED`).

        Only when mpirun printed it, its status is a failure that ddlrun did not
        cause (a stop signal ddlrun received never gets a retry), no rank ran
        (``ran``: e.g. a rank reported to ddlrun's start-up check; then the
        job's code may have had effects that must not happen twice), and
        fewer than ``retries`` retries were made. Says so, naming mpirun's
        status and the attempt, then waits :data:`RETRY_PAUSE_S`; a stop
        signal then ends the wait, and there is no retry (:attr:`stopped`).

        Args:
            code: mpirun's status as :func:`run_job` returns it.
            ran: Whether some rank is known to have run.
        """
        if (
            not self.start_failed
            or ran
            or code == 0
            or code in self.STOPPED_BY_DDLRUN
            or self.start_retries >= self.retries
        ):
            return False
        self.start_retries += 1
        self.start_failed = False
        self.report(
            "ddlrun: mpirun failed at start-up, before any rank ran (exit code "
            f'{code}; "The PMIx server\'s listener thread failed to start": an intermittent '
            "failure of Open MPI's runtime, e.g. a stale $TMPDIR/ompi.<pid> of a killed mpirun); "
            f"launching the job again in {self.RETRY_PAUSE_S:g} s (retry {self.start_retries} "
            f"of {self.retries}, attempt {self.start_retries + 1}; --start-retries 0 turns this "
            "off)"
        )
        self.stopped = _pause(self.RETRY_PAUSE_S)
        if self.stopped is not None:
            self.report(
                f"ddlrun: {signal.Signals(self.stopped - 128).name} received; the job is not "
                "launched again"
            )
            return False
        return True


def _pause(seconds: float) -> int | None:
    """Wait ``seconds``; a stop signal (:data:`FORWARDED_SIGNALS`) ends the wait.

    Returns:
        ``128 + N`` if signal N came, else None.
    """
    received: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, _f: received.append(signum)) for s in FORWARDED_SIGNALS
    }
    try:
        deadline = time.monotonic() + seconds
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 + received[0] if received else None


def run_fixed(
    command: list[str],
    child_env: dict[str, str],
    *,
    report: Callable[[str], None],
    stop: threading.Event | None = None,
    ran: Callable[[], bool] | None = None,
    retries: int = StartWatch.START_RETRIES,
) -> int:
    """Run a fixed-size job; launch it again if mpirun failed at start-up before any rank ran.

    :func:`run_job` with a :class:`StartWatch` reading mpirun's output: after
    :data:`StartWatch.START_FAILED` the same command runs again, at most
    ``retries`` times (see :meth:`StartWatch.retry_start`). With ``retries``
    0 the output goes straight through, unread, as :func:`run_job` alone does.

    Args:
        command: The mpirun argument list.
        child_env: mpirun's environment.
        report: Called with each line ddlrun has to say.
        stop: As for :func:`run_job` (ddlrun's start-up check sets it).
        ran: Whether some rank ran (reached ddlrun's start-up check); such a job
            is never launched again.
        retries: Most launches again (0: none).

    Returns:
        ddlrun's exit code, as :func:`run_job`'s without ``watch``: that of the
        last launch (a failure is reported), ``128 + N`` after signal N.
    """
    if retries <= 0:
        return run_job(command, child_env, report=report, stop=stop)
    watch = StartWatch(report, retries)
    while True:
        code = run_job(command, child_env, report=report, watch=watch, stop=stop)
        if not watch.retry_start(code, ran=ran is not None and ran()):
            break
    if watch.stopped is not None:
        return watch.stopped
    return code if code in watch.STOPPED_BY_DDLRUN else exit_code(code, report=report)


Relaunch = Callable[["FinishedWatch"], "tuple[list[str], dict[str, str]] | None"]
"""``again(watch)``: after mpirun lost a daemon, or the ranks spawned onto a new host never
connected, the command and environment that relaunch the job on the other hosts
(:attr:`FinishedWatch.dropped_hosts` left out), or None when it cannot be relaunched (it says
why)."""


def run_elastic(
    command: list[str],
    child_env: dict[str, str],
    *,
    report: Callable[[str], None],
    again: Relaunch | None = None,
    start_retries: int = StartWatch.START_RETRIES,
    watch: FinishedWatch | None = None,
    ran: Callable[[], bool] | None = None,
) -> int:
    """Run an elastic job: its status is whether its final ranks finished, not mpirun's.

    When Open MPI's runtime ends the job because it lost a host's daemon (a
    node crash), or the job's ranks end themselves because the ranks they
    spawned onto a new host never connected (``DDL_ELASTIC_SPAWN_TIMEOUT``;
    ddlrun then ends what is left of the job within
    :data:`SPAWN_FAILED_GRACE_S`), ``again`` gives the command that relaunches
    it on the other hosts, that host left out; the relaunched ranks resume
    from the last commit the ranks mirrored in host memory
    (:mod:`ddl_tf.membership.mirror`).

    Args:
        command: The mpirun argument list.
        child_env: mpirun's environment.
        report: Called with each line ddlrun has to say.
        again: Builds the relaunch (see :data:`Relaunch`); None: no relaunch.
        start_retries: Most launches again after mpirun failed at start-up
            (:meth:`StartWatch.retry_start`).
        watch: The watch to read the output with (default: a new one); ddlrun's
            start-up check stops a launch through its :attr:`FinishedWatch.halt`.
        ran: Whether some rank of the current launch is known to have run (reached
            ddlrun's start-up check): that launch is never launched again.

    Returns:
        ddlrun's exit code (see :meth:`FinishedWatch.status`) of the last launch.
    """
    finished = watch if watch is not None else FinishedWatch(report, start_retries)
    while True:
        code = run_job(
            command,
            child_env,
            report=report,
            watch=finished,
            stop=finished.halt,
            grace=SPAWN_FAILED_GRACE_S,
        )
        if finished.retry_start(code, ran=ran is not None and ran()):
            continue
        relaunch = again(finished) if again is not None and finished.relaunchable(code) else None
        if relaunch is None:
            return finished.status(code)
        command, child_env = relaunch
        finished.reset()


class FinishedWatch(StartWatch):
    """Passes an elastic job's output through and notes whether its final ranks finished.

    Under MPI's fault tolerance mpirun's exit status says little: a rank that
    failed and was survived can make it non-zero, and ranks that all failed
    after a membership change can leave it 0 (both measured here). The final
    membership's rank 0 prints :data:`~ddl_tf.env.ELASTIC_FINISHED` when it
    shuts down cleanly; this watch looks for that line, for Open MPI's
    report of a lost daemon, and for the trace of a defect of Open MPI 5.0's
    runtime that makes mpirun itself crash (:data:`CONNECT_DEFECT`), and for
    the ranks' report that ranks spawned onto a new host never connected
    (:data:`SPAWN_FAILED`: the spawning ranks end themselves, and the
    unconnected ranks may keep mpirun alive, so :func:`run_elastic` stops the
    rest and relaunches the job without that host, as after a lost daemon).
    Like every job's, it notes mpirun's failure at start-up (:class:`StartWatch`),
    reading by lines.

    Args:
        report: Called with what :meth:`status` has to say about a job that
            did not finish.
        retries: Most launches again after mpirun failed at start-up.
    """

    DAEMON_LOST = (b"A daemon failed to report back", b"lost communication with a remote daemon")
    """What Open MPI's runtime prints when it loses the daemon of a host (both forms seen)."""

    CONNECT_DEFECT = b"pmix_server_dyn.c"
    """The file a ``PMIX ERROR`` line names when PRRTE 3.0 (Open MPI 5.0's runtime) misreads
    the data of a connect between ranks on several hosts (every ``MPI_Comm_spawn`` onto
    another host than mpirun's). Its ``connect_release`` unpacks the collective's reply
    without the control block in front of it and then destructs an info entry past the end
    of a one-entry array, which corrupts mpirun's heap: mpirun later dies of SIGSEGV or
    SIGABRT, at exit or (rarely) while the job runs (measured in docs/elastic.md). PRRTE 4
    rewrote the function; Open MPI 5.0.x ships PRRTE 3.0."""

    SPAWN_FAILED = b"did not connect within"
    """What a growing job's ranks print (:mod:`ddl_tf.membership.reform`) before they end,
    when the ranks they spawned never connected (``DDL_ELASTIC_SPAWN_TIMEOUT``)."""

    SPAWN_FAILED_END = b"this rank ends itself"
    """The rest of that line (together with :data:`SPAWN_FAILED`: a rank's own line, not a
    program's output that happens to hold the words)."""

    UNCONNECTED = re.compile(rb"the new ranks on (.+?) did not connect within")
    """Where that line names the new ranks' hosts (``host:count, host:count``)."""

    CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)
    """Signals that end mpirun on its own (ddlrun forwards only :data:`FORWARDED_SIGNALS`)."""

    def __init__(
        self, report: Callable[[str], None], retries: int = StartWatch.START_RETRIES
    ) -> None:
        super().__init__(report, retries)
        self.finished = threading.Event()
        self.spawn_failed = threading.Event()
        self.halt = threading.Event()
        self.reset()

    def reset(self) -> None:
        """Forget what the last launch printed (before a relaunch).

        The events are cleared, not replaced: a caller may hold them for every
        launch (:func:`~ddl_tf.cluster.rehearse.run_rehearsal`'s ``stop``).
        """
        self.finished.clear()
        self.spawn_failed.clear()
        self.halt.clear()
        self.not_started: str | None = None
        self.unstarted_hosts: list[str] = []
        self.daemon_lost = False
        self.lost_host = ""
        self.lost_hosts: list[str] = []
        self.unconnected_hosts: list[str] = []
        self.connect_defect = False
        self.start_failed = False

    def start_check_failed(self, line: str, hosts: Collection[str] = ()) -> None:
        """For ddlrun's start-up check of this launch: it says ``line`` (ranks that did not
        call ``init()`` in time, named) and stops the launch (:attr:`halt`).

        MPI's start-up waits for every process of a launch, so the ranks that
        came cannot go on without the missing ones: the launch ends. As Horovod
        drops a worker that does not start, the missing ranks' ``hosts`` are
        then dropped (:attr:`dropped_hosts`) and the job relaunched on the others,
        if they give ``--min-np`` slots; otherwise the job ends (:meth:`status`).
        """
        self.not_started = line
        self.unstarted_hosts = list(dict.fromkeys(hosts))
        self.report(line)
        self.halt.set()

    def retry_start(self, code: int, *, ran: bool = False) -> bool:
        """:meth:`StartWatch.retry_start`, never once the job finished; forgets this launch."""
        if not super().retry_start(code, ran=ran or self.finished.is_set()):
            return False
        self.reset()
        return True

    def relaunchable(self, code: int) -> bool:
        """Whether the launch ended, the job unfinished, because Open MPI lost a host's daemon,
        because the ranks spawned onto a new host never connected, or because ranks of the
        launch did not call ``init()`` in time (the hosts to leave out are :attr:`dropped_hosts`).

        Args:
            code: mpirun's status as :func:`run_job` returns it (a stop signal
                ddlrun received and forwarded is never relaunched).
        """
        lost = self.daemon_lost and bool(self.lost_hosts)
        unconnected = self.spawn_failed.is_set() and bool(self.unconnected_hosts)
        unstarted = self.not_started is not None and bool(self.unstarted_hosts)
        return (
            (lost or unconnected or unstarted)
            and not self.finished.is_set()
            and code not in self.STOPPED_BY_DDLRUN
        )

    @property
    def dropped_hosts(self) -> list[str]:
        """The hosts a relaunch leaves out: those whose daemon was lost, those whose
        spawned ranks never connected, and those whose ranks did not call ``init()``."""
        lost = self.lost_hosts if self.daemon_lost else []
        return list(dict.fromkeys([*lost, *self.unconnected_hosts, *self.unstarted_hosts]))

    def why_dropped(self, hosts: list[str]) -> str:
        """What happened to ``hosts`` (some of :attr:`dropped_hosts`), for ddlrun's message.

        Example:
            >>> watch = FinishedWatch(print)
            >>> watch.unconnected_hosts = ["node2"]
            >>> watch.why_dropped(["node2"])  # doctest: +ELLIPSIS
            'the ranks spawned onto the new host node2 never connected within ...'
        """
        unconnected = [h for h in hosts if h in self.unconnected_hosts]
        unstarted = [h for h in hosts if h in self.unstarted_hosts and h not in unconnected]
        lost = [h for h in hosts if h not in unconnected and h not in unstarted]
        parts = []
        if unstarted:
            parts.append(
                f"ranks on host {', '.join(unstarted)} did not call init() within "
                "DDL_START_TIMEOUT (named above; MPI's start-up waits for every rank of a "
                "launch, so ddlrun ended the launch); ddlrun drops that host (blacklisted for "
                "the job, or for its --blacklist-cooldown-range)"
            )
        if lost:
            parts.append(
                f"Open MPI lost its daemon on host {', '.join(lost)} (a node crash: Open MPI "
                "5.0's runtime then ends every rank)"
            )
        if unconnected:
            parts.append(
                f"the ranks spawned onto the new host {', '.join(unconnected)} never connected "
                "within DDL_ELASTIC_SPAWN_TIMEOUT (the spawning ranks ended themselves: "
                "MPI_Comm_spawn cannot be interrupted); that host is dropped (blacklisted "
                "for the job, or for its --blacklist-cooldown-range) and the job goes on "
                "without it"
            )
        return "; ".join(parts)

    def __call__(self, stream, sink=None) -> None:
        sink = sink if sink is not None else sys.stdout
        for line in iter(stream.readline, b""):
            if line.startswith(env.ELASTIC_FINISHED.encode()):
                self.finished.set()
            if any(text in line for text in self.DAEMON_LOST):
                self.daemon_lost = True
            if b"PMIX ERROR" in line and self.CONNECT_DEFECT in line:
                self.connect_defect = True
            if self.SPAWN_FAILED in line and self.SPAWN_FAILED_END in line:
                found = self.UNCONNECTED.search(line)
                for item in found.group(1).split(b", ") if found else ():
                    host = item.rsplit(b":", 1)[0].strip().decode(errors="replace")
                    if host and host not in self.unconnected_hosts:
                        self.unconnected_hosts.append(host)
                self.spawn_failed.set()
                self.halt.set()
            if self.START_FAILED in line:
                self.start_failed = True
            host = ""
            if self.daemon_lost and b"Remote host:" in line:
                host = line.split(b":", 1)[1].strip().decode(errors="replace")
            elif self.daemon_lost and b"Remote daemon:" in line and b" on node " in line:
                host = line.rsplit(b" on node ", 1)[1].strip().decode(errors="replace")
            if host:
                self.lost_host = self.lost_host or host
                if host not in self.lost_hosts:
                    self.lost_hosts.append(host)
            sink.buffer.write(line)
            sink.flush()

    def status(self, code: int) -> int:
        """ddlrun's exit code from mpirun's ``code`` and whether the finished line came.

        A finished job whose mpirun then crashed of the PRRTE defect
        (:data:`CONNECT_DEFECT`) ends 0 with a warning: the finished line means
        every rank of the final membership had passed ddl_tf's collective
        shutdown, and mpirun was still alive to pass that line on. Any other
        crash of mpirun keeps its status (``128 + signal``); a stop signal that came
        while ddlrun waited to launch the job again gives ``128 + signal``.
        """
        if self.stopped is not None:
            return self.stopped
        crash = self._crash_signal(code)
        if self.finished.is_set():
            if crash is not None and self.connect_defect:
                self.report(
                    f"ddlrun: warning: mpirun died of {crash.name} after the elastic job "
                    "finished (every rank of the final membership had finished and shut down; "
                    "nothing of the training was lost), so ddlrun exits 0. This is a defect of "
                    "Open MPI 5.0's runtime (PRRTE 3.0: connect_release in pmix_server_dyn.c, "
                    "the PMIX ERROR above, open-mpi/ompi#13521): growing a job onto another "
                    "host corrupts mpirun's memory (PRRTE 4 rewrote that function)."
                )
                return 0
            return code if code >= 128 else 0
        if self.not_started is not None:
            self.report(
                "ddlrun: the elastic job stopped at the start of its launch: MPI's start-up "
                "waits for every rank of a launch, so the ranks that came cannot train without "
                "the ones named above; ddlrun ended them all, and could not relaunch the job "
                "without those ranks' hosts (see above why). Fix what keeps those ranks from "
                "calling init() (see their output above), or raise --start-timeout "
                "(DDL_START_TIMEOUT) if they start slowly."
            )
            return 1
        if self.daemon_lost:
            why = (
                "the node died, or its runtime process was killed or cut off"
                if not self.connect_defect
                else "its runtime process may have crashed of a defect of Open MPI 5.0's runtime "
                "that growing a job onto another host sets off: PRRTE 3.0's connect_release, "
                "the PMIX ERROR in pmix_server_dyn.c above, open-mpi/ompi#13521"
            )
            self.report(
                f"ddlrun: Open MPI lost its daemon on host {self.lost_host or '(see above)'} "
                f"({why}). An elastic job "
                "survives the loss of ranks, but Open MPI 5.0's runtime (PRRTE) ends the whole "
                "job when one of its daemons is lost, so the job stopped. Restart it; keep "
                "checkpoints on rank 0 (e.g. keras.callbacks.ModelCheckpoint) to resume from."
            )
            return code or 1
        if self.spawn_failed.is_set():
            where = ", ".join(self.unconnected_hosts) or "(see above)"
            self.report(
                f"ddlrun: the elastic job stopped: the ranks it spawned onto the new host {where} "
                "never connected within DDL_ELASTIC_SPAWN_TIMEOUT (see the ranks' errors above), "
                "ddlrun ended what was left of that launch, those ranks included, and could not "
                "relaunch the job without that host (see above why). Check that the program "
                "starts on that host (same path, same Python environment), or raise "
                "DDL_ELASTIC_SPAWN_TIMEOUT if it starts slowly; keep checkpoints on rank 0 to "
                "resume from."
            )
            return 1
        if crash is not None:
            cause = (
                "a defect of Open MPI 5.0's runtime (PRRTE 3.0: connect_release in "
                "pmix_server_dyn.c, the PMIX ERROR above, open-mpi/ompi#13521) that growing a "
                "job onto another host sets off"
                if self.connect_defect
                else "Open MPI's runtime crashed"
            )
            self.report(
                f"ddlrun: mpirun died of {crash.name} before the elastic job finished ({cause}); "
                "the job stopped. Restart it; keep checkpoints on rank 0 (e.g. "
                "keras.callbacks.ModelCheckpoint) to resume from."
            )
            return code
        if code >= 128:  # a signal stopped the job (ddlrun's, forwarded)
            return code
        self.report(
            "ddlrun: the elastic job ended without its ranks finishing (every rank failed or "
            f"left; mpirun's status {code}): see the ranks' errors above"
        )
        return code or 1

    def _crash_signal(self, code: int) -> signal.Signals | None:
        """The signal in ``code`` (``128 + N``) if it is one mpirun dies of by itself."""
        if code > 128 and code - 128 in self.CRASH_SIGNALS:
            return signal.Signals(code - 128)
        return None


def exit_code(code: int, *, report: Callable[[str], None]) -> int:
    """ddlrun's exit code for mpirun's return code ``code``: ``128 + N`` if signal N ended it.

    Args:
        code: mpirun's return code (negative: the signal that ended it).
        report: Told that the job failed, when ``code`` is a failure code.
    """
    if code < 0:
        return 128 - code
    if code != 0:
        report(f"ddlrun: job failed with exit code {code}")
    return code
