"""Every environment variable ddl_tf reads or sets, in one place.

Nothing else in ddl_tf touches ``os.environ``: modules call :func:`get` (or
take an ``environ`` mapping, which tests use to fake a launcher). Names that
start with ``HOROVOD_`` are read as fallbacks so that a Horovod job keeps its
settings after switching its import; the ``DDL_`` name wins when both are set.
The launchers' own variables (Horovod, Open MPI, Slurm, MPICH) are named
here too; what they say about a rank's place in the job is read by
:func:`ddl_tf.core.topology.layout.launcher_layout`, with the topology.

Example:
    >>> from ddl_tf import env
    >>> env.get(env.DDL_ALLREDUCE_ALGO, {"DDL_ALLREDUCE_ALGO": "ring"})
    'ring'
    >>> env.get_first((env.DDL_FUSION_THRESHOLD, env.HOROVOD_FUSION_THRESHOLD),
    ...               {"HOROVOD_FUSION_THRESHOLD": "1024"})
    ('HOROVOD_FUSION_THRESHOLD', '1024')
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

__all__ = [
    "get",
    "get_first",
    "snapshot",
    "ddl_variables",
    "elastic_job",
    # ddl_tf settings
    "DDL_ALLREDUCE_ALGO",
    "DDL_FUSION_THRESHOLD",
    "DDL_OVERLAP",
    "DDL_BUCKET_BYTES",
    "DDL_COMPRESSION",
    "DDL_TIMELINE",
    "DDL_STALL_WARNING_SECONDS",
    "DDL_STALL_SHUTDOWN_SECONDS",
    "DDL_CHECK_COLLECTIVES",
    "DDL_ABORT_ON_ERROR",
    "DDL_TOPOLOGY_FILE",
    "DDL_PSEUDO_NODES",
    "DDL_AUTO_POLICY",
    "DDL_LOG_LEVEL",
    "DDL_START_TIMEOUT",
    "DDL_START_ADDR",
    # elastic jobs (ddlrun --min-np sets them)
    "DDL_ELASTIC",
    "DDL_ELASTIC_MIN_NP",
    "DDL_ELASTIC_MAX_NP",
    "DDL_ELASTIC_DISCOVERY",
    "DDL_ELASTIC_DISCOVERY_INTERVAL",
    "DDL_ELASTIC_SLOTS_PER_HOST",
    "DDL_ELASTIC_RESET_LIMIT",
    "DDL_ELASTIC_COOLDOWN",
    "DDL_ELASTIC_TIMEOUT",
    "DDL_ELASTIC_HOSTS",
    "DDL_ELASTIC_LAUNCH_HOSTS",
    "DDL_ELASTIC_SPAWN_TIMEOUT",
    "DDL_ELASTIC_COMMAND",
    "DDL_ELASTIC_MIRROR",
    "DDL_ELASTIC_RESUMED",
    "DDL_ELASTIC_LOST_HOSTS",
    "DDL_ELASTIC_PRESTART",
    "DDL_ELASTIC_PARKED",
    "HOROVOD_ELASTIC",
    # Horovod fallbacks
    "HOROVOD_FUSION_THRESHOLD",
    "HOROVOD_TIMELINE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_LOG_LEVEL",
    "HOROVOD_START_TIMEOUT",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG",
    # launcher-provided layout
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "PYTHONPATH",
    # set by ddlrun for its children
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
    # where Open MPI keeps a job's files (ddlrun sets them unless the user did)
    "PRTE_MCA_prte_tmpdir_base",
    "PRTE_MCA_prte_local_tmpdir_base",
    "PRTE_MCA_prte_remote_tmpdir_base",
    "OMPI_MCA_btl_sm_backing_directory",
    "OMPI_MCA_btl_vader_backing_directory",
]

# --------------------------------------------------------------------------- ddl_tf

DDL_ALLREDUCE_ALGO = "DDL_ALLREDUCE_ALGO"
"""Allreduce algorithm: ``auto`` (default), ``flat``, ``ring``, ``hierarchical``, ``asa``."""

DDL_FUSION_THRESHOLD = "DDL_FUSION_THRESHOLD"
"""Largest fused bucket in bytes (default 64 MiB); ``0`` disables fusion."""

DDL_OVERLAP = "DDL_OVERLAP"
"""``1`` (default): inside graphs, reduce gradients in buckets that start while backprop runs;
``0``: one fused collective after the whole backward pass."""

DDL_BUCKET_BYTES = "DDL_BUCKET_BYTES"
"""Gradient bytes per overlapped bucket (default 2 MiB); ``0`` gives every gradient its own."""

DDL_COMPRESSION = "DDL_COMPRESSION"
"""Default wire compression when a call passes none: ``none``, ``fp16`` or ``bf16``."""

DDL_TIMELINE = "DDL_TIMELINE"
"""Path of a Chrome-trace JSON file recording every collective's phases."""

