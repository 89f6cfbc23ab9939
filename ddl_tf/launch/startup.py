"""ddlrun's start-up check: the ranks report before MPI starts; those that do not are named.

``MPI_Init`` waits until every process of the job has called it, silently
and for ever when one never does (see :mod:`ddl_tf.core.startup`). So
``ddlrun`` listens on a TCP port (``DDL_START_ADDR``, exported to the ranks)
and each rank's ``init()`` reports there before it starts MPI, then waits for
the verdict. When every rank has reported, all are told to go on; if some
have not within ``DDL_START_TIMEOUT`` of the first report (the ranks send
their setting), the ones that came are told which did not, and each raises
:class:`~ddl_tf.errors.StartupError` with that message, which ddlrun prints too.
After the go, each rank reports again once ``MPI_Init`` has returned; ranks
that do not within the timeout (a rank died between its report and MPI's
start) are named, and the job is ended through ``stop``.

ddlrun opens one for each launch of a job: a fixed-size job's, and each
launch of an elastic job (the first one and each relaunch; ddlrun then drops
the missing ranks' hosts, :meth:`~ddl_tf.launch.supervise.FinishedWatch.start_check_failed`).
On the ``--rehearse`` cluster it listens on a Unix socket (``unix:PATH``):
the virtual nodes have a network of their own but share this machine's files.

It runs in a thread of ddlrun, one ``selectors`` loop over the listening
socket and the ranks' connections.

Example (no rank reports, nothing to say):
    >>> import threading
    >>> from ddl_tf.launch.startup import StartupCheck
    >>> check = StartupCheck(2, report=print, stop=threading.Event())
    >>> check.address.startswith("127.0.0.1:")
    True
    >>> check.close()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddl_tf import env
from ddl_tf.core.startup import UNIX_PREFIX, not_started_message
from ddl_tf.launch.hosts import is_local
from ddl_tf.launch.worker import host_of_rank

if TYPE_CHECKING:
    from ddl_tf.launch.command import LaunchPlan

__all__ = ["StartupCheck", "StartChecks", "listen_address", "startup_check"]

logger = logging.getLogger(__name__)

_TICK = 0.1


def listen_address(remote_hosts: list[str], interface: str | None = None) -> tuple[str, str]:
    """Where the check listens, and the address the ranks are told to connect to.

    A job on this machine only: the loopback address. Otherwise every
    address of this host, and, for the ranks, the address of the network
    interface MPI is told to use (``--network-interface``, its first), else
    the address this host sends from towards the first remote host (the
    route the ranks' hosts reach it by; Open MPI's daemons connect back to
    mpirun the same way).

    Args:
        remote_hosts: The job's hosts that are not this machine.
        interface: ddlrun's ``--network-interface`` (comma-separated names), or None.

    Returns:
        ``(bind, advertise)`` addresses.
    """
    if not remote_hosts:
        return "127.0.0.1", "127.0.0.1"
    if interface:
        name = interface.split(",")[0].strip()
        with contextlib.suppress(OSError):
            return "0.0.0.0", _interface_address(name)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(remote_hosts[0]), 9))  # no packet is sent
        return "0.0.0.0", str(probe.getsockname()[0])


def _interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux's SIOCGIFADDR)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", name.encode()[:15])
        answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
        return socket.inet_ntoa(answer[20:24])


class StartupCheck:
    """The start-up check of one job of ``size`` ranks (see the module docstring).

    Args:
        size: Ranks in the job (``-np``).
        report: Called with each line ddlrun has to say about the start.
        stop: Set when the job cannot start, so that the supervisor ends it
            (:func:`ddl_tf.launch.supervise.run_job`).
        bind: Address to listen on (``127.0.0.1`` for a job on this machine,
            ``0.0.0.0`` when ranks run on other hosts).
        advertise: Address the ranks connect to (default: ``bind``).
        unix: If given, listen on a Unix socket at this path instead (ranks that
            share this machine's files but not its network: the ``--rehearse``
            cluster's virtual nodes); :attr:`address` is then ``unix:PATH``, and
            :meth:`close` removes the socket file.

    Attributes:
        missing: Once the start failed, the ranks it names (set before ``report`` is called).
        reached: Set once a rank has connected (from its ``init()``): the
            job's program has run, so ddlrun never launches this job again
            (:func:`ddl_tf.launch.supervise.run_fixed`).
    """

    def __init__(
        self,
        size: int,
        *,
        report: Callable[[str], None],
        stop: threading.Event,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        unix: str | None = None,
    ) -> None:
        self.size = size
        self.report = report
        self.stop = stop
        self._unix = unix
        if unix is not None:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._listener.bind(unix)
                self._listener.listen()
            except OSError:
                self._listener.close()
                raise
            self.address = f"{UNIX_PREFIX}{unix}"
        else:
            self._listener = socket.create_server((bind, 0))
            port = self._listener.getsockname()[1]
            self.address = f"{advertise or bind}:{port}"
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._buffers: dict[socket.socket, bytes] = {}
        self._rank_of: dict[socket.socket, int] = {}
        self._members: set[int] = set()
        self._timeout = 0.0
        self._deadline: float | None = None
        self._went = False  # every rank reported and was told to go on
        self._started: set[int] = set()
        self.outcome: str | None = None  # "started", or the message of a failed start
        self.missing: list[int] = []  # the ranks the failed start's message names
        self.reached = threading.Event()  # some rank connected: its program ran
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddlrun-start-check", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening and drop the ranks' connections (when the job has ended)."""
        self._closing.set()
        self._thread.join(timeout=5)
        if self._unix is not None:  # the loop removes it; this covers a loop that hung
            with contextlib.suppress(OSError):
                os.unlink(self._unix)

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        try:
            while not self._closing.is_set() and self.outcome is None:
                for key, _ in self._selector.select(timeout=_TICK):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self._expire()
        except Exception as err:  # noqa: BLE001 - the check must never take ddlrun down
            logger.warning("ddlrun's start-up check stopped: %s", err)
        finally:
            for conn in list(self._buffers):
                self._drop(conn)
            self._selector.close()
            self._listener.close()
            if self._unix is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._unix)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = self._listener.accept()
            self.reached.set()
            conn.setblocking(False)
            self._buffers[conn] = b""
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the rank closed (after MPI started) or died
            self._drop(conn)
            return
        self._buffers[conn] += data
        while b"\n" in self._buffers.get(conn, b""):
            line, self._buffers[conn] = self._buffers[conn].split(b"\n", 1)
            self._message(conn, json.loads(line))

    def _message(self, conn: socket.socket, message: dict[str, Any]) -> None:
        if message.get("started"):
            rank = self._rank_of.get(conn)
            if rank is not None:
                self._started.add(rank)
            if self._went and self._started >= self._members:
                self.outcome = "started"
            return
        rank = int(message["rank"])
        self._rank_of[conn] = rank
        members = message.get("members")
        self._members |= set(range(self.size)) if members is None else {int(r) for r in members}
        if self._deadline is None:  # the first report starts the clock
            self._timeout = float(message.get("timeout", 60.0))
            self._deadline = time.monotonic() + self._timeout
        if set(self._rank_of.values()) >= self._members and not self._went:
            self._went = True
            self._send_all({"missing": []})
            self._deadline = time.monotonic() + self._timeout

    def _expire(self) -> None:
        reported = set(self._rank_of.values())
        if not self._went:
            missing = sorted(self._members - reported)
            message = not_started_message(missing, self.size, self._timeout)
            self._send_all({"missing": missing, "message": message})
        else:
            missing = sorted(self._members - self._started)
            message = (
                f"MPI's start-up did not complete on rank(s) {', '.join(map(str, missing))} of "
                f"{self.size} within {self._timeout:g} s (DDL_START_TIMEOUT={self._timeout:g}), "
                "although every rank had called ddl_tf.init(): a rank died or stopped between "
                "its init() and MPI's start (see the ranks' output above). The job is ended."
            )
        self.outcome = message
        self.missing = missing
        self.report(f"ddlrun: {message}")
        self.stop.set()

    def _send_all(self, verdict: dict[str, Any]) -> None:
        line = json.dumps(verdict).encode() + b"\n"
        for conn in list(self._rank_of):
            try:
                conn.setblocking(True)
                conn.settimeout(5)
                conn.sendall(line)
                conn.setblocking(False)
            except OSError:
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        self._buffers.pop(conn, None)
        conn.close()


