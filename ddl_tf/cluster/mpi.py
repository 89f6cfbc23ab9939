"""Open MPI across the virtual nodes: the launch agent, the mpirun arguments, the job environment.

Open MPI starts one daemon per remote host through its remote-launch agent
(``ssh`` by default). The cluster's agent is a small shell script that,
instead of ssh, enters the node's network namespace (``ip netns exec``,
which also bind-mounts the node's ``/etc/hosts``) and a fresh UTS namespace
carrying the node's hostname, then runs the daemon's command there. So Open
MPI sees ``N`` distinct hosts, uses shared memory (``sm``) between ranks of
one node and TCP between nodes, and both its TCP transports are restricted
to the cluster subnet (the veth links).

Example:
    >>> from ddl_tf.cluster.mpi import mpirun_command
    >>> from ddl_tf.cluster.spec import ClusterSpec
    >>> spec = ClusterSpec(nodes=2, prefix="ddlcdemo")
    >>> print(" ".join(mpirun_command(spec, ["python", "t.py"], ranks_per_node=2, mpirun="mpirun")))
    mpirun -np 4 --host node0:2,node1:2 --bind-to none --map-by slot --mca plm_rsh_agent /run/ddl_tf_cluster/ddlcdemo/agent.sh --mca btl self,sm,tcp --mca btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24 --mca btl_tcp_links 4 --mca mpi_yield_when_idle 1 --mca btl_tcp_eager_limit 33619968 --mca btl_tcp_rndv_eager_limit 33619968 --mca btl_tcp_max_send_size 33619968 python t.py
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from ddl_tf import env as ddl_env
from ddl_tf.cluster.spec import ClusterSpec
from ddl_tf.launch.command import LaunchPlan, find_mpirun

__all__ = [
    "rehearsal_plan",
    "TCP_EAGER_BYTES",
    "agent_script",
    "eager_arguments",
    "mca_arguments",
    "mpirun_command",
    "job_environment",
    "host_list",
]

TCP_EAGER_BYTES = (32 << 20) + (64 << 10)
"""Eager limit (and largest fragment) of Open MPI's TCP transport in the cluster.

