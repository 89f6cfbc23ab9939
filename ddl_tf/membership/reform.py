"""Re-forming an elastic job in the running processes, over MPI's fault tolerance (ULFM).

Why in the running processes: the survivors keep their memory (model,
optimizer, data pipeline, compiled step) and their MPI library, so a
recovery costs one ``MPI_Comm_shrink`` and a new :class:`~ddl_tf.core.job.Job`
(well under a second here) instead of a relaunch, a TensorFlow import and
a checkpoint read on every rank (a driver that relaunches ranks, Horovod's
design over Gloo, pays those: tens of seconds per reset on this machine).

**A rank fails.** The first survivor whose collective meets it (ULFM reports
``MPI_ERR_PROC_FAILED``) revokes every communicator of the job, so the
others get ``MPI_ERR_REVOKED`` wherever they wait; each raises
:class:`~ddl_tf.errors.HorovodInternalError`. ``elastic.run`` restores the
last commit and calls :meth:`Membership.recover` on every survivor:
``Shrink`` agrees on who is alive, the failed ranks' hosts are blacklisted
and their other ranks leave (as Horovod takes a failed host out), and the
rest build a new job.

**Hosts change.** Rank 0 runs the discovery script every
``discovery_interval`` seconds in a background thread. At each ``commit()``
it broadcasts what changed (:meth:`Membership.check_host_updates`): hosts
gone from the list, and new hosts (up to ``max_np`` ranks, blacklisted hosts
excluded until their cooldown ends). Hosts that left: every rank raises
:class:`~ddl_tf.errors.HostsUpdatedInterrupt`, and
:meth:`Membership.update_hosts` lets their ranks leave. New hosts: in a
background thread, rank 0 starts their ranks (``MPI_Comm_spawn`` of this
same program over ``MPI_COMM_SELF``, through :mod:`ddl_tf.launch.worker`)
while the other ranks wait for its word without polling; then every rank
joins them through rank 0 (``MPI_Intercomm_create``, ``MPI_Intercomm_merge``:
the new ranks come after the old ones), and the job trains on meanwhile;
the new ranks park in ``init()`` (:func:`~ddl_tf.core.admission.join_job`). At the
first commit after they connected, every rank raises the interrupt, and
:meth:`Membership.update_hosts` admits them (growth without a pause). With
``DDL_ELASTIC_PRESTART=0`` the spawn runs at the commit that sees the new
hosts, the job waiting for it.

Every membership change counts against ``reset_limit``; a job that has fewer
than ``min_np`` ranks and no host to grow to within ``timeout`` seconds
fails, naming both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ddl_tf import env
from ddl_tf.core import basics
from ddl_tf.core.admission import ADMIT_TAG
from ddl_tf.core.job import Job
from ddl_tf.core.numerics import mpi
from ddl_tf.errors import ConfigError, DDLError, HostsUpdatedInterrupt
from ddl_tf.membership import mirror
from ddl_tf.membership.discovery import Blacklist, DiscoveryError, run_discovery
from ddl_tf.membership.settings import ElasticSettings

__all__ = ["Membership", "HostChange", "membership", "ElasticJobError"]

logger = logging.getLogger(__name__)


class ElasticJobError(DDLError):
    """The elastic job cannot go on: too many resets, or too few ranks for too long."""


@dataclass(frozen=True)
class HostChange:
    """What rank 0 decided at a commit: hosts that leave, ranks to add per new host, and
    (growth without a pause) ranks to start ahead, or to send away.

    ``added`` re-forms the job with the ranks (spawned then, or started ahead and
    ready); ``ahead`` starts ranks in the background and the job trains on;
    ``dismiss`` sends the ranks started ahead away. It is true when it holds any
    of them; :attr:`reforms` says whether the job re-forms.
    """

    removed: tuple[str, ...] = ()
    added: tuple[tuple[str, int], ...] = ()
    ahead: tuple[tuple[str, int], ...] = ()
    dismiss: bool = False

    def __bool__(self) -> bool:
        return bool(self.removed or self.added or self.ahead or self.dismiss)

    @property
    def reforms(self) -> bool:
        """Whether the job re-forms for it (hosts leave or ranks join)."""
        return bool(self.removed or self.added)


@dataclass
class _Watcher:
    """Rank 0's discovery thread: the latest host list, or the error that replaced it."""

    settings: ElasticSettings
    hosts: dict[str, int] | None = None
    error: DiscoveryError | None = None
    failing_since: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ddl_tf-discovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        script = self.settings.discovery
        assert script is not None  # started only with a discovery script
        while not self._stop.is_set():
            try:
                self.hosts = run_discovery(script, self.settings.slots_per_host)
                self.error, self.failing_since = None, None
            except DiscoveryError as err:
                if self.error is None:
                    logger.warning("host discovery failed (keeping the last list): %s", err)
                self.error = err
                self.failing_since = self.failing_since or time.monotonic()
            self._stop.wait(self.settings.discovery_interval)