class StartChecks:
    """ddlrun's start-up check of the job's current launch (a relaunch gets a new one).

    Args:
        interface: ``--network-interface``, or None.
        rehearsal: The ranks run on the ``--rehearse`` cluster's virtual nodes:
            the check listens on a Unix socket (they share this machine's files,
            not its network), not on a TCP port.
        report: ``report(line, hosts)``: what the check has to say (ranks that did
            not start, named), and those ranks' hosts (the job's names: an elastic
            job drops them, :meth:`FinishedWatch.start_check_failed`).
        stop: Set when a launch cannot start (the supervisor then ends it).
        say: Where ddlrun's notes go (a check it cannot open).
    """

    def __init__(
        self,
        interface: str | None,
        *,
        rehearsal: bool,
        report: Callable[[str, list[str]], None],
        stop: threading.Event,
        say: Callable[[str], None] = logger.warning,
    ) -> None:
        self.say = say
        self.interface = interface
        self.rehearsal = rehearsal
        self.report = report
        self.stop = stop
        self.current: StartupCheck | None = None
        self._hosts: list[str] = []  # each rank's host in the current launch

    def _failed(self, line: str) -> None:
        missing = self.current.missing if self.current is not None else []
        hosts = [self._hosts[r] for r in missing if 0 <= r < len(self._hosts)]
        self.report(line, list(dict.fromkeys(hosts)))

    def open(self, plan: LaunchPlan, placement: list[str], child_env: dict[str, str]) -> bool:
        """Start the check of a launch of ``plan`` and tell its ranks (``DDL_START_ADDR``).

        Closes the last launch's check. Adds the address to ``child_env`` and
        to what ``plan`` forwards; rebuild the command afterwards.

        Returns:
            Whether there is a check (none inside a Slurm or PBS allocation
            without hosts, or when ddlrun cannot listen).
        """
        self.close()
        elastic_hosts = plan.env.get(env.DDL_ELASTIC_HOSTS)
        if elastic_hosts:  # each rank's host as the elastic job names it (launch.worker's)
            self._hosts = [host_of_rank(elastic_hosts, r) for r in range(plan.np)]
        else:
            self._hosts = list(placement)
        self.current = startup_check(
            plan,
            placement,
            self.interface,
            self.rehearsal,
            report=self._failed,
            stop=self.stop,
            say=self.say,
        )
        if self.current is None:
            child_env.pop(env.DDL_START_ADDR, None)
            return False
        child_env[env.DDL_START_ADDR] = self.current.address
        if env.DDL_START_ADDR not in plan.forward:
            plan.forward.append(env.DDL_START_ADDR)
        return True

    def reached(self) -> bool:
        """Whether a rank of the current launch reached the check (its program ran)."""
        return self.current is not None and self.current.reached.is_set()

    def close(self) -> None:
        """Stop the current launch's check (when it ended, or before a relaunch)."""
        if self.current is not None:
            self.current.close()
            self.current = None


