"""``ddlrun``: launch a ddl_tf job through mpirun, after sanity checks.

The command-line front end: it reads the arguments, turns them into a launch
plan with the launch library (:mod:`ddl_tf.launch`: hosts, the mpirun command,
pre-flight checks) and, for ``--rehearse``, the rehearsal cluster
(:mod:`ddl_tf.cluster`), and hands the command to the supervisor
(:mod:`ddl_tf.launch.supervise`: signals, ending the whole job, exit codes).
It imports neither TensorFlow nor mpi4py, so ``ddlrun --help`` and argument
errors answer at once.

ddlrun's options come before the program; everything after the program is
the program's. ``-np`` defaults to the slots: those of ``-H``/``--hostfile``/
``--rehearse``, else this machine's cores (as ``mpirun`` counts them); inside
a Slurm or PBS allocation without hosts, give ``-np``. An option of ddlrun's
own that no training script is likely to take (``-np``, ``--hostfile``,
``--min-np``, ... :data:`LAUNCH_ONLY_OPTIONS`) found after the program is
refused (exit 2) with the fix, since it would reach the program, not ddlrun;
a program that does take one goes after ``--`` (``ddlrun -np 2 -- train.py -np 5``).

Usage::

    ddlrun -np 4 -H node1:2,node2:2 python train.py --epochs 10
    ddlrun -np 4 --pseudo-nodes 2 --algo hierarchical train.py     # .py runs with this Python
    ddlrun -np 8 --hostfile hosts --topology topo.json --compression fp16 --timeline t.json train.py
    ddlrun --rehearse 2 -np 4 --link 1gbit train.py    # 2 virtual nodes on this machine (root)
    ddlrun train.py                                     # one rank per core of this machine
    ddlrun --version

With ``--rehearse N`` the hosts are ``N`` virtual nodes that ddlrun creates
on this machine (network namespaces joined by links shaped to ``--link``,
see :mod:`ddl_tf.cluster`) and removes when the job ends.

It prints the (predicted) topology and the exact mpirun command, then runs it
with the ddl_tf settings exported to every rank (``-x DDL_...``). Each launch
of a job of several ranks also gets ddlrun's start-up check
(:mod:`ddl_tf.launch.startup`, ``-x DDL_START_ADDR``; on the ``--rehearse``
cluster a Unix socket): ranks report to it before MPI starts, and if some do
not call ``init()`` within ``--start-timeout`` (``DDL_START_TIMEOUT``, 60 s),
the others fail naming them. An elastic job then drops those ranks' hosts and
is relaunched on the others, if they give ``--min-np`` slots. It adds
``--allow-run-as-root`` only when run as root.

When mpirun fails at its own start-up, before any rank ran (Open MPI's
intermittent "The PMIx server's listener thread failed to start", exit code
213), ddlrun launches the same job again after a 1 s pause, at most
``--start-retries`` times (2; 0 turns it off), and says so; a job any rank of
which reached ddlrun's start-up check, or that ddlrun was told to stop, is
never launched again (see :class:`~ddl_tf.launch.supervise.StartWatch`). The cause
reproduced, a killed mpirun's session directory that a new mpirun with the same pid
meets, cannot happen to ddlrun's jobs: each keeps mpirun's session directories in a
fresh directory of its own, removed when the job ends (:mod:`ddl_tf.launch.session`;
a base the user set for them wins). So do the ranks' shared-memory backing files when
every rank runs on this machine (``/dev/shm/ddlrun-sm-*``), which killed ranks would
otherwise leave in ``/dev/shm``.

Jobs also run without ddlrun: plain ``mpirun``/``srun`` (export the ``DDL_*``
variables yourself) or ``horovodrun --mpi``.

Exit codes:
    0   the job finished successfully
    2   invalid arguments (also: no program, -np below 1, a ddlrun option after the program)
    3   a pre-flight check failed (hosts, slots, Python, topology, mpirun)
    other  mpirun's exit code (a rank failed); 128+N if mpirun died of signal N
    128+N  ddlrun received signal N (SIGTERM 143, SIGINT 130, SIGHUP 129): it
           forwarded it to mpirun, which ended the ranks (after 5 s the whole
           job is killed)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ddl_tf import __version__, env
from ddl_tf.config import ALGORITHMS, COMPRESSIONS, DDLConfig
from ddl_tf.core.algorithms.selection import load_policy
from ddl_tf.core.topology.layout import Topology, pseudo_node_names
from ddl_tf.core.topology.topology_file import load_topology_file
from ddl_tf.errors import DDLError
from ddl_tf.launch import checks
from ddl_tf.launch.command import (
    LaunchPlan,
    build_command,
    child_environment,
    find_mpirun,
    mpi_flavor,
    once_per_host,
)
from ddl_tf.launch.hosts import (
    EXAMPLE,
    host_list,
    is_local,
    local_slots,
    parse_host_list,
    parse_hostfile,
    place_ranks,
)
from ddl_tf.launch.session import private_session_base, private_sm_directory
from ddl_tf.launch.supervise import (
    SPAWN_FAILED_GRACE_S,
    STOP_GRACE_S,
    FinishedWatch,
    StartWatch,
    exit_code,
    run_elastic,
    run_fixed,
)

if TYPE_CHECKING:
    from ddl_tf.cluster.spec import ClusterSpec
    from ddl_tf.launch.startup import StartChecks

__all__ = [
    "main",
    "build_parser",
    "usage_problem",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_PREFLIGHT",
    "LAUNCH_ONLY_OPTIONS",
]

EXIT_OK, EXIT_USAGE, EXIT_PREFLIGHT = 0, 2, 3

LAUNCH_ONLY_OPTIONS = frozenset(
    (
        "-np --hostfile --oversubscribe --pseudo-nodes --rehearse --mpirun --mpi-args "
        "--min-np --max-np --min-num-proc --max-num-proc --host-discovery-script "
        "--slots-per-host --blacklist-cooldown-range --elastic-timeout --fusion-threshold-mb "
        "--stall-warning-seconds --stall-shutdown-seconds --auto-policy --network-interface "
        "--timeline-filename --cycle-time-ms --skip-checks --start-retries"
    ).split()
)
"""ddlrun's options that a training script is unlikely to define: after the program, one of
them is a misplaced ddlrun option, refused with the fix. The rest (``-n``, ``-H``, ``-x``,
``--algo``, ``--timeline``, ``--verbose``, ...) are common script options too and pass
through to the program unremarked, as everything after the program does."""


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
    parser.add_argument(
        "-np",
        "-n",
        dest="np",
        type=int,
        help="number of ranks (default: the slots of -H/--hostfile/--rehearse, else this "
        "machine's cores; inside a Slurm/PBS allocation give it)",
    )
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
    parser.add_argument(
        "--start-retries",
        type=int,
        default=StartWatch.START_RETRIES,
        metavar="N",
        help="launch the job again, at most N times (default %(default)s; 0: never), when "
        "mpirun fails at its own start-up before any rank ran (Open MPI's intermittent \"The "
        "PMIx server's listener thread failed to start\", exit code 213)",
    )
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
        help="seconds every rank has to call init() (DDL_START_TIMEOUT, default 60; 0 waits "
        "for ever): past them the ranks that did fail, naming those that did not",
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
        "program",
        nargs=argparse.REMAINDER,
        help="command (a .py uses this Python) and its arguments; ddlrun's options go before "
        "it ('--' before it if it takes one of ddlrun's launch options itself)",
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
    if args.start_timeout is not None:
        values[env.DDL_START_TIMEOUT] = str(args.start_timeout)
    DDLConfig.from_env({**env.ddl_variables(), **values})  # raises ConfigError on bad values
    return values


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with parsed arguments that argparse cannot see, or None.

    Args:
        args: What :func:`build_parser` parsed.

    Returns:
        The message (with the fix) for a missing program, ``-np`` below 1, a
        missing ``-np`` inside a Slurm/PBS allocation without hosts, or one of
        :data:`LAUNCH_ONLY_OPTIONS` after the program; None if there is none.
    """
    program = list(args.program)
    escaped = bool(program) and program[0] == "--"
    if escaped:
        program = program[1:]
    if not program:
        return f"no program to run; give it after ddlrun's options, e.g. {EXAMPLE}"
    if args.np is not None and args.np < 1:
        return f"-np must be 1 or more. Received -np {args.np}; e.g. {EXAMPLE}"
    if args.start_retries < 0:
        return (
            f"--start-retries must be 0 or more. Received --start-retries {args.start_retries}; "
            "e.g. --start-retries 0 (never launch the job again)"
        )
    no_hosts = not (args.hosts or args.hostfile or args.rehearse is not None)
    allocation = env.get(env.SLURM_JOB_ID) or env.get(env.PBS_JOBID)
    if args.np is None and no_hosts and allocation and not _is_elastic(args):
        return (
            "inside a Slurm or PBS allocation, give the number of ranks with -np N: ddlrun "
            "does not count the allocation's slots (mpirun places the ranks on them)."
        )
    if escaped:
        return None
    for word in program[1:]:
        option = word.split("=", 1)[0]
        if option in LAUNCH_ONLY_OPTIONS:
            shown = program[1] if program[1:2] and program[1].endswith(".py") else program[0]
            return (
                f"{option} comes after the program ({shown}), so it would go to the program, "
                f"not to ddlrun. Put ddlrun's options before the program: ddlrun {option} ... "
                f"{shown} ...; if {shown} takes {option} itself, start it after '--': "
                f"ddlrun [options] -- {shown} {option} ..."
            )
    return None


