"""``ddlrun``: launch a ddl_tf job through mpirun, after sanity checks.

The command-line front end over the launch library (:mod:`ddl_tf.launch`:
hosts, the mpirun command, pre-flight checks) and, for ``--rehearse``, the
rehearsal cluster (:mod:`ddl_tf.cluster`). It imports neither TensorFlow nor
mpi4py, so ``ddlrun --help`` and argument errors answer at once.

Usage::

    ddlrun -np 4 -H node1:2,node2:2 python train.py --epochs 10
    ddlrun -np 4 --pseudo-nodes 2 --algo hierarchical train.py     # .py runs with this Python
    ddlrun -np 8 --hostfile hosts --topology topo.json --compression fp16 --timeline t.json train.py
    ddlrun --rehearse 2 -np 4 --link 1gbit train.py    # 2 virtual nodes on this machine (root)
    ddlrun --version

With ``--rehearse N`` the hosts are ``N`` virtual nodes that ddlrun creates
on this machine (network namespaces joined by links shaped to ``--link``,
see :mod:`ddl_tf.cluster`) and removes when the job ends.

It prints the (predicted) topology and the exact mpirun command, then runs it
with the ddl_tf settings exported to every rank (``-x DDL_...``). It adds
``--allow-run-as-root`` only when run as root. Jobs also run without ddlrun:
plain ``mpirun``/``srun`` (export the ``DDL_*`` variables yourself) or
``horovodrun --mpi``.

Exit codes:
    0   the job finished successfully
    2   invalid arguments
    3   a pre-flight check failed (hosts, slots, Python, topology, mpirun)
    other  mpirun's exit code (a rank failed); 128+N if mpirun died of signal N
    128+N  ddlrun received signal N (SIGTERM 143, SIGINT 130, SIGHUP 129): it
           forwarded it to mpirun, which ended the ranks (after 5 s the whole
           job is killed)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddl_tf import __version__, env
from ddl_tf.config import ALGORITHMS, COMPRESSIONS, DDLConfig
from ddl_tf.core.algorithms.selection import load_policy
from ddl_tf.core.topology.layout import Topology, pseudo_node_names
from ddl_tf.core.topology.topology_file import load_topology_file
from ddl_tf.errors import DDLError, LaunchError
from ddl_tf.launch import checks
from ddl_tf.launch.command import (
    LaunchPlan,
    build_command,
    child_environment,
    find_mpirun,
    mpi_flavor,
)
from ddl_tf.launch.hosts import EXAMPLE, is_local, parse_host_list, parse_hostfile, place_ranks

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_USAGE", "EXIT_PREFLIGHT"]

EXIT_OK, EXIT_USAGE, EXIT_PREFLIGHT = 0, 2, 3


def build_parser() -> argparse.ArgumentParser:
    """The ``ddlrun`` argument parser.

    Returns:
        The parser; ``--help`` and ``--version`` exit through ``SystemExit(0)``.
    """
    parser = argparse.ArgumentParser(
        prog="ddlrun",
        description="Launch a ddl_tf (Horovod-compatible) job through mpirun.",
        epilog=f"example: {EXAMPLE}\nexit codes: 0 ok, 2 bad arguments, 3 pre-flight check "
        "failed, otherwise mpirun's exit code.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ddlrun (tflms-ddl) {__version__}")
    parser.add_argument("-np", "-n", dest="np", type=int, help="number of ranks (default: slots)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="hosts and slots, e.g. node1:2,node2:2")
    where.add_argument("--hostfile", help="file with lines 'host slots=N'")
    where.add_argument(
        "--rehearse",
        type=int,
        metavar="N",
        help="run on N virtual nodes of this machine (network namespaces; needs root)",
    )
    parser.add_argument(
        "--link", default="1gbit", help="with --rehearse: node link rate (default 1gbit; none)"
    )
    parser.add_argument(
        "--latency", help="with --rehearse: added node-to-node latency, e.g. 100us (needs netem)"
    )
    parser.add_argument("--topology", help="JSON topology file (levels, groups, algorithms)")
    parser.add_argument("--algo", choices=ALGORITHMS, help="allreduce algorithm (default auto)")
    parser.add_argument(
        "--auto-policy", help="JSON table behind --algo auto (e.g. a cluster_auto_policy.json)"
    )
    parser.add_argument("--fusion-threshold-mb", type=float, help="fusion bucket size in MiB")
    parser.add_argument("--compression", choices=COMPRESSIONS, help="default wire compression")
    parser.add_argument("--timeline", help="write a Chrome-trace timeline to this file")
    parser.add_argument(
        "--pseudo-nodes", help="fake node layout on one host: a count, or a node name per rank"
    )
    parser.add_argument("--stall-warning-seconds", type=float, help="warn about stalls after S")
    parser.add_argument("--stall-shutdown-seconds", type=float, help="abort stalls after S")
    parser.add_argument("--oversubscribe", action="store_true", help="allow ranks > slots")
    parser.add_argument(
        "-x",
        dest="forward",
        action="append",
        default=[],
        metavar="VAR",
        help="export this environment variable to every rank (repeatable)",
    )
    parser.add_argument("--mpirun", help="mpirun to use (default: next to Python, then PATH)")
    parser.add_argument("--mpi-args", default="", help="extra mpirun arguments (one string)")
    parser.add_argument("--log-level", help="DDL_LOG_LEVEL for the ranks (Horovod's names too)")
    horovod = parser.add_argument_group(
        "horovodrun's options",
        "accepted so that replacing 'horovodrun' with 'ddlrun' is the only change a job "
        "script needs",
    )
    horovod.add_argument("--mpi", action="store_true", help="accepted: ddl_tf always runs over MPI")
    horovod.add_argument("--timeline-filename", help="the same as --timeline")
    horovod.add_argument(
        "--cycle-time-ms",
        type=float,
        help="accepted and ignored with a note: ddl_tf runs each collective when it is issued",
    )
    horovod.add_argument(
        "--verbose", action="store_true", help="accepted: ddlrun always prints its settings"
    )
    horovod.add_argument(
        "--start-timeout",
        type=float,
        help="accepted and ignored with a note: ranks that do not start make init() fail fast",
    )
    horovod.add_argument(
        "--network-interface",
        help="network interface(s) for MPI's TCP traffic (comma separated): Open MPI's "
        "btl_tcp_if_include and oob_tcp_if_include",
    )
    elastic = parser.add_argument_group(
        "elastic jobs (horovodrun's options)",
        "a rank's failure takes its host out and the others keep training; hosts the "
        "discovery script adds join at the next commit (see docs/elastic.md)",
    )
    elastic.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        help="fewest ranks to train with (makes the job elastic)",
    )
    elastic.add_argument(
        "--max-np", "--max-num-proc", dest="max_np", type=int, help="most ranks the job grows to"
    )
    elastic.add_argument(
        "--host-discovery-script", help="executable printing the available 'host:slots' lines"
    )
    elastic.add_argument(
        "--slots-per-host",
        type=int,
        help="slots of a host the discovery script prints without ':slots'",
    )
    elastic.add_argument(
        "--reset-limit", type=int, help="most membership changes before the job fails"
    )
    elastic.add_argument(
        "--blacklist-cooldown-range",
        nargs=2,
        type=float,
        metavar=("LOW", "HIGH"),
        help="seconds a failed host stays out (default: for good)",
    )
    elastic.add_argument(
        "--elastic-timeout", type=float, help="seconds to wait for --min-np slots (default 600)"
    )
    parser.add_argument("--skip-checks", action="store_true", help="skip the Python check")
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run")
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="command (a .py uses this Python)"
    )
    return parser


def _settings(args: argparse.Namespace) -> dict[str, str]:
    """DDL_* variables for the ranks, validated through DDLConfig."""
    values: dict[str, str] = {}
    if args.algo:
        values[env.DDL_ALLREDUCE_ALGO] = args.algo
    if args.fusion_threshold_mb is not None:
        values[env.DDL_FUSION_THRESHOLD] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.compression:
        values[env.DDL_COMPRESSION] = args.compression
    timeline = args.timeline or args.timeline_filename
    if timeline:
        values[env.DDL_TIMELINE] = str(Path(timeline).resolve())
    if args.log_level:
        values[env.DDL_LOG_LEVEL] = args.log_level
    if args.topology:
        values[env.DDL_TOPOLOGY_FILE] = str(Path(args.topology).resolve())
    if args.auto_policy:
        values[env.DDL_AUTO_POLICY] = str(Path(args.auto_policy).resolve())
        load_policy(values[env.DDL_AUTO_POLICY])  # raises ConfigError naming the problem
    if args.pseudo_nodes:
        values[env.DDL_PSEUDO_NODES] = args.pseudo_nodes
    if args.stall_warning_seconds is not None:
        values[env.DDL_STALL_WARNING_SECONDS] = str(args.stall_warning_seconds)
    if args.stall_shutdown_seconds is not None:
        values[env.DDL_STALL_SHUTDOWN_SECONDS] = str(args.stall_shutdown_seconds)
    DDLConfig.from_env({**env.ddl_variables(), **values})  # raises ConfigError on bad values
    return values


def _plan(args: argparse.Namespace) -> tuple[LaunchPlan, list[str]]:
    hosts = parse_host_list(args.hosts) if args.hosts else []
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    if args.rehearse is not None and args.host_discovery_script is None:
        from ddl_tf.cluster.rehearse import rehearsal_hosts

        hosts = rehearsal_hosts(args.rehearse, args.np if args.np is not None else args.rehearse)
    np_ = args.np if args.np is not None else sum(h.slots for h in hosts)
    if not np_ and (args.min_np or args.max_np or args.host_discovery_script):
        np_ = args.min_np or 1  # an elastic job's size comes from its hosts (launch.elastic)
    if not np_ or np_ < 1:
        raise LaunchError(f"ddlrun: give the number of ranks with -np N (>= 1); e.g. {EXAMPLE}")
    placement = place_ranks(hosts, np_, args.oversubscribe) if hosts else ["localhost"] * np_
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if program and program[0].endswith(".py"):
        program = [sys.executable, *program]
    in_allocation = not hosts and (
        env.get(env.SLURM_JOB_ID) is not None or env.get(env.PBS_JOBID) is not None
    )
    forward = list(args.forward)
    forward += [name for name in env.ddl_variables() if name not in forward]
    if env.get(env.PYTHONPATH) is not None and env.PYTHONPATH not in forward:
        forward.append(env.PYTHONPATH)
    mpi_args = shlex.split(args.mpi_args)
    if args.network_interface:
        for component in ("btl_tcp_if_include", "oob_tcp_if_include"):
            mpi_args += ["--mca", component, args.network_interface]
    plan = LaunchPlan(
        np=np_,
        program=program,
        # a hostfile is read here (its 'host:N' lines included) and passed on as -H, so
        # mpirun never sees a line it would take for a host name
        hosts=hosts if args.hosts or args.hostfile or args.rehearse is not None else [],
        hostfile=None,
        env=_settings(args),
        forward=forward,
        oversubscribe=args.oversubscribe,
        mpi_args=mpi_args,
        in_allocation=in_allocation,
    )
    return plan, placement


def _elastic_settings(args: argparse.Namespace):
    """The elastic settings when an elastic option is given, else None.

    Raises:
        ConfigError: The bounds contradict.
    """
    if args.min_np is None and args.max_np is None and args.host_discovery_script is None:
        return None
    from ddl_tf.membership.settings import DEFAULT_TIMEOUT, ElasticSettings

    script = args.host_discovery_script
    if script is not None:
        script = str(Path(script).resolve())
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    return ElasticSettings(
        min_np=args.min_np if args.min_np is not None else (args.np or 1),
        max_np=args.max_np,
        discovery=script,
        slots_per_host=args.slots_per_host,
        reset_limit=args.reset_limit,
        cooldown=cooldown,
        timeout=args.elastic_timeout if args.elastic_timeout is not None else DEFAULT_TIMEOUT,
        # DDL_ELASTIC_DISCOVERY_INTERVAL (tests poll faster); checked like the ranks check it
        discovery_interval=ElasticSettings.from_env().discovery_interval,
    )


def _describe_topology(args: argparse.Namespace, placement: list[str]) -> str:
    names = pseudo_node_names(args.pseudo_nodes, len(placement)) if args.pseudo_nodes else placement
    spec = load_topology_file(args.topology) if args.topology else None
    source = "--pseudo-nodes" if args.pseudo_nodes else "host placement (--map-by slot)"
    return Topology.from_node_names(names, 0, spec, source=source).describe()


def main(argv: list[str] | None = None) -> int:
    """Run ``ddlrun``.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code (see the module docstring): 0, 2 for bad arguments, 3 for a
        failed pre-flight check, otherwise mpirun's.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code else EXIT_OK
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    spec = None
    try:
        plan, placement = _plan(args)
        checks.check_program(plan.program)
        elastic = _elastic_settings(args)
        if elastic is not None:
            from ddl_tf.launch.elastic import find_hosts, make_elastic

            hosts = find_hosts(elastic, plan.hosts)
            plan.np = args.np or 0
            make_elastic(plan, elastic, hosts)
            placement = [h for h, n in hosts.items() for _ in range(n)][: plan.np]
        if args.rehearse is not None:
            from ddl_tf.cluster.mpi import mca_arguments
            from ddl_tf.cluster.rehearse import rehearsal_spec, require_cluster

            spec = rehearsal_spec(args.rehearse, args.link, args.latency)
            plan.mpi_args = mca_arguments(spec, shared_memory=elastic is None) + plan.mpi_args
            if elastic is not None:  # mpirun runs inside node0
                plan.env[env.DDL_ELASTIC_LAUNCH_HOSTS] = spec.hostnames[0]
            if not args.dry_run:
                require_cluster()
        checks.check_hosts_resolve([] if spec else plan.hosts or [])
        mpirun = find_mpirun(args.mpirun)
        flavor = mpi_flavor(mpirun)
        command = build_command(plan, mpirun, flavor=flavor, as_root=as_root)
        child_env = child_environment(plan, as_root=as_root)
        topology_text = _describe_topology(args, placement)
        python = checks.python_of(plan.program)
        if python and not args.skip_checks:
            # virtual nodes share this machine's files: checking the local Python suffices
            remote = [h for h in plan.hosts if not is_local(h.name)] if spec is None else []
            prefix = [
                mpirun,
                "-np",
                str(len(remote)),
                "--map-by",
                "ppr:1:node",
                "-H",
                ",".join(f"{h.name}:1" for h in remote),
            ]
            if as_root:
                prefix.insert(1, "--allow-run-as-root")
            checks.check_python(python, child_env, remote, prefix if flavor == "openmpi" else None)
    except DDLError as err:
        print(str(err), file=sys.stderr)
        return EXIT_PREFLIGHT
    print(f"ddlrun: {plan.np} rank(s); topology:")
    for line in topology_text.splitlines():
        print(f"ddlrun:   {line}")
    if spec is not None:
        print("ddlrun: rehearsal " + spec.describe().replace("\n", "\nddlrun:   "))
    if plan.env:
        print("ddlrun: settings: " + " ".join(f"{k}={v}" for k, v in sorted(plan.env.items())))
    for option, why in (
        ("--cycle-time-ms", "ddl_tf runs each collective when it is issued (no cycle)"),
        ("--start-timeout", "a rank that does not start makes init() fail on the others"),
    ):
        if getattr(args, option[2:].replace("-", "_")) is not None:
            print(f"ddlrun: note: {option} is horovodrun's and has no effect here: {why}")
    print("ddlrun: running: " + shlex.join(command), flush=True)
    if args.dry_run:
        return EXIT_OK
    if spec is not None:
        from ddl_tf.cluster.rehearse import run_rehearsal

        try:
            if elastic is not None:
                finished = _FinishedWatch()
                code = run_rehearsal(spec, command, child_env, watch=finished)
                return finished.status(128 - code if code < 0 else code)
            return _exit_code(run_rehearsal(spec, command, child_env))
        except DDLError as err:
            print(str(err), file=sys.stderr)
            return EXIT_PREFLIGHT
        except KeyboardInterrupt:  # the job was stopped and the cluster removed
            return 128 + signal.SIGINT
    if elastic is not None:
        return _run_elastic(command, child_env)
    return _run(command, child_env)


