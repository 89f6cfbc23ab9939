"""``python -m ddl_tf.cluster``: run, probe, list and clean up rehearsal clusters.

Usage::

    python -m ddl_tf.cluster run --nodes 2 --ranks-per-node 2 --link 1gbit -- python t.py
    python -m ddl_tf.cluster probe --nodes 2 --link 1gbit     # TCP throughput of a link
    python -m ddl_tf.cluster status                           # clusters on this machine
    python -m ddl_tf.cluster cleanup --stale                  # clusters whose owner died
    python -m ddl_tf.cluster cleanup --prefix ddlc1a2b3c      # one cluster by prefix

``run`` starts a plain MPI job (any program; for ddl_tf jobs ``ddlrun
--rehearse N`` adds ddlrun's settings and checks). Every command removes the
cluster it created when it ends, however it ends, except when killed with
SIGKILL: ``cleanup --stale`` removes such leftovers.

Exit codes: 0 success, 2 bad arguments, 3 this machine cannot host a cluster
(not root, tools or netem missing), 4 a cluster operation failed, otherwise
the exit code of the program ``run`` started.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from ddl_tf.cluster.cluster import Cluster
from ddl_tf.cluster.errors import ClusterError, ClusterUnavailableError, NetemUnavailableError
from ddl_tf.cluster.registry import cleanup, list_clusters
from ddl_tf.cluster.spec import ClusterSpec
from ddl_tf.errors import ConfigError

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_USAGE", "EXIT_UNAVAILABLE", "EXIT_CLUSTER"]

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_CLUSTER = 0, 2, 3, 4
EXAMPLE = "python -m ddl_tf.cluster run --nodes 2 --ranks-per-node 2 --link 1gbit -- python t.py"


def _spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="virtual nodes (default 2)")
    parser.add_argument(
        "--link", default="1gbit", help="link rate per direction (default 1gbit; none)"
    )
    parser.add_argument("--latency", help="added node-to-node latency, e.g. 100us (needs netem)")
    parser.add_argument("--prefix", help="namespace name prefix (default: ddlc + random hex)")
    parser.add_argument("--subnet", default="10.213.0.0/24", help="private subnet of the nodes")
    parser.add_argument("--mtu", type=int, default=1500, help="link MTU (default 1500)")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m ddl_tf.cluster`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m ddl_tf.cluster",
        description="Rehearse multi-node MPI jobs on one machine (network namespaces, tc).",
        epilog=f"example: {EXAMPLE}\nexit codes: 0 ok, 2 bad arguments, 3 cannot host a "
        "cluster here, 4 cluster operation failed, otherwise the program's exit code.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an MPI program across the virtual nodes")
    _spec_arguments(run)
    run.add_argument("--ranks-per-node", type=int, default=1, help="ranks per node (default 1)")
    run.add_argument("--timeout", type=float, default=3600.0, help="kill the job after S seconds")
    run.add_argument("--mpi-args", default="", help="extra mpirun arguments (one string)")
    run.add_argument("program", nargs=argparse.REMAINDER, help="command every rank runs")
    probe = sub.add_parser("probe", help="measure the TCP throughput between node0 and node1")
    _spec_arguments(probe)
    probe.add_argument("--mib", type=int, default=64, help="MiB per direction (default 64)")
    sub.add_parser("status", help="list rehearsal clusters on this machine (JSON)")
    clean = sub.add_parser("cleanup", help="remove leftover clusters")
    which = clean.add_mutually_exclusive_group(required=True)
    which.add_argument("--prefix", help="the cluster with this prefix")
    which.add_argument("--stale", action="store_true", help="every cluster whose owner died")
    return parser


def _spec(args: argparse.Namespace) -> ClusterSpec:
    link = None if str(args.link).lower() in ("none", "unlimited") else args.link
    extra = {"prefix": args.prefix} if args.prefix else {}
    return ClusterSpec(
        nodes=args.nodes, link=link, latency=args.latency, subnet=args.subnet, mtu=args.mtu, **extra
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring).

    Args:
        argv: Arguments without the program name; None reads ``sys.argv``.

    Returns:
        ``EXIT_OK`` (0), the job's exit code for ``run``, ``EXIT_USAGE`` (2),
        ``EXIT_UNAVAILABLE`` (3) or ``EXIT_CLUSTER`` (4).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code else EXIT_OK
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        if args.command == "status":
            print(json.dumps(list_clusters(), indent=1))
            return EXIT_OK
        if args.command == "cleanup":
            removed = cleanup(args.prefix, stale=args.stale)
            print(json.dumps({"removed": removed}))
            return EXIT_OK
        spec = _spec(args)
        if args.command == "probe":
            from ddl_tf.cluster.probe import link_throughput

            if spec.nodes < 2:
                raise ConfigError("probe needs --nodes 2 or more.")
            with Cluster(spec) as cluster:
                gbps = link_throughput(cluster, 0, 1, nbytes=args.mib << 20)
            print(json.dumps({"link": spec.link, "mtu": spec.mtu, "payload_Gbps": gbps}))
            return EXIT_OK
        program = args.program[1:] if args.program[:1] == ["--"] else args.program
        if not program:
            raise ConfigError(f"run needs a program after --; e.g. {EXAMPLE}")
        with Cluster(spec) as cluster:
            print(spec.describe(), file=sys.stderr, flush=True)
            result = cluster.mpirun(
                program,
                ranks_per_node=args.ranks_per_node,
                timeout=args.timeout,
                extra_args=args.mpi_args.split(),
                capture=False,
            )
        return result.returncode if result.returncode >= 0 else 128 - result.returncode
    except (ClusterUnavailableError, NetemUnavailableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