def _is_elastic(args: argparse.Namespace) -> bool:
    return bool(args.min_np or args.max_np or args.host_discovery_script)


def _plan(args: argparse.Namespace) -> tuple[LaunchPlan, list[str]]:
    hosts = parse_host_list(args.hosts) if args.hosts else []
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    if args.rehearse is not None and args.host_discovery_script is None:
        from ddl_tf.cluster.rehearse import rehearsal_hosts

        hosts = rehearsal_hosts(args.rehearse, args.np if args.np is not None else args.rehearse)
    if args.np is not None:
        np_ = args.np  # >= 1: usage_problem() checked it
    elif hosts:
        np_ = sum(h.slots for h in hosts)
    elif _is_elastic(args):
        np_ = args.min_np or 1  # an elastic job's size comes from its hosts (launch.elastic)
    else:
        np_ = local_slots()  # outside an allocation: usage_problem() asked for -np inside one
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


def _say(text: str) -> None:
    """What ddlrun has to say about the job: on standard error, at once."""
    print(text, file=sys.stderr, flush=True)


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
    problem = usage_problem(args)
    if problem is not None:  # the one line that matters, not argparse's long usage above it
        print(f"ddlrun: error: {problem} (ddlrun --help lists the options)", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.ExitStack() as job:  # what lives as long as the job: mpirun's session base
        return _run(args, job)


def _run(args: argparse.Namespace, job: contextlib.ExitStack) -> int:
    """Plan, check and run the job of ``args`` (:func:`main` after the usage checks)."""
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    spec = None
    try:
        plan, placement = _plan(args)
        checks.check_program(plan.program)
        elastic = _elastic_settings(args)
        base = None
        if elastic is not None:
            from ddl_tf.launch.elastic import find_hosts, make_elastic
            from ddl_tf.membership.mirror import default_folder

            hosts = find_hosts(elastic, plan.hosts)
            plan.np = args.np or 0
            # every rank mirrors its commits there: a relaunch after a node crash resumes
            plan.env[env.DDL_ELASTIC_MIRROR] = default_folder(uuid.uuid4().hex[:12])
            base = copy.deepcopy(plan)  # what a relaunch on the surviving hosts starts from
            make_elastic(plan, elastic, hosts)
            placement = [h for h, n in hosts.items() for _ in range(n)][: plan.np]
        if args.rehearse is not None:
            from ddl_tf.cluster.mpi import rehearsal_plan
            from ddl_tf.cluster.rehearse import rehearsal_spec, require_cluster

            spec = rehearsal_spec(args.rehearse, args.link, args.latency)
            rehearsal_plan(plan, spec, elastic is not None)
            if not args.dry_run:
                require_cluster()
        checks.check_hosts_resolve([] if spec else plan.hosts or [])
        mpirun = find_mpirun(args.mpirun)
        flavor = mpi_flavor(mpirun)
        same_machine = spec is not None or (
            elastic is None and not plan.in_allocation and all(is_local(h.name) for h in plan.hosts)
        )  # every daemon runs here: they all keep their session directories in the job's base
        for private in (private_session_base, private_sm_directory):  # removed at the job's end
            directory = private(mpirun, plan.mpi_args, flavor=flavor, same_machine=same_machine)
            plan.launcher_env.update(job.enter_context(directory))
        if base is not None:  # an elastic relaunch's mpirun too
            base.launcher_env.update(plan.launcher_env)
        command = build_command(plan, mpirun, flavor=flavor, as_root=as_root)
        child_env = child_environment(plan, as_root=as_root)
        topology_text = _describe_topology(args, placement)
        python = checks.python_of(plan.program)
        if python and not args.skip_checks:
            # virtual nodes share this machine's files: checking the local Python suffices
            remote = [h for h in plan.hosts if not is_local(h.name)] if spec is None else []
            prefix = once_per_host(mpirun, remote, flavor=flavor, as_root=as_root)
            checks.check_python(python, child_env, remote, prefix)
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
    ):
        if getattr(args, option[2:].replace("-", "_")) is not None:
            print(f"ddlrun: note: {option} is horovodrun's and has no effect here: {why}")
    start_checks = None
    finished = FinishedWatch(_say, args.start_retries) if elastic is not None else None
    if not args.dry_run and plan.np > 1:  # the ranks report to it before MPI starts
        from ddl_tf.launch.startup import StartChecks  # numpy: not for --help

        start_checks = StartChecks(
            args.network_interface,
            rehearsal=spec is not None,
            report=(lambda line, _: _say(line))
            if finished is None
            else finished.start_check_failed,
            stop=threading.Event() if finished is None else finished.halt,
            say=_say,
        )
        if start_checks.open(plan, placement, child_env):
            command = build_command(plan, mpirun, flavor=flavor, as_root=as_root)
    print("ddlrun: running: " + shlex.join(command), flush=True)
    if args.dry_run:
        return EXIT_OK
    again = None
    if elastic is not None:
        assert base is not None
        again = _Relauncher(base, elastic, hosts, spec, (mpirun, flavor, as_root), start_checks)
    ran = start_checks.reached if start_checks is not None else None
    try:
        if spec is not None:
            from ddl_tf.cluster.rehearse import run_rehearsal
            from ddl_tf.launch.elastic import retrying

            try:
                if again is not None:
                    assert finished is not None
                    code = run_rehearsal(
                        spec,
                        command,
                        child_env,
                        watch=finished,
                        again=retrying(finished, again.after(finished), command, child_env, ran),
                        stop=finished.halt,
                        grace=SPAWN_FAILED_GRACE_S,
                    )
                    return finished.status(128 - code if code < 0 else code)
                return _run_rehearsal_fixed(
                    spec, command, child_env, args.start_retries, start_checks
                )
            except DDLError as err:
                print(str(err), file=sys.stderr)
                return EXIT_PREFLIGHT
            except KeyboardInterrupt:  # the job was stopped and the cluster removed
                return 128 + signal.SIGINT
        if again is not None:
            return run_elastic(
                command,
                child_env,
                report=_say,
                again=again,
                start_retries=args.start_retries,
                watch=finished,
                ran=ran,
            )
        # a rank that reached the check ran the program: that job is never launched again
        return run_fixed(
            command,
            child_env,
            report=_say,
            stop=start_checks.stop if start_checks is not None else None,
            ran=ran,
            retries=args.start_retries,
        )
    finally:
        if again is not None:
            again.remove_mirrors(plan.env[env.DDL_ELASTIC_MIRROR])
        if start_checks is not None:
            start_checks.close()