def _run_elastic(command: list[str], child_env: dict[str, str]) -> int:
    """Run an elastic job: its status is whether its final ranks finished, not mpirun's."""
    finished = _FinishedWatch()
    return finished.status(_run(command, child_env, finished))


class _FinishedWatch:
    """Passes an elastic job's output through and notes whether its final ranks finished.

    Under MPI's fault tolerance mpirun's exit status says little: a rank that
    failed and was survived can make it non-zero, and ranks that all failed
    after a membership change can leave it 0 (both measured here). The final
    membership's rank 0 prints :data:`~ddl_tf.env.ELASTIC_FINISHED` when it
    shuts down cleanly; this watch looks for that line.
    """

    DAEMON_LOST = (b"A daemon failed to report back", b"lost communication with a remote daemon")
    """What Open MPI's runtime prints when it loses the daemon of a host (both forms seen)."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self.daemon_lost = False
        self.lost_host = ""

    def __call__(self, stream, sink=None) -> None:
        sink = sink if sink is not None else sys.stdout
        for line in iter(stream.readline, b""):
            if line.startswith(env.ELASTIC_FINISHED.encode()):
                self.finished.set()
            if any(text in line for text in self.DAEMON_LOST):
                self.daemon_lost = True
            if self.daemon_lost and not self.lost_host and b"Remote host:" in line:
                self.lost_host = line.split(b":", 1)[1].strip().decode(errors="replace")
            sink.buffer.write(line)
            sink.flush()

    def status(self, code: int) -> int:
        """ddlrun's exit code from mpirun's ``code`` and whether the finished line came."""
        if self.finished.is_set():
            return code if code >= 128 else EXIT_OK
        if self.daemon_lost:
            print(
                f"ddlrun: Open MPI lost its daemon on host {self.lost_host or '(see above)'} "
                "(the node died, or its runtime process was killed or cut off). An elastic job "
                "survives the loss of ranks, but Open MPI 5.0's runtime (PRRTE) ends the whole "
                "job when one of its daemons is lost, so the job stopped. Restart it; keep "
                "checkpoints on rank 0 (e.g. keras.callbacks.ModelCheckpoint) to resume from.",
                file=sys.stderr,
            )
            return code or 1
        if code >= 128:  # a signal stopped the job (ddlrun's, forwarded)
            return code
        print(
            "ddlrun: the elastic job ended without its ranks finishing (every rank failed or "
            f"left; mpirun's status {code}): see the ranks' errors above",
            file=sys.stderr,
        )
        return code or 1


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What ddlrun passes on to mpirun: a scheduler's stop (Slurm, PBS, Kubernetes and ``kill``
send SIGTERM), a terminal's Ctrl-C, a closed session."""

