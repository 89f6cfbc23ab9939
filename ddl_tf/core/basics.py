"""Process-wide state: ``init``, ``shutdown`` and the Horovod rank/size queries.

``init()`` is where MPI starts (importing ddl_tf never initializes it). It
reads :class:`~ddl_tf.config.DDLConfig` from the environment, starts MPI
within ``DDL_START_TIMEOUT`` (a rank that never calls ``init()`` makes the
others fail naming it, instead of waiting for ever: :mod:`ddl_tf.core.startup`),
works out the topology, checks that every rank was started with the same settings, builds
the communicators and the :class:`~ddl_tf.core.collectives.engine.Engine`, installs an
excepthook that aborts the whole job when any rank dies of an uncaught
exception (so no rank waits forever for a dead peer), and registers a
collective shutdown at exit.

Example:
    >>> import ddl_tf as hvd
    >>> _ = hvd.init()
    >>> hvd.size(), hvd.rank(), hvd.local_rank(), hvd.cross_size()
    (1, 0, 0, 1)
    >>> hvd.shutdown(); hvd.is_initialized()
    False
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ddl_tf import env
from ddl_tf.config import DDLConfig
from ddl_tf.core import HOROVOD_BASICS, current
from ddl_tf.core import process_sets as process_sets_module
from ddl_tf.core.collectives.engine import Engine
from ddl_tf.core.job import Job, spawned_parent
from ddl_tf.core.numerics import mpi
from ddl_tf.core.process_sets import ProcessSet
from ddl_tf.core.startup import check_in_over_mpi, check_in_with_launcher, mpi_init_guard
from ddl_tf.core.topology.layout import Topology, launcher_hostname, launcher_layout
from ddl_tf.env import HOROVOD_IGNORED
from ddl_tf.errors import ConfigError, DDLError, StartupError

__all__ = [
    "engine",
    "job",
    "replace_job",
    "topology",
    "add_elastic_shutdown_hook",
    *HOROVOD_BASICS,
]

logger = logging.getLogger(__name__)

_HANDLER_NAME = "ddl_tf-stderr"


def _configure_logging(level: str) -> None:
    """Set the ``ddl_tf`` logger's level; print to stderr when no handler would show it.

    Python's last-resort handler shows warnings only, so a requested ``info``
    or ``debug`` level (``HOROVOD_LOG_LEVEL=debug``) printed nothing unless
    the program configured logging itself. A handler is added only when
    neither the ``ddl_tf`` logger nor the root logger has one.
    """
    package = logging.getLogger("ddl_tf")
    package.setLevel(level)
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("[ddl_tf] %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)


def _label_log_lines(rank: int) -> None:
    """Put the rank into the lines of the handler :func:`_configure_logging` added."""
    for handler in logging.getLogger("ddl_tf").handlers:
        if handler.get_name() == _HANDLER_NAME:
            handler.setFormatter(
                logging.Formatter(f"[ddl_tf rank {rank}] %(levelname)s %(name)s: %(message)s")
            )


_previous_excepthook = None
_atexit_registered = False


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> Engine:
    """Start ddl_tf on every rank (collective; later calls return the same engine).

    Args:
        comm: None for ``MPI.COMM_WORLD``, an mpi4py communicator, or a list
            of world ranks that form the job (Horovod's ``init(comm=...)``).
        process_sets: Horovod's: a list of :class:`~ddl_tf.core.process_sets.ProcessSet`
            to register now, or ``"dynamic"`` to allow ``add_process_set`` later.

    Returns:
        The engine (the Horovod-style functions use it implicitly).

    Raises:
        ConfigError: Invalid settings, or ranks started with different settings.
        TopologyError: The topology file or forced algorithm does not fit the job.
        StartupError: Ranks of the job did not call ``init()`` within
            ``DDL_START_TIMEOUT`` seconds (the message names them); uncaught, it
            ends the job (with ``DDL_ABORT_ON_ERROR``, the default).
    """
    global _atexit_registered
    with current.lock:
        existing = current.get()
        if existing is not None:
            return existing.engine
        process_sets_module.check_init_argument(process_sets)
        config = DDLConfig.from_env()
        if config.log_level:
            _configure_logging(config.log_level)
        elastic = env.elastic_job()
        MPI = _start_mpi(config, elastic, comm)
        # an elastic launch's ranks too (ddlrun's check reached them: DDL_START_ADDR), not
        # the ranks a growing job spawns (their world is the spawn's, bounded by its timeout)
        if not elastic or env.get(env.DDL_START_ADDR) is not None:
            _check_in(MPI, comm, config)
        base, owned = _resolve_comm(MPI, comm, elastic)
        job = Job.create(base, config, host=launcher_hostname(), elastic=elastic, owns_comm=owned)
        current.install(job)
        engine = job.engine
        _label_log_lines(engine.rank)
        process_sets_module.register_at_init(job, process_sets)
        if config.ignored_settings and engine.rank == 0:
            logger.warning(
                "ddl_tf ignores %s: %s",
                ", ".join(config.ignored_settings),
                "; ".join(f"{n}: {HOROVOD_IGNORED[n]}" for n in config.ignored_settings),
            )
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            logger.warning(
                "MPI provides thread level %d (< MPI_THREAD_SERIALIZED); collectives inside "
                "tf.function run on TensorFlow threads and may fail with this MPI",
                MPI.Query_thread(),
            )
        if elastic:  # a lost rank is survived; an uncaught error ends this rank at once
            _install_excepthook(_exit_on_uncaught)
        elif config.abort_on_error:
            _install_excepthook(_abort_on_uncaught)
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        if engine.rank == 0:
            logger.info(
                "ddl_tf initialized: algorithm=%s fusion=%d bytes compression=%s checks=%s%s\n%s",
                config.algorithm,
                config.fusion_threshold_bytes,
                config.compression,
                "on" if config.check_collectives else "off",
                " elastic" if elastic else "",
                engine.topology.describe(),
            )
        return engine


def _start_mpi(config: DDLConfig, elastic: bool, comm: Any) -> Any:
    """Initialize MPI; within ``DDL_START_TIMEOUT`` where the launcher lets that be bounded.

    Under ddlrun (``DDL_START_ADDR``) the rank first reports to ddlrun's
    start-up check and waits for every rank to report there, so that
    ``MPI_Init``, which waits for every process of the job, starts only when
    they all came; elsewhere a watchdog bounds ``MPI_Init``. In an elastic
    job, only the check bounds it: ddlrun gives one to the ranks of each
    launch, never to the ranks a growing job spawns (their ``MPI_Init``
    joins the spawning ranks, which bound it with ``DDL_ELASTIC_SPAWN_TIMEOUT``).
    Nothing is bounded when MPI already runs, or in a job of one.
    """
    address = env.get(env.DDL_START_ADDR)
    timeout = config.start_timeout_seconds
    if elastic and address is None:
        timeout = 0.0
    if mpi.is_loaded() or timeout <= 0:
        return mpi.load()
    try:
        layout = launcher_layout()
    except ValueError:  # a garbled launcher variable: init() reports it later, with MPI's view
        layout = {}
    rank, size = int(layout.get("rank", 0)), int(layout.get("size", 1))
    if size < 2:
        return mpi.load()
    if address is None:
        with mpi_init_guard(rank, size, timeout):
            return mpi.load()
    members = None if comm is None else [int(r) for r in comm]  # no MPI yet: a list of ranks
    started = check_in_with_launcher(address, rank, size, timeout, members)
    MPI = mpi.load()
    started()
    return MPI


def _check_in(MPI: Any, comm: Any, config: DDLConfig) -> None:
    """Every rank that calls ``init()`` reports to the first before any collective (bounded).

    Raises:
        StartupError: Ranks did not call ``init()`` within ``DDL_START_TIMEOUT``
            (named); with ``DDL_ABORT_ON_ERROR`` the job is aborted if it goes uncaught,
            since MPI's finalization would wait for those ranks.
    """
    if comm is None:
        target, members = MPI.COMM_WORLD, list(range(MPI.COMM_WORLD.Get_size()))
    elif isinstance(comm, MPI.Intracomm):
        target, members = comm, list(range(comm.Get_size()))
    elif isinstance(comm, MPI.Comm):  # an intercommunicator: no check
        return
    else:
        members = [int(r) for r in comm]
        if MPI.COMM_WORLD.Get_rank() not in members:
            return  # _resolve_comm refuses it
        target = MPI.COMM_WORLD
    try:
        check_in_over_mpi(target, members, config.start_timeout_seconds)
    except StartupError:
        if config.abort_on_error:
            _install_excepthook(_abort_on_startup_failure)
        raise


def _resolve_comm(MPI: Any, comm: Any, elastic: bool) -> tuple[Any, bool]:
    """The job's communicator, and whether the job owns (and frees) it."""
    parent = spawned_parent() if elastic else None
    if parent is not None:  # spawned by a growing elastic job: join it, after its ranks
        if comm is not None:
            raise ConfigError(
                "init(comm=...) is not supported in an elastic job (ddlrun --min-np): its "
                "membership is the job's. Call init() without comm."
            )
        if env.get(env.DDL_ELASTIC_PARKED):  # started ahead, by rank 0 alone
            from ddl_tf.core.admission import join_job

            return join_job(MPI, parent), True
        merged = parent.Merge(high=True)
        parent.Disconnect()
        return merged, True
    if comm is None:
        return MPI.COMM_WORLD, False
    if isinstance(comm, MPI.Comm):
        return comm, False
    ranks = [int(r) for r in comm]
    world = MPI.COMM_WORLD
    if world.rank not in ranks:
        raise ConfigError(
            f"init(comm={ranks}) was called on rank {world.rank}, which is not in the list; "
            "only the listed ranks may call init()."
        )
    return world.Create_group(world.group.Incl(ranks)), True


def engine() -> Engine:
    """The running engine.

    Raises:
        NotInitializedError: ``init()`` has not been called.
    """
    return job().engine


def job() -> Job:
    """The job's current membership (:class:`~ddl_tf.core.job.Job`).

    Raises:
        NotInitializedError: ``init()`` has not been called.
    """
    return current.job()


def replace_job(new: Job | None) -> None:
    """Put ``new`` in the place of the current job (elastic membership changes).

    The caller has abandoned or closed the old job; its process sets are
    dropped (their ranks meant other processes) and the global set now means
    ``new``'s ranks. Sets may then be added again (in a reset callback) when
    the old job could add them or had some: also those given to
    ``init(process_sets=[...])``, which could not be added after ``init()``
    otherwise. ``None`` leaves the process uninitialized (a rank that leaves
    the job).
    """
    with current.lock:
        old = current.get()
        had_sets = old is not None and (old.dynamic_sets or bool(old.process_sets))
        current.install(new)  # unregisters the old job's sets
        if new is not None:
            _label_log_lines(new.rank)
            new.dynamic_sets = had_sets


def shutdown() -> None:
    """Collectively stop ddl_tf (also run automatically at exit). MPI stays initialized."""
    with current.lock:
        old = current.install(None)
        if old is None:
            return
        _restore_excepthook()
        if old.elastic:
            _dismiss_ranks_started_ahead()
        old.close()
        if old.elastic and old.rank == 0 and old.engine.state.closed and not old.engine.state.lost:
            # the final membership finished: tell ddlrun (its status is this, not mpirun's)
            sys.stdout.write(
                f"{env.ELASTIC_FINISHED} on {old.size} rank(s) ({', '.join(sorted(set(old.hosts)))})\n"
            )
            sys.stdout.flush()


_ELASTIC_SHUTDOWN_HOOKS: list[Callable[[], None]] = []


def add_elastic_shutdown_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` when an elastic job shuts down, before its communicator closes.

    The membership layer registers what it must end with the job (ranks it
    started ahead for new hosts, not yet admitted, are sent away); the core
    never imports that layer.

    Args:
        hook: A function of no arguments; registered once however often given.
    """
    if hook not in _ELASTIC_SHUTDOWN_HOOKS:
        _ELASTIC_SHUTDOWN_HOOKS.append(hook)


def _dismiss_ranks_started_ahead() -> None:
    for hook in _ELASTIC_SHUTDOWN_HOOKS:
        hook()


def collective_stats(reset: bool = False) -> dict[str, dict[str, float]]:
    """Calls and wall seconds this rank spent in each kind of collective.

    The time counts from entering a collective to leaving it, so it includes
    waiting for slower ranks - the communication share of a step is the
    allreduce seconds over the step time. Not a Horovod API; ddl_tf only.

    Args:
        reset: Clear the counters after reading them.

    Returns:
        ``{"allreduce": {"calls": int, "seconds": float}, ...}``.
    """
    stats = engine().stats
    snapshot = stats.snapshot()
    if reset:
        stats.reset()
    return snapshot


def is_initialized() -> bool:
    """Whether ``init()`` has run (and ``shutdown()`` has not)."""
    return current.get() is not None


def topology() -> Topology:
    """This rank's :class:`~ddl_tf.core.topology.layout.Topology`."""
    return engine().topology


def size() -> int:
    """Number of ranks in the job."""
    return engine().size


def rank() -> int:
    """This process's rank (0 .. size-1)."""
    return engine().rank


def local_size() -> int:
    """Ranks on this node."""
    return engine().topology.local_size


def local_rank() -> int:
    """This rank's index on its node (use it to pick a GPU)."""
    return engine().topology.local_rank


def cross_size() -> int:
    """Ranks sharing this rank's local rank across nodes (the number of nodes, when homogeneous)."""
    return engine().topology.cross_size


def cross_rank() -> int:
    """Index of this rank's node among those with its local rank."""
    return engine().topology.cross_rank


def is_homogeneous() -> bool:
    """Whether every node runs the same number of ranks."""
    return engine().topology.is_homogeneous


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE``."""
    engine()
    MPI = mpi.load()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True: ddl_tf always communicates through MPI."""
    return True


def mpi_built() -> bool:
    """True: ddl_tf always communicates through MPI."""
    return True


def gloo_enabled() -> bool:
    """False: ddl_tf has no Gloo controller."""
    return False


def gloo_built() -> bool:
    """False: ddl_tf has no Gloo controller."""
    return False


def nccl_built() -> bool:
    """False: collectives run through MPI on host memory."""
    return False


def ddl_built() -> bool:
    """True: the topology-aware (DDL-style) allreduce is built in."""
    return True


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """False: ddl_tf moves tensors through host memory."""
    return False


def rocm_built() -> bool:
    """False: ddl_tf moves tensors through host memory."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start a Chrome-trace timeline at ``file_path`` (call on every rank).

    Args:
        file_path: The JSON file the ranks' merged timeline is written to.
        mark_cycles: Accepted for Horovod compatibility (ignored).

    Raises:
        NotInitializedError: ``init()`` has not been called.
    """
    engine().set_timeline(str(file_path))


def stop_timeline() -> None:
    """Stop the timeline and write the merged trace (call on every rank)."""
    engine().set_timeline(None)


# --------------------------------------------------------------------------- failure handling


def _install_excepthook(hook) -> None:
    global _previous_excepthook
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = hook


def _restore_excepthook() -> None:
    global _previous_excepthook
    if _previous_excepthook is not None:
        sys.excepthook = _previous_excepthook
        _previous_excepthook = None


def _exit_on_uncaught(exc_type, exc, tb) -> None:
    """Elastic jobs: print the exception, say which rank and host ends, then die as a failure.

    In an elastic job an uncaught error is one more way for a rank to fail:
    the rank ends with ``SIGKILL`` (after the traceback and a line naming it),
    which MPI's fault tolerance reports to the other ranks as a failed peer,
    so they re-form the job and train on, as after any failure. Exiting with
    a status instead would not do: after a membership change a rank that
    returns non-zero through ``MPI_Finalize`` leaves Open MPI's runtime
    aborting forever, and mpirun's status would be that rank's even when the
    others finish (both measured here). When no rank is left, mpirun exits
    non-zero.
    """
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    job = current.get()
    where = f"rank {job.rank} on host {job.hosts[job.rank]}" if job else "a rank"
    sys.stderr.write(f"ddl_tf: {where} ends the elastic job: {exc_type.__name__}: {exc}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _abort_on_uncaught(exc_type, exc, tb) -> None:
    """Print the exception, then abort every rank: a dead rank must not leave peers waiting."""
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    job = current.get()
    if job is None or job.size == 1:
        return
    _abort(
        job.engine,
        f"rank {job.rank} died of an uncaught {exc_type.__name__}; "
        f"aborting all {job.size} ranks (MPI_Abort)",
    )


def _abort_on_startup_failure(exc_type, exc, tb) -> None:
    """Print the exception; for a failed start-up, abort every rank (the missing ones too).

    MPI's finalization at exit would wait for the ranks that never called
    ``init()``, so a rank that could not start ends the whole job instead.
    """
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    if issubclass(exc_type, StartupError):
        sys.stderr.write("ddl_tf: the job could not start; aborting all ranks (MPI_Abort)\n")
        sys.stderr.flush()
        mpi.load().COMM_WORLD.Abort(1)


def _abort(failed: Engine, reason: str) -> None:
    """Say why on stderr (where mpirun collects it), then abort every rank.

    The reason is logged and also written to stderr directly: logging may be
    routed elsewhere or not configured, and MPI_Abort kills the process next.
    """
    logger.critical("%s", reason)
    sys.stderr.write(f"ddl_tf: {reason}\n")
    sys.stderr.flush()
    mpi.load().COMM_WORLD.Abort(1)


def _shutdown_at_exit() -> None:
    job = current.get()
    if job is None:
        return
    try:
        shutdown()
    except DDLError as err:
        reason = f"rank {job.rank} could not shut down cleanly, aborting the job: {err}"
        if job.size > 1:
            _abort(job.engine, reason)
        logger.critical("%s", reason)