@dataclass
class _Prestart:
    """Ranks started ahead for new hosts: spawned in a background thread, then parked.

    ``bridge`` is the job's ranks (first) and the new ranks, merged, once they
    connected; ``ready`` is set then, or when the spawn failed (``error``).
    ``spare`` is the duplicate of the job's communicator the spawn runs on.
    """

    added: tuple[tuple[str, int], ...]
    spare: Any = None
    started: float = field(default_factory=time.monotonic)
    ready: threading.Event = field(default_factory=threading.Event)
    bridge: Any = None
    error: BaseException | None = None
    abandoned: threading.Event = field(default_factory=threading.Event)


class Membership:
    """This process's view of the elastic job's membership (one per process).

    Args:
        settings: The job's elastic settings.
    """

    def __init__(self, settings: ElasticSettings) -> None:
        self.settings = settings
        self.blacklist = Blacklist(settings.cooldown)
        self._watcher: _Watcher | None = None
        self._pending = HostChange()
        self._prestart: _Prestart | None = None  # rank 0: new ranks started ahead, not yet in
        # hosts that had ranks of this job (a remote one cannot take ranks again: _used_up)
        self.hosted: set[str] = {
            h.split(":")[0] for h in (env.get(env.DDL_ELASTIC_HOSTS) or "").split(",") if h
        }
        self._told_not_again: set[str] = set()
        # hosts an earlier launch of this job lost with their daemon, or whose spawned ranks
        # never connected (ddlrun relaunched it without them)
        for host in (env.get(env.DDL_ELASTIC_LOST_HOSTS) or "").split(","):
            if host:
                self.blacklist.add(host, time.monotonic())

    # ------------------------------------------------------------------ failures

    def recover(self) -> None:
        """Re-form the job without its failed ranks (collective over the survivors).

        A rank whose host is blacklisted leaves: its process exits with status 0.

        Raises:
            ElasticJobError: Every host is blacklisted, ``reset_limit`` is exceeded, or
                fewer than ``min_np`` ranks remain for ``timeout`` seconds.
        """
        MPI = mpi.load()
        job = basics.job()
        job.abandon()
        self.abandon_pending()
        started = time.perf_counter()
        survivors = job.comm.Shrink()
        old = MPI.Group.Translate_ranks(
            survivors.Get_group(), list(range(survivors.size)), job.comm.Get_group()
        )
        failed = sorted(set(range(job.size)) - set(old))
        lost_hosts = sorted({job.hosts[r] for r in failed})
        now = time.monotonic()
        for host in lost_hosts:
            self.blacklist.add(host, now)
        if all(job.hosts[r] in lost_hosts for r in old):
            raise ElasticJobError(
                f"every host of the elastic job is blacklisted ({', '.join(lost_hosts)} had "
                f"failed rank(s) {failed}); no rank is left to train"
            )
        leaving = job.hosts[job.rank] in lost_hosts
        stay = survivors.Split(MPI.UNDEFINED if leaving else 0, key=survivors.rank)
        survivors.Free()
        if leaving:
            self._leave(job, f"its host {job.hosts[job.rank]} had a failed rank")
        self._count_reset(job, f"rank(s) {failed} on {', '.join(lost_hosts)} failed")
        new = self._rebuild(job, stay)
        if new.rank == 0:
            logger.warning(
                "elastic job re-formed in %.2f s without rank(s) %s (host(s) %s blacklisted): "
                "%d rank(s) on %s",
                time.perf_counter() - started,
                failed,
                ", ".join(lost_hosts),
                new.size,
                ", ".join(sorted(set(new.hosts))),
            )
        if new.size < self.settings.min_np:
            self._grow_to_min_np()

    # ------------------------------------------------------------------ host updates

    def check_host_updates(self) -> None:
        """At a commit: raise :class:`HostsUpdatedInterrupt` on every rank when hosts changed.

        Collective (one small broadcast from rank 0).

        Raises:
            HostsUpdatedInterrupt: Hosts were added or removed.
            DiscoveryError: The discovery script kept failing for ``timeout`` seconds.
        """
        if self.settings.discovery is None:
            return
        job = basics.job()
        decision: HostChange | str = HostChange()
        if job.rank == 0:
            decision = self._decide(job)
        decision = job.engine.broadcast_object(decision, 0, name="elastic.hosts")
        if isinstance(decision, str):
            raise DiscoveryError(decision)
        if decision.dismiss:
            self.dismiss_pending("their host left, or they failed to start")
        if decision.ahead:
            self._start_ahead(job, decision.ahead)
        if decision.reforms:
            self._pending = decision
            raise HostsUpdatedInterrupt(
                skip_sync=not decision.added,
                message=f"hosts changed: removed {list(decision.removed)}, added "
                f"{[f'{h}:{n}' for h, n in decision.added]}",
            )

    def poll_hosts(self) -> HostChange:
        """On rank 0: the host change the next commit would announce (local; no collective).

        Lets a training script wait until a change it expects has been
        discovered (Horovod's integration tests wait on the driver's
        notification the same way). Other ranks get an empty change.
        """
        job = basics.job()
        if job.rank != 0 or self.settings.discovery is None:
            return HostChange()
        decision = self._decide(job)
        return decision if isinstance(decision, HostChange) else HostChange()

    def update_hosts(self) -> None:
        """Apply the change :meth:`check_host_updates` announced (collective over the job)."""
        change, self._pending = self._pending, HostChange()
        job = basics.job()
        started = time.perf_counter()
        leaving = job.hosts[job.rank] in change.removed
        job.engine.shutdown()  # every rank is here, in step: a clean close of the old engine
        MPI = mpi.load()
        stay = job.comm.Split(MPI.UNDEFINED if leaving else 0, key=job.rank)
        if leaving:
            self._leave(job, f"its host {job.hosts[job.rank]} left the discovered hosts")
        self._count_reset(job, f"hosts changed ({change})")
        if change.added and self.settings.prestart:
            stay = self._admit(stay, change.added)
        elif change.added:
            stay = self._spawn(stay, change.added)
        new = self._rebuild(job, stay)
        if new.rank == 0:
            logger.warning(
                "elastic job re-formed in %.2f s for %s: %d rank(s) on %s",
                time.perf_counter() - started,
                change,
                new.size,
                ", ".join(sorted(set(new.hosts))),
            )

    # ------------------------------------------------------------------ helpers

    def _decide(self, job: Job) -> HostChange | str:
        self._ensure_watcher()
        watcher = self._watcher
        assert watcher is not None
        if watcher.error is not None and watcher.failing_since is not None:
            if time.monotonic() - watcher.failing_since > self.settings.timeout:
                return (
                    f"{watcher.error} (failing for over {self.settings.timeout:g} s, the "
                    "--elastic-timeout; the job stops)"
                )
        if watcher.hosts is None:
            return HostChange()
        self.hosted.update(job.hosts)
        pending = self._prestart
        starting = tuple(h for h, n in pending.added for _ in range(n)) if pending else ()
        change = plan_change(
            current=job.hosts + starting,
            discovered=watcher.hosts,
            blocked=lambda h: self.blacklist.blocked(h, time.monotonic()) or self._used_up(h),
            max_np=self.settings.max_np,
        )
        if not self.settings.prestart:
            return change
        removed = tuple(h for h in change.removed if h in job.hosts)
        ahead = change.added if pending is None else ()
        admitted: tuple[tuple[str, int], ...] = ()
        dismiss = False
        if pending is not None and removed:
            dismiss = True  # they are merged with ranks that leave now: send them away
        elif pending is not None and pending.ready.is_set():
            gone = [h for h, _ in pending.added if h in change.removed]
            if pending.error is not None or pending.bridge is None or gone:
                dismiss = True
                if pending.error is not None:
                    logger.warning(
                        "the ranks started ahead on %s could not join: %s",
                        _where(pending.added),
                        pending.error,
                    )
            else:
                admitted = pending.added
        return HostChange(removed=removed, added=admitted, ahead=ahead, dismiss=dismiss)

    def _start_ahead(self, job: Job, added: tuple[tuple[str, int], ...]) -> None:
        """Spawn ranks for ``added`` in a background thread; the job trains on (collective).

        Every rank joins the new ranks in a thread of its own, on a duplicate
        of the job's communicator, while its main thread trains: the new ranks
        start (Python, TensorFlow's import, ``MPI_Init``) meanwhile
        (:func:`_spawn_through_rank0`), and their ``init()`` then parks
        (:func:`~ddl_tf.core.admission.join_job`) until a commit admits them (:meth:`_admit`).
        """
        MPI = mpi.load()
        pending = _Prestart(added, spare=job.comm.Dup())
        self._prestart = pending
        self.hosted.update(host for host, _ in added)
        commands, argvs, counts, infos = self._spawn_arguments(job.size, added, MPI, parked=True)
        if job.rank == 0:
            logger.warning(
                "starting %d rank(s) on %s ahead, while the job trains on; they join at the "
                "first commit after they connected",
                sum(n for _, n in added),
                _where(added),
            )

        def spawn() -> None:
            try:
                with _deadline(self.settings.spawn_timeout, added, pending.abandoned):
                    pending.bridge = _spawn_through_rank0(
                        MPI, pending.spare, (commands, argvs, counts, infos), pending.abandoned
                    )
            except Exception as err:  # noqa: BLE001 - rank 0's _decide sends them away
                pending.error = err
            finally:
                pending.ready.set()

        threading.Thread(target=spawn, name="ddl_tf-spawn-ahead", daemon=True).start()

    def dismiss_pending(self, why: str) -> None:
        """Send the ranks started ahead away (collective over the ranks that started them).

        Each rank waits for its spawn thread, up to what is left of the spawn
        timeout; rank 0 then tells the new ranks to leave.
        """
        pending, self._prestart = self._prestart, None
        if pending is None:
            return
        left = self.settings.spawn_timeout - (time.monotonic() - pending.started)
        if not pending.ready.wait(max(0.0, left)) or pending.bridge is None:
            return
        bridge = pending.bridge
        if bridge.rank == 0:
            first = bridge.size - sum(n for _, n in pending.added)
            for peer in range(first, bridge.size):
                bridge.send("leave", dest=peer, tag=ADMIT_TAG)
            logger.warning("the ranks started ahead on %s leave: %s", _where(pending.added), why)

    def abandon_pending(self) -> None:
        """After a failure: forget the ranks started ahead (their spawn included a lost rank).

        Rank 0 tells them to leave if they connected already; otherwise they
        fail to connect, or wait for ``--elastic-timeout`` and leave.
        """
        pending, self._prestart = self._prestart, None
        if pending is None:
            return
        pending.abandoned.set()  # its spawn may never end now: no deadline kills this rank
        if pending.ready.is_set() and pending.bridge is not None and pending.bridge.rank == 0:
            first = pending.bridge.size - sum(n for _, n in pending.added)
            with contextlib.suppress(Exception):
                for peer in range(first, pending.bridge.size):
                    pending.bridge.send("leave", dest=peer, tag=ADMIT_TAG)

    def _admit(self, comm: Any, added: tuple[tuple[str, int], ...]) -> Any:
        """Take the ranks started ahead into the job (collective over ``comm``, the job's ranks).

        They are merged after the job's ranks already (the spawn thread did
        it); rank 0 tells them they are in, and the merged communicator
        becomes the job's.
        """
        pending, self._prestart = self._prestart, None
        assert pending is not None, "nothing to admit"
        left = self.settings.spawn_timeout - (time.monotonic() - pending.started)
        with _deadline(max(1.0, left), added):
            pending.ready.wait()
        merged = pending.bridge
        if merged is None:  # rank 0 saw this rank's spawn succeed: the same collective
            raise ElasticJobError(f"the ranks started ahead on {_where(added)} did not connect")
        if merged.rank == 0:
            for peer in range(comm.size, merged.size):
                merged.send("admit", dest=peer, tag=ADMIT_TAG)
            logger.warning(
                "admitting the %d rank(s) started ahead on %s (%.1f s after they were started)",
                merged.size - comm.size,
                _where(added),
                time.monotonic() - pending.started,
            )
        comm.Free()
        pending.spare.Free()
        return merged

    def _used_up(self, host: str) -> bool:
        """Whether ``host`` had ranks of this job and is not mpirun's machine (no ranks again).

        Measured with Open MPI 5.0.11 on the rehearsal cluster: ranks spawned on
        a remote host whose daemon ran ranks of this job before (which failed,
        or left) abort in ``MPI_Init`` (``OPAL ERROR: Not supported`` in
        ``dpm.c``), while spawning on a fresh remote host and on mpirun's own
        machine works. Such a host stays out of this job, with one warning.
        """
        if host not in self.hosted or self._is_launch_host(host):
            return False
        if host not in self._told_not_again:
            self._told_not_again.add(host)
            logger.warning(
                "host %s is listed again, but it had ranks of this job before and is not "
                "mpirun's machine: Open MPI 5.0 cannot start ranks there again within the job, "
                "so it stays out (restart the job to use it again)",
                host,
            )
        return True

    def _is_launch_host(self, host: str) -> bool:
        if self.settings.launch_hosts:
            return host in self.settings.launch_hosts
        return _is_local(host)

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = _Watcher(self.settings)
            self._watcher.start()

    def _grow_to_min_np(self) -> None:
        """Wait (up to ``timeout``) for discovered hosts that bring the job to ``min_np``."""
        deadline = time.monotonic() + self.settings.timeout
        while True:
            job = basics.job()
            if job.size >= self.settings.min_np:
                return
            try:
                self.check_host_updates()
            except HostsUpdatedInterrupt:
                self.update_hosts()
                continue
            if time.monotonic() > deadline:
                raise ElasticJobError(
                    f"the elastic job has {job.size} rank(s), below --min-np "
                    f"{self.settings.min_np}, and no host to grow to appeared within "
                    f"{self.settings.timeout:g} s (--elastic-timeout); blacklisted: "
                    f"{self.blacklist.hosts() or 'none'}"
                )
            time.sleep(self.settings.discovery_interval)

    def _count_reset(self, job: Job, why: str) -> None:
        """Refuse a membership change past ``reset_limit`` (counted by the job's generation,
        which ranks that joined later learn when they join)."""
        resets = job.generation + 1
        limit = self.settings.reset_limit
        if limit is not None and resets > limit:
            raise ElasticJobError(
                f"the elastic job changed membership {resets} times, over --reset-limit "
                f"{limit} (last: {why}); raise --reset-limit or fix the failing hosts"
            )

    def _rebuild(self, job: Job, comm: Any) -> Job:
        engine = job.engine
        new = Job.create(
            comm,
            engine.config,
            policy=engine.policy,
            host=job.hosts[job.rank],
            generation=job.generation + 1,
            elastic=True,
        )
        basics.replace_job(new)
        return new

    def _spawn(self, comm: Any, added: tuple[tuple[str, int], ...]) -> Any:
        """Start ``added`` ranks running this program and merge them after ``comm``'s ranks."""
        MPI = mpi.load()
        commands, argvs, counts, infos = self._spawn_arguments(comm.size, added, MPI)
        self.hosted.update(host for host, _ in added)
        with _deadline(self.settings.spawn_timeout, added):
            inter = comm.Spawn_multiple(commands, argvs, counts, infos, root=0)
        merged = inter.Merge(high=False)
        inter.Disconnect()
        comm.Free()
        return merged

    def _spawn_arguments(
        self, first: int, added: tuple[tuple[str, int], ...], MPI: Any, parked: bool = False
    ) -> tuple[list[str], list[list[str]], list[int], list[Any]]:
        """``Spawn_multiple``'s arguments: one command per new rank, numbered from ``first``."""
        commands: list[str] = []
        argvs: list[list[str]] = []
        counts: list[int] = []
        infos: list[Any] = []
        for host, count in added:
            for _ in range(count):
                commands.append(sys.executable)
                argvs.append(worker_arguments(host, first + len(argvs), parked=parked))
                counts.append(1)
                info = MPI.Info.Create()
                if not self._is_launch_host(host):
                    info.Set("host", host)
                    info.Set("PMIX_ADD_HOST", host)
                infos.append(info)
        return commands, argvs, counts, infos

    def _leave(self, job: Job, why: str) -> None:
        logger.warning("rank %d leaves the elastic job: %s", job.rank, why)
        mirror.discard(job)  # a relaunch must not take this rank's commit for a survivor's
        basics.replace_job(None)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # MPI_Finalize would wait for ranks that no longer talk to this one