DDL_STALL_WARNING_SECONDS = "DDL_STALL_WARNING_SECONDS"
"""Seconds a collective may wait for missing ranks before a warning names them (60)."""

DDL_STALL_SHUTDOWN_SECONDS = "DDL_STALL_SHUTDOWN_SECONDS"
"""Seconds after which a stalled collective raises StallError (0 = never, the default)."""

DDL_CHECK_COLLECTIVES = "DDL_CHECK_COLLECTIVES"
"""``1`` (default): check every collective's descriptor across ranks first; ``0``: skip."""

DDL_ABORT_ON_ERROR = "DDL_ABORT_ON_ERROR"
"""``1`` (default): an uncaught exception in any rank aborts the whole job."""

DDL_TOPOLOGY_FILE = "DDL_TOPOLOGY_FILE"
"""JSON topology file adding levels (socket, rack, ...) and per-level algorithms."""

DDL_PSEUDO_NODES = "DDL_PSEUDO_NODES"
"""Fake node layout: a count (contiguous blocks) or one node name per rank, comma separated."""

DDL_AUTO_POLICY = "DDL_AUTO_POLICY"
"""JSON file with the ``auto`` algorithm table (as written by benchmarks/bench_allreduce.py)."""

DDL_LOG_LEVEL = "DDL_LOG_LEVEL"
"""Level of the ``ddl_tf`` logger set by ``init()`` (e.g. ``DEBUG``, ``WARNING``)."""

DDL_START_TIMEOUT = "DDL_START_TIMEOUT"
"""Seconds (default 60) within which every rank must call ``init()``, counted from the first
rank's call: past them every rank that called it fails with ``StartupError`` naming those
that did not (under ``ddlrun``, before MPI starts); ``0`` waits for ever, as MPI does."""

DDL_START_ADDR = "DDL_START_ADDR"
"""``host:port`` of ddlrun's start-up check, which ``ddlrun`` sets for its ranks: ``init()``
reports there before MPI starts, and learns which ranks did not start."""

# --------------------------------------------------------------------------- Horovod

HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"
HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
HOROVOD_STALL_CHECK_TIME_SECONDS = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
HOROVOD_STALL_CHECK_DISABLE = "HOROVOD_STALL_CHECK_DISABLE"
HOROVOD_LOG_LEVEL = "HOROVOD_LOG_LEVEL"
"""Horovod's log level (trace, debug, info, warning, error, fatal); ``DDL_LOG_LEVEL`` wins."""
HOROVOD_START_TIMEOUT = "HOROVOD_START_TIMEOUT"
"""horovodrun's start timeout (seconds); ``DDL_START_TIMEOUT``'s fallback."""
HOROVOD_HIERARCHICAL_ALLREDUCE = "HOROVOD_HIERARCHICAL_ALLREDUCE"
"""``1``: the hierarchical allreduce (``DDL_ALLREDUCE_ALGO=hierarchical``) unless
``DDL_ALLREDUCE_ALGO`` is set."""
HOROVOD_DYNAMIC_PROCESS_SETS = "HOROVOD_DYNAMIC_PROCESS_SETS"
"""``1``: process sets may be added and removed after ``init()`` (``hvd.add_process_set``),
as ``init(process_sets="dynamic")`` allows."""
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"
"""Horovod's background-loop period; ddl_tf has no background loop (ignored, with a warning)."""
HOROVOD_AUTOTUNE = "HOROVOD_AUTOTUNE"
"""Horovod's parameter autotuner; ddl_tf's ``auto`` algorithm picks per message size from a
learnt table instead (ignored, with a warning)."""
HOROVOD_AUTOTUNE_LOG = "HOROVOD_AUTOTUNE_LOG"
"""The log of Horovod's autotuner (ignored, with a warning)."""