STOP_GRACE_S = 5.0
"""Seconds mpirun gets to end the ranks after a forwarded signal before the whole job is
killed (SIGKILL to mpirun's process group and to every rank it started)."""


def _run(command: list[str], child_env: dict[str, str], watch=None) -> int:
    """Run mpirun and wait; a stop signal ends the whole job within seconds.

    mpirun gets a session of its own, so that ddlrun alone decides what it
    receives: the first SIGTERM, SIGINT or SIGHUP is forwarded to it (Open
    MPI then terminates the ranks); if the job is still there after
    :data:`STOP_GRACE_S`, its process group is killed. ddlrun then exits with
    ``128 + signal`` (143 for SIGTERM), the status a shell gives a command
    the signal stopped. ``watch(stream, sink)``, if given, reads mpirun's
    standard output and error (a thread each) instead of them going straight
    to ddlrun's, and passes them on to ``sink``.
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
            print(
                f"ddlrun: {signal.Signals(signum).name} received; stopping the job",
                file=sys.stderr,
                flush=True,
            )
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
                if received and stopped_at is None:
                    stopped_at = time.monotonic()
                if stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                    _kill_session(proc.pid, signal.SIGKILL)
                    code = proc.wait()
                    break
        if received:  # mpirun may return before its local ranks are gone: wait for them
            deadline = (stopped_at or time.monotonic()) + STOP_GRACE_S
            while _session_members(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _kill_session(proc.pid, signal.SIGKILL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for reader in readers:
            reader.join(timeout=STOP_GRACE_S)
    if received:
        return 128 + received[0]
    return _exit_code(code) if watch is None else (128 - code if code < 0 else code)


def _session_members(session: int) -> list[int]:
    """Processes of this machine in session ``session`` (mpirun's: it and its local ranks)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.getsid(int(entry.name)) == session:
                members.append(int(entry.name))
    return members


def _kill_session(session: int, signum: int) -> None:
    """Send ``signum`` to every process left in ``session`` (mpirun's, on this machine)."""
    for pid in _session_members(session):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _exit_code(code: int) -> int:
    if code < 0:
        return 128 - code
    if code != 0:
        print(f"ddlrun: job failed with exit code {code}", file=sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