def plan_change(
    current: tuple[str, ...],
    discovered: dict[str, int],
    blocked: Any,
    max_np: int | None,
) -> HostChange:
    """Hosts to remove and ranks to add, from the job's hosts and the discovered ones.

    Args:
        current: Each rank's host.
        discovered: ``{host: slots}`` from the discovery script.
        blocked: ``blocked(host) -> bool`` for blacklisted hosts.
        max_np: Most ranks, or None.

    Example:
        >>> plan_change(("a", "a"), {"a": 2, "b": 2}, lambda h: False, max_np=3)
        HostChange(removed=(), added=(('b', 1),), ahead=(), dismiss=False)
        >>> plan_change(("a", "b"), {"a": 1}, lambda h: False, max_np=None)
        HostChange(removed=('b',), added=(), ahead=(), dismiss=False)
    """
    removed = tuple(sorted({h for h in current if h not in discovered}))
    size = sum(1 for h in current if h not in removed)
    room = (max_np - size) if max_np is not None else sum(discovered.values())
    added = []
    for host, slots in discovered.items():
        if host in current or blocked(host) or room <= 0:
            continue
        count = min(slots, room)
        added.append((host, count))
        room -= count
    return HostChange(removed=removed, added=tuple(added))


def worker_arguments(host: str, rank: int, parked: bool = False) -> list[str]:
    """``python`` arguments that start one more rank of this program on ``host``.

    ``parked``: the rank is started ahead; its ``init()`` waits to be admitted
    (:func:`~ddl_tf.core.admission.wait_for_admission`).
    """
    program = env.get(env.DDL_ELASTIC_COMMAND)
    if program is None:
        raise ConfigError(
            "this elastic rank does not know its program (DDL_ELASTIC_COMMAND is unset); "
            "launch elastic jobs with ddlrun --min-np / --host-discovery-script."
        )
    passed = [
        f"{k}={v}"
        for k, v in sorted(env.ddl_variables().items())
        # a newcomer joins the running job: it resumes nothing, and parks only if told to;
        # ddlrun's start-up check is the launch's ranks' (the spawn bounds a newcomer's start)
        if k not in (env.DDL_ELASTIC_RESUMED, env.DDL_ELASTIC_PARKED, env.DDL_START_ADDR)
    ]
    if parked:
        passed.append(f"{env.DDL_ELASTIC_PARKED}=1")
    if env.get(env.PYTHONPATH) is not None:
        passed.append(f"{env.PYTHONPATH}={env.get(env.PYTHONPATH)}")
    args = ["-m", "ddl_tf.launch.worker", "--hostname", host, "--rank", str(rank)]
    for item in passed:
        args += ["--env", item]
    return [*args, "--program", program]