def _run_rehearsal_fixed(
    spec: ClusterSpec,
    command: list[str],
    child_env: dict[str, str],
    retries: int,
    checks: StartChecks | None,
) -> int:
    """Run a fixed-size job on the rehearsal cluster, as :func:`run_fixed` runs one here.

    mpirun runs inside node 0; when it fails at its own start-up before any
    rank ran (:class:`StartWatch`), the same command runs again in the same
    cluster, at most ``retries`` times; ddlrun's start-up check (a Unix
    socket the virtual nodes reach through the shared files) stops a job
    whose ranks did not all call ``init()``, every process of the cluster's
    nodes killed after :data:`STOP_GRACE_S`.
    """
    from ddl_tf.cluster.rehearse import run_rehearsal

    stop = checks.stop if checks is not None else None
    if retries <= 0:
        return exit_code(
            run_rehearsal(spec, command, child_env, stop=stop, grace=STOP_GRACE_S), report=_say
        )
    watch = StartWatch(_say, retries)

    def again(code: int) -> tuple[list[str], dict[str, str]] | None:
        ran = checks is not None and checks.reached()
        if watch.retry_start(128 - code if code < 0 else code, ran=ran):
            return command, child_env
        return None

    code = run_rehearsal(
        spec, command, child_env, watch=watch, again=again, stop=stop, grace=STOP_GRACE_S
    )
    if watch.stopped is not None:
        return watch.stopped
    code = 128 - code if code < 0 else code
    return code if code in watch.STOPPED_BY_DDLRUN else exit_code(code, report=_say)