def startup_check(
    plan: LaunchPlan,
    placement: list[str],
    interface: str | None,
    rehearsal: bool = False,
    *,
    report: Callable[[str], None],
    stop: threading.Event | None = None,
    say: Callable[[str], None] = logger.warning,
) -> StartupCheck | None:
    """ddlrun's start-up check for a launch of ``plan`` (None when the ranks cannot reach it).

    Under a Slurm or PBS allocation without hosts, ddlrun does not know
    where the ranks run, so it cannot tell them an address that reaches it:
    they start without the check (MPI's start-up is then bounded by each
    rank's watchdog, see ddl_tf.core.startup). On the rehearsal cluster the
    check listens on a Unix socket in the temporary directory, which the
    virtual nodes share with this machine (they have a network of their own).
    """
    if plan.in_allocation and not plan.hosts:
        return None
    stop = stop if stop is not None else threading.Event()
    try:
        if rehearsal:
            path = os.path.join(tempfile.gettempdir(), f"ddlrun-start-{uuid.uuid4().hex}.sock")
            return StartupCheck(plan.np, report=report, stop=stop, unix=path)
        remote = sorted({name for name in placement if not is_local(name)})
        bind, advertise = listen_address(remote, interface)
        return StartupCheck(plan.np, report=report, stop=stop, bind=bind, advertise=advertise)
    except OSError as err:
        say(
            f"ddlrun: note: no start-up check ({err}); ranks that never call init() are "
            "named only once MPI runs"
        )
        return None