def _spawn_through_rank0(
    MPI: Any, spare: Any, arguments: tuple[list, list, list, list], cancel: threading.Event
) -> Any:
    """Start new ranks from rank 0 alone and join them to ``spare``'s ranks (collective).

    A collective ``MPI_Comm_spawn`` over the job's ranks would keep every
    rank but the root polling in Open MPI's progress loop, a full core each,
    for as long as the new ranks take to import TensorFlow and call
    ``MPI_Init`` (measured on the rehearsal cluster: rank 1 at 85-100% of a
    core for 11 s, the newcomers' import 13 s instead of 4.5). So rank 0 spawns
    over ``MPI_COMM_SELF`` and merges with them; the other ranks wait for its
    word with sleeps (:func:`~ddl_tf.core.admission.wait_quietly`), then all
    build an intercommunicator to the new ranks through rank 0
    (``MPI_Intercomm_create``, the new ranks' side in
    :func:`~ddl_tf.core.admission.join_job`) and merge it: the job's ranks
    first, then the new ones in spawn order.

    Returns:
        The merged communicator, or raises: rank 0's spawn failed (on every
        rank), or ``cancel`` was set while waiting (a failure abandoned it).
    """
    from ddl_tf.core.admission import wait_quietly

    with_new = None
    if spare.rank == 0:
        try:
            inter = MPI.COMM_SELF.Spawn_multiple(*arguments, root=0)
            with_new = inter.Merge(high=False)  # rank 0, then the new ranks
            inter.Disconnect()
        except Exception as err:
            for peer in range(1, spare.size):
                spare.send(f"{type(err).__name__}: {err}", dest=peer, tag=ADMIT_TAG)
            raise
        for peer in range(1, spare.size):
            spare.send(None, dest=peer, tag=ADMIT_TAG)
    else:
        if not wait_quietly(spare, 0, ADMIT_TAG, cancel.is_set):
            raise ElasticJobError("the ranks started ahead were abandoned after a failure")
        word = spare.recv(source=0, tag=ADMIT_TAG)
        if word is not None:
            raise ElasticJobError(f"rank 0 could not start the new ranks: {word}")
    # the peer communicator counts at the leader (rank 0) only; mpi4py wants an Intracomm
    peer, leader = (with_new, 1) if with_new is not None else (spare, 0)
    inter = spare.Create_intercomm(0, peer, leader, tag=ADMIT_TAG)
    bridge = inter.Merge(high=False)
    inter.Free()
    if with_new is not None:
        with_new.Free()
    return bridge