_NO_AUTOTUNER = "there is no online autotuner (DDL_ALLREDUCE_ALGO=auto picks from a learnt table)"
_NO_GPU_PATH = "ddl_tf reduces on the host over MPI; it has no NCCL/GPU path"
HOROVOD_IGNORED = {
    HOROVOD_CYCLE_TIME: "ddl_tf runs each collective when it is issued; there is no "
    "background cycle to time",
    HOROVOD_AUTOTUNE: "ddl_tf's DDL_ALLREDUCE_ALGO=auto picks the algorithm per message size "
    "from a table benchmarks learn (benchmarks/policy_fit.py); there is no online autotuner",
    HOROVOD_AUTOTUNE_LOG: "there is no online autotuner to log",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": _NO_AUTOTUNER,
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": _NO_AUTOTUNER,
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": _NO_AUTOTUNER,
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": _NO_AUTOTUNER,
    "HOROVOD_TIMELINE_MARK_CYCLES": "there are no background cycles to mark",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "allgather is one MPI allgatherv; only the allreduce is "
    "hierarchical (DDL_ALLREDUCE_ALGO)",
    "HOROVOD_TORUS_ALLREDUCE": "the hierarchical allreduce (DDL_ALLREDUCE_ALGO=hierarchical, "
    "DDL_TOPOLOGY_FILE for more levels) covers multi-level layouts",
    "HOROVOD_CACHE_CAPACITY": "ddl_tf caches collective descriptors without a size knob",
    "HOROVOD_BATCH_D2D_MEMCOPIES": _NO_GPU_PATH,
    "HOROVOD_NUM_NCCL_STREAMS": _NO_GPU_PATH,
    "HOROVOD_CPU_OPERATIONS": "collectives always run over MPI",
    "HOROVOD_CONTROLLER": "the controller is always MPI",
    "HOROVOD_CCL_CACHE": "there is no oneCCL backend",
    "HOROVOD_GLOO_IFACE": "there is no Gloo backend; pick the interface with ddlrun "
    "--network-interface",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum sends each half-buffer in one MPI message (MPI "
    "splits large messages itself)",
    "HOROVOD_THREAD_AFFINITY": "there is no background thread to pin; bind ranks with the "
    "launcher (mpirun --bind-to)",
    "HOROVOD_DISABLE_GROUP_FUSION": "grouped collectives are fused by size "
    "(DDL_FUSION_THRESHOLD=0 disables fusion)",
    "HOROVOD_DISABLE_NVTX_RANGES": "there are no NVTX ranges (the timeline records phases)",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": _NO_GPU_PATH,
    "HOROVOD_ENABLE_XLA_OPS": "collectives cannot run inside XLA; compile with jit_compile=False",
    "HOROVOD_MPI_THREADS_DISABLE": "ddl_tf asks MPI for the thread level it needs itself",
}
"""Horovod variables that have no ddl_tf equivalent, and why; ``init()`` warns once on rank 0."""

DDL_ELASTIC = "DDL_ELASTIC"
"""``1`` in the ranks of an elastic job (``HOROVOD_ELASTIC`` is read too)."""
DDL_ELASTIC_MIN_NP = "DDL_ELASTIC_MIN_NP"
"""Fewest ranks an elastic job trains with (``ddlrun --min-np``)."""
DDL_ELASTIC_MAX_NP = "DDL_ELASTIC_MAX_NP"
"""Most ranks an elastic job grows to (``ddlrun --max-np``)."""
DDL_ELASTIC_DISCOVERY = "DDL_ELASTIC_DISCOVERY"
"""The host discovery script (prints ``host:slots`` lines; ``ddlrun --host-discovery-script``)."""
DDL_ELASTIC_DISCOVERY_INTERVAL = "DDL_ELASTIC_DISCOVERY_INTERVAL"
"""Seconds between two runs of the discovery script on rank 0 (default 1)."""
DDL_ELASTIC_SLOTS_PER_HOST = "DDL_ELASTIC_SLOTS_PER_HOST"
"""Slots of a discovered host printed without ``:slots`` (``ddlrun --slots-per-host``)."""
DDL_ELASTIC_RESET_LIMIT = "DDL_ELASTIC_RESET_LIMIT"
"""Most membership changes before an elastic job fails (``ddlrun --reset-limit``)."""
DDL_ELASTIC_COOLDOWN = "DDL_ELASTIC_COOLDOWN"
"""``low,high`` seconds a failed host stays out (Horovod's blacklist cooldown range)."""
DDL_ELASTIC_TIMEOUT = "DDL_ELASTIC_TIMEOUT"
"""Seconds an elastic job waits for ``--min-np`` slots (``ddlrun --elastic-timeout``)."""
DDL_ELASTIC_HOSTS = "DDL_ELASTIC_HOSTS"
"""``host:slots,...`` of the launch, in rank order (each rank's host name comes from it)."""
DDL_ELASTIC_LAUNCH_HOSTS = "DDL_ELASTIC_LAUNCH_HOSTS"
"""The job's host names that are mpirun's own machine (``localhost``, ``127.0.0.1``, its
name; ``node0`` on the rehearsal cluster), comma-separated: ranks spawned there need no
host key, and only there can a host take ranks again after it had some (see docs/elastic.md)."""
DDL_ELASTIC_SPAWN_TIMEOUT = "DDL_ELASTIC_SPAWN_TIMEOUT"
"""Seconds a growing job waits for its new ranks to connect (default 120); then its ranks end
themselves, and ``ddlrun`` drops that host and relaunches the job without it from the last commit."""
ELASTIC_FINISHED = "ddl_tf: elastic job finished"
"""What an elastic job's final rank 0 prints when it shuts down cleanly (``ddlrun`` looks for it)."""
DDL_ELASTIC_COMMAND = "DDL_ELASTIC_COMMAND"
"""The ranks' program as a JSON list (what a growing job spawns on a new host)."""
DDL_ELASTIC_MIRROR = "DDL_ELASTIC_MIRROR"
"""Folder in host memory (``/dev/shm/ddl_tf-<id>`` on each host) where every rank of an
elastic job keeps a copy of its last commit, for a relaunch after a node crash
(:mod:`ddl_tf.membership.mirror`); ``ddlrun`` sets it."""
DDL_ELASTIC_RESUMED = "DDL_ELASTIC_RESUMED"
"""Set by ``ddlrun`` on the ranks it relaunches after a node crash, or after the ranks spawned
onto a new host never connected (the relaunch's number,
1 for the first): they resume from the newest commit the survivors hold in host memory."""
DDL_ELASTIC_LOST_HOSTS = "DDL_ELASTIC_LOST_HOSTS"
"""Hosts an earlier launch of this elastic job lost with their Open MPI daemon, or whose spawned
ranks never connected (comma separated): the relaunched ranks keep them out as blacklisted."""
DDL_ELASTIC_PRESTART = "DDL_ELASTIC_PRESTART"
"""``0`` makes a growing elastic job wait for its new ranks at the commit that sees the new
hosts (the old way); by default (``1``) rank 0 starts them in the background while the job
trains, and they join at the first commit after they are ready (see docs/elastic.md)."""
DDL_ELASTIC_PARKED = "DDL_ELASTIC_PARKED"
"""Set on ranks a growing elastic job starts ahead: their ``init()`` waits, connected to rank 0
only, until the job admits them at a commit (or dismisses them when it ends first)."""
HOROVOD_ELASTIC = "HOROVOD_ELASTIC"

HOROVOD_RANK = "HOROVOD_RANK"
HOROVOD_SIZE = "HOROVOD_SIZE"
HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"

# --------------------------------------------------------------------------- launchers

OMPI_COMM_WORLD_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_COMM_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_COMM_WORLD_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_COMM_WORLD_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"
SLURM_PROCID = "SLURM_PROCID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_NODEID = "SLURM_NODEID"
SLURMD_NODENAME = "SLURMD_NODENAME"
PMI_RANK = "PMI_RANK"
PMI_SIZE = "PMI_SIZE"
MPI_LOCALRANKID = "MPI_LOCALRANKID"
MPI_LOCALNRANKS = "MPI_LOCALNRANKS"
SLURM_JOB_ID = "SLURM_JOB_ID"
PBS_JOBID = "PBS_JOBID"
PYTHONPATH = "PYTHONPATH"

OMPI_ALLOW_RUN_AS_ROOT = "OMPI_ALLOW_RUN_AS_ROOT"
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"

# --------------------------------------------------------------------------- Open MPI's files
# Read in ``mpirun``'s environment (:mod:`ddl_tf.launch.session`): ddlrun gives each job
# private directories through them, unless the user set one.

PRTE_MCA_prte_tmpdir_base = "PRTE_MCA_prte_tmpdir_base"
"""PRRTE's base of the session directories of ``mpirun`` and every daemon (the user's: PRRTE
refuses it beside the ``local``/``remote`` forms, so ddlrun then sets neither)."""

PRTE_MCA_prte_local_tmpdir_base = "PRTE_MCA_prte_local_tmpdir_base"
"""... of ``mpirun``'s own session directory (``ompi.<pid>``); ddlrun sets it to the job's
private ``$TMPDIR/ddlrun-ompi-*``."""

PRTE_MCA_prte_remote_tmpdir_base = "PRTE_MCA_prte_remote_tmpdir_base"
"""... of the other nodes' daemons (``prted.<pid>``); ddlrun sets it too when every daemon
runs on this machine."""

OMPI_MCA_btl_sm_backing_directory = "OMPI_MCA_btl_sm_backing_directory"
"""Where the ranks' shared-memory transport keeps its backing files (``sm_segment.*``; Open
MPI's default ``/dev/shm``). ``mpirun`` forwards it to the ranks; ddlrun sets it to the job's
private ``/dev/shm/ddlrun-sm-*`` when every rank runs on this machine."""

OMPI_MCA_btl_vader_backing_directory = "OMPI_MCA_btl_vader_backing_directory"
"""The same parameter's older name (Open MPI 4's ``vader``), still honoured: a user setting."""


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``name`` (stripped), or ``None`` when unset or empty.

    Args:
        name: One of the constants of this module.
        environ: Mapping to read instead of ``os.environ`` (tests, launchers).

    Returns:
        The stripped value, or ``None``.
    """
    value = _environ(environ).get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def get_first(
    names: Iterable[str], environ: Mapping[str, str] | None = None
) -> tuple[str, str] | tuple[None, None]:
    """The first of ``names`` that is set, as ``(name, value)``; ``(None, None)`` if none is.

    Args:
        names: Variable names in priority order (``DDL_`` name first).
        environ: Mapping to read instead of ``os.environ``.
    """
    for name in names:
        value = get(name, environ)
        if value is not None:
            return name, value
    return None, None


def snapshot(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the whole environment (what ``ddlrun`` hands to ``mpirun``).

    Args:
        environ: The environment to copy; None means ``os.environ``.

    Returns:
        A new dict.
    """
    return dict(_environ(environ))


def ddl_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``DDL_*`` and ``HOROVOD_*`` settings that are set (forwarded to remote ranks).

    Args:
        environ: The environment to read; None means ``os.environ``.

    Returns:
        ``{name: value}`` for the set, non-blank ``DDL_*``/``HOROVOD_*`` variables.
    """
    return {
        key: value
        for key, value in _environ(environ).items()
        if key.startswith(("DDL_", "HOROVOD_")) and value.strip()
    }


def elastic_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this rank belongs to an elastic job (``DDL_ELASTIC=1`` or ``HOROVOD_ELASTIC=1``)."""
    _, value = get_first((DDL_ELASTIC, HOROVOD_ELASTIC), environ)
    return value == "1"