CLEANUP_TIMEOUT_S = 30.0
"""Seconds ddlrun gives the removal of an elastic job's mirrored commits on remote hosts."""


class _Relauncher:
    """After Open MPI lost a host's daemon (a node crash), or the ranks spawned onto a new host
    never connected: relaunch the job on the other hosts.

    Open MPI 5.0's runtime ends every rank when it loses a daemon. The ranks
    mirrored each commit in their host's memory (``DDL_ELASTIC_MIRROR``), so
    ddlrun starts the job again on the hosts that are left (the discovery
    script's, or ``-H``'s, without the lost ones), with ``DDL_ELASTIC_RESUMED``:
    the new ranks resume from the newest commit a survivor held, and keep the
    lost hosts out (``DDL_ELASTIC_LOST_HOSTS``). A host whose spawned ranks
    never connected (``DDL_ELASTIC_SPAWN_TIMEOUT``; the spawning ranks ended
    themselves) is dropped the same way. Each relaunch drops at least one
    host, so there are fewer relaunches than hosts.

    Args:
        base: The plan before it was made elastic (its ``-np``, environment, program).
        settings: The elastic settings.
        hosts: The hosts of the first launch.
        spec: The rehearsal cluster, or None.
        launcher: ``(mpirun, flavor, as_root)``.
    """

    def __init__(self, base, settings, hosts, spec, launcher, checks=None) -> None:
        self.base = base
        self.checks: StartChecks | None = checks
        self.settings = settings
        self.hosts = dict(hosts)
        self.spec = spec
        self.launcher = launcher
        self.lost: list[str] = []
        self.count = 0
        self.launched = set(hosts)

    def remove_mirrors(self, folder: str) -> None:
        """Remove the job's mirrored commits from the hosts it ran on, once it has ended.

        The ranks keep theirs until then: a relaunch may need them even after
        they finished (when Open MPI's runtime lost a daemon while the last
        ranks shut down, and their finished line with it). Virtual nodes and
        this machine share this ``/dev/shm``; other hosts (those launched on,
        and those the discovery script lists now) get ``rm -rf`` through
        mpirun, once per host, bounded by :data:`CLEANUP_TIMEOUT_S`.
        """
        shutil.rmtree(folder, ignore_errors=True)
        if self.spec is not None:
            return
        hosts = set(self.launched)
        if self.settings.discovery is not None:
            from ddl_tf.membership.discovery import DiscoveryError, run_discovery

            with contextlib.suppress(DiscoveryError):
                hosts |= set(run_discovery(self.settings.discovery, self.settings.slots_per_host))
        remote = sorted(h for h in hosts if not is_local(h) and h not in self.lost)
        if not remote:
            return
        mpirun, flavor, as_root = self.launcher
        prefix = once_per_host(
            mpirun, host_list(dict.fromkeys(remote, 1)), flavor=flavor, as_root=as_root
        )
        if prefix is None:
            return
        try:
            subprocess.run(
                [*prefix, "rm", "-rf", folder],
                capture_output=True,
                timeout=CLEANUP_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            _say(
                f"ddlrun: note: the job's mirrored commits ({folder}) may be left on {remote}: {err}"
            )

    def after(self, watch: FinishedWatch):
        """``again(code)`` for :func:`~ddl_tf.cluster.rehearse.run_rehearsal`."""

        def again(code: int):
            code = 128 - code if code < 0 else code
            relaunch = self(watch) if watch.relaunchable(code) else None
            if relaunch is not None:
                watch.reset()  # as run_elastic does: the relaunch starts afresh
            return relaunch

        return again

    def __call__(self, watch: FinishedWatch) -> tuple[list[str], dict[str, str]] | None:
        from ddl_tf.launch.elastic import find_hosts, make_elastic

        new = [h for h in watch.dropped_hosts if h not in self.lost]
        if not new:
            _say(
                f"ddlrun: {watch.why_dropped(watch.dropped_hosts)}; no relaunch: this job "
                "dropped that host before (each relaunch must drop a new host)"
            )
            return None
        self.lost += new
        why = watch.why_dropped(new)
        try:
            hosts = find_hosts(self.settings, host_list(self.hosts), exclude=self.lost)
            plan = copy.deepcopy(self.base)
            plan.np = 0  # as many ranks as the surviving hosts give (up to --max-np)
            make_elastic(plan, self.settings, hosts)
        except DDLError as err:
            _say(f"ddlrun: {why}; no relaunch: {err}")
            return None
        if self.spec is not None:
            from ddl_tf.cluster.mpi import rehearsal_plan

            rehearsal_plan(plan, self.spec, elastic=True)
        self.launched |= set(hosts)
        self.count += 1
        plan.env[env.DDL_ELASTIC_RESUMED] = str(self.count)
        plan.env[env.DDL_ELASTIC_LOST_HOSTS] = ",".join(self.lost)
        _say(
            f"ddlrun: {why}; relaunching the elastic job on "
            f"{','.join(f'{h}:{n}' for h, n in hosts.items())} ({plan.np} rank(s), relaunch "
            f"{self.count}), from the last commit the surviving ranks kept in host memory"
            + (" (if the job got that far)" if watch.not_started is not None else "")
        )
        mpirun, flavor, as_root = self.launcher
        child_env = child_environment(plan, as_root=as_root)
        if self.checks is not None:  # the relaunched ranks' own start-up check
            self.checks.close()
            if plan.np > 1:
                self.checks.open(plan, [h for h, n in hosts.items() for _ in range(n)], child_env)
        command = build_command(plan, mpirun, flavor=flavor, as_root=as_root)
        print("ddlrun: running: " + shlex.join(command), flush=True)
        return command, child_env


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