@contextlib.contextmanager
def _deadline(
    seconds: float, added: tuple[tuple[str, int], ...], cancel: threading.Event | None = None
):
    """End this process (SIGKILL, after a message) if the block takes over ``seconds``.

    ``MPI_Comm_spawn`` cannot be interrupted; when a new rank dies before it
    connects, the spawning ranks would wait for ever. Every spawning rank
    runs its own deadline and ends itself; ``ddlrun`` reads their message
    (:class:`~ddl_tf.launch.supervise.FinishedWatch`), ends what is left of
    the job (the unconnected ranks included), drops the new host and
    relaunches the job without it, from the last commit the ranks mirrored
    in host memory (:mod:`ddl_tf.membership.mirror`).
    """
    done = threading.Event()

    def expire() -> None:
        if not done.wait(seconds) and not (cancel is not None and cancel.is_set()):
            where = ", ".join(f"{h}:{n}" for h, n in added)
            logger.error(
                "the new ranks on %s did not connect within %g s (%s; see their errors above); "
                "this rank ends itself (MPI_Comm_spawn cannot be interrupted), and ddlrun "
                "relaunches the job without %s from the last commit",
                where,
                seconds,
                env.DDL_ELASTIC_SPAWN_TIMEOUT,
                ", ".join(h for h, _ in added),
            )
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    watchdog = threading.Thread(target=expire, name="ddl_tf-spawn-deadline", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()


def _where(added: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{h}:{n}" for h, n in added)


def _is_local(host: str) -> bool:
    import socket

    return host in {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}


_membership: Membership | None = None


def current_membership() -> Membership | None:
    """This process's :class:`Membership` if one was made, else None (makes none)."""
    return _membership


def _dismiss_at_shutdown() -> None:
    """The job ends: ranks started ahead for new hosts, not yet admitted, leave."""
    if _membership is not None:
        _membership.dismiss_pending("the job finished before they were admitted")


basics.add_elastic_shutdown_hook(_dismiss_at_shutdown)


def membership() -> Membership:
    """This process's :class:`Membership` (made at first use from the environment).

    Raises:
        ConfigError: The job is not elastic (``hvd.elastic`` needs ``ddlrun --min-np``
            for membership changes).
    """
    global _membership
    if _membership is None:
        _membership = Membership(ElasticSettings.from_env())
    return _membership