Above its eager limit (64 KiB by default) Open MPI sends a message by
rendezvous: a first fragment, an acknowledgement from the receiver, then the
rest. When two ranks exchange large messages (every allreduce step between
two nodes does) and both directions share one TCP connection, each side's
acknowledgement is queued behind that side's own bulk data: one direction
waits for the other to finish, and the exchange takes up to twice as long.
Whether the two directions share a connection is decided when connections
open, so whole jobs were slow or fast: a 16 MiB hierarchical allreduce on
2 nodes x 2 ranks at 62.5 Mbit/s took 1.09-1.16x of the link bound in some
jobs and 1.27-1.6x in others (``ss`` inside the namespaces showed the slow
pair's one connection alternating directions). Sent eagerly, no message
waits for an acknowledgement: with an 8 MiB limit 6 of 6 jobs took
1.085-1.11x, MPI_Allreduce too (1.55x before); a 64 MiB allreduce (larger
messages) still had one slow job in 3 at 8 MiB and none in 3 at 32 MiB
(1.10-1.12x). Each rank's peak memory grows by about the limit (99 -> 107
MiB with 8 MiB for a 16 MiB buffer; 243 -> 275 MiB with 32 MiB for 64 MiB).
Messages above the limit still use the rendezvous protocol. (Scratch runs
measured while choosing the value; the cluster benchmark's JSON has the
figures the docs quote.)
"""


def agent_script(spec: ClusterSpec, tools) -> str:
    """Text of the remote-launch agent: ``agent HOST COMMAND...`` runs COMMAND on node HOST.

    Args:
        spec: The cluster (hostnames, addresses and namespaces of the nodes).
        tools: The :class:`~ddl_tf.cluster.netns.Tools` (paths of ``ip`` and ``unshare``).

    Returns:
        A ``/bin/sh`` script; an unknown HOST makes it exit 255.
    """
    cases = []
    for host, addr, ns in zip(spec.hostnames, spec.addresses, spec.node_namespaces, strict=True):
        cases.append(f"  {host}|{addr}) ns={ns}; name={host} ;;")
    return "\n".join(
        [
            "#!/bin/sh",
            f"# ddl_tf rehearsal cluster {spec.prefix}: Open MPI's remote-launch agent.",
            "# Instead of ssh, enter the node's network namespace and a new UTS namespace",
            "# with the node's hostname, then run the daemon command Open MPI passes.",
            'host="$1"',
            "shift",
            'case "$host" in',
            *cases,
            f"  *) echo \"ddl_tf cluster {spec.prefix}: unknown host '$host' "
            f'(nodes: {", ".join(spec.hostnames)})" >&2; exit 255 ;;',
            "esac",
            f'exec {shlex.quote(tools.ip)} netns exec "$ns" {shlex.quote(tools.unshare)} --uts '
            '/bin/sh -c \'hostname "$0" && exec /bin/sh -c "$1"\' "$name" "$*"',
            "",
        ]
    )


def host_list(spec: ClusterSpec, ranks_per_node: int) -> str:
    """``node0:L,node1:L,...`` for ``--host``/``-H``.

    Args:
        spec: The cluster (its hostnames).
        ranks_per_node: Slots given to each node.

    Returns:
        The comma-separated host list.
    """
    return ",".join(f"{h}:{ranks_per_node}" for h in spec.hostnames)


def mca_arguments(spec: ClusterSpec, shared_memory: bool = True) -> list[str]:
    """Open MPI options that make a job use the cluster: agent, transports, interfaces.

    ``btl_tcp_links 4`` opens four TCP connections per pair of ranks on
    different nodes: with one, Open MPI moved only 0.47 Gbit/s each way over a
    1 Gbit/s link when both ranks send at once (an allreduce does), while one
    Python socket carried 0.93 each way; with 2 or 4 links it reached 0.9.
    ``mpi_yield_when_idle`` makes waiting ranks yield the CPU: with more ranks
    than cores, busy-polling ranks otherwise starve the ones doing the work.
    The three TCP fragment limits are raised to :data:`TCP_EAGER_BYTES`, so
    messages up to 32 MiB go out eagerly, without the rendezvous handshake
    (see that constant for what the handshake cost).

    An elastic job passes ``shared_memory=False``: under Open MPI's fault
    tolerance a failed peer hangs the survivors with the shared-memory
    transport (:data:`ddl_tf.launch.elastic.ULFM_ARGS`), so ranks of one
    node talk over TCP too.

    Args:
        spec: The cluster (its agent script path and subnet).
        shared_memory: Whether ranks of one node use the ``sm`` transport.

    Returns:
        ``--mca NAME VALUE`` triples, flattened, for the mpirun command line.
    """
    return [
        "--mca",
        "plm_rsh_agent",
        str(spec.agent_path),
        "--mca",
        "btl",
        "self,sm,tcp" if shared_memory else "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        spec.subnet,
        "--mca",
        "oob_tcp_if_include",
        spec.subnet,
        "--mca",
        "btl_tcp_links",
        "4",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        *eager_arguments(),
    ]


def eager_arguments(limit: int = TCP_EAGER_BYTES) -> list[str]:
    """``--mca`` options sending TCP messages of up to ``limit`` bytes eagerly.

    Open MPI's limits count the fragment's protocol header, so ``limit``
    should exceed the largest message by a little (:data:`TCP_EAGER_BYTES`
    adds 64 KiB). The eager limit may not exceed the largest fragment, so
    all three are set together.

    Args:
        limit: Bytes per eager fragment.

    Returns:
        ``--mca NAME VALUE`` triples, flattened.

    Example:
        >>> eager_arguments(1 << 20)[:3]
        ['--mca', 'btl_tcp_eager_limit', '1048576']
    """
    names = ("btl_tcp_eager_limit", "btl_tcp_rndv_eager_limit", "btl_tcp_max_send_size")
    return [part for name in names for part in ("--mca", name, str(limit))]


def mpirun_command(
    spec: ClusterSpec,
    program: Sequence[str],
    *,
    ranks_per_node: int = 1,
    mpirun: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The full mpirun argument list for ``program`` on every node of ``spec``.

    Args:
        spec: The cluster the job runs on.
        program: The command every rank runs.
        ranks_per_node: Ranks on each virtual node.
        mpirun: The mpirun to use (default: :func:`ddl_tf.launch.command.find_mpirun`).
        extra_args: More mpirun arguments, inserted before ``program``.

    Returns:
        The argument list (never a shell string).

    Raises:
        LaunchError: ``mpirun`` is None and no mpirun is found.
    """
    if mpirun is None:
        mpirun = find_mpirun()
    return [
        mpirun,
        "-np",
        str(spec.nodes * ranks_per_node),
        "--host",
        host_list(spec, ranks_per_node),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        *mca_arguments(spec),
        *extra_args,
        *program,
    ]


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for mpirun in the cluster: ``environ`` (default: ours), root allowed if root.

    The remote daemons are started from mpirun's own environment by the
    agent, so every rank inherits it (no ``-x`` needed inside the cluster).

    Args:
        environ: The base environment; None takes this process's.

    Returns:
        A new dict; the ``OMPI_ALLOW_RUN_AS_ROOT*`` pair is added when running as root.
    """
    child = dict(ddl_env.snapshot() if environ is None else environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        child[ddl_env.OMPI_ALLOW_RUN_AS_ROOT] = "1"
        child[ddl_env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM] = "1"
    return child


def rehearsal_plan(plan: LaunchPlan, spec: ClusterSpec, elastic: bool) -> None:
    """Add the rehearsal cluster's Open MPI options to ``plan`` (mpirun runs inside node0)."""
    plan.mpi_args = mca_arguments(spec, shared_memory=not elastic) + plan.mpi_args
    if elastic:
        plan.env[ddl_env.DDL_ELASTIC_LAUNCH_HOSTS] = spec.hostnames[0]
