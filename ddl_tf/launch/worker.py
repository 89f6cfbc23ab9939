"""Start one rank of an elastic job: set what horovodrun sets, then become the program.

``ddlrun --min-np`` runs ``python -m ddl_tf.launch.worker --hosts H1:2,H2:2
--program '[...]'`` under mpirun: each rank takes its host from the launch's
host list by its MPI rank (ranks fill hosts in order, as ``--map-by slot``
places them), so that hosts are the discovery script's names even when
several of them are this machine (``localhost`` and ``127.0.0.1`` are two
hosts, as in Horovod's elastic tests). A growing job spawns it with
``--hostname H --rank N`` and the settings to pass on (``--env K=V``).

It sets ``HOROVOD_HOSTNAME``, ``HOROVOD_RANK`` (the rank at launch),
``HOROVOD_ELASTIC=1`` and ``DDL_ELASTIC=1``, then replaces itself with the
program (``exec``: same process, so MPI sees the rank it started).

Example:
    >>> from ddl_tf.launch.worker import host_of_rank
    >>> [host_of_rank("localhost:2,127.0.0.1:2", r) for r in range(4)]
    ['localhost', 'localhost', '127.0.0.1', '127.0.0.1']
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ddl_tf import env
from ddl_tf.errors import LaunchError
from ddl_tf.launch.hosts import parse_host_list

__all__ = ["host_of_rank", "main"]


def host_of_rank(hosts: str, rank: int) -> str:
    """The host of ``rank`` when ranks fill ``hosts`` (``h:slots,...``) in order.

    Raises:
        LaunchError: ``rank`` is beyond the hosts' slots.
    """
    seen = 0
    for host in parse_host_list(hosts):
        seen += host.slots
        if rank < seen:
            return host.name
    raise LaunchError(f"rank {rank} has no slot among the launch's hosts {hosts}")


def main(argv: list[str] | None = None) -> int:
    """Set the rank's variables and ``exec`` the program (returns only on error)."""
    parser = argparse.ArgumentParser(prog="python -m ddl_tf.launch.worker")
    parser.add_argument("--hosts", help="host:slots,... of the launch, in rank order")
    parser.add_argument("--hostname", help="this rank's host (spawned ranks)")
    parser.add_argument("--rank", type=int, help="this rank's rank at launch (spawned ranks)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE to set")
    parser.add_argument("--program", required=True, help="the program, as a JSON list")
    args = parser.parse_args(argv)
    variables = dict(item.split("=", 1) for item in args.env)
    if args.hostname is not None:
        host, rank = args.hostname, args.rank if args.rank is not None else 0
    else:
        rank_text = env.get(env.OMPI_COMM_WORLD_RANK) or env.get(env.PMI_RANK) or "0"
        rank = int(rank_text)
        host = host_of_rank(args.hosts or "localhost:1", rank)
    variables.update(
        {
            env.HOROVOD_HOSTNAME: host,
            env.HOROVOD_RANK: str(rank),
            env.HOROVOD_ELASTIC: "1",
            env.DDL_ELASTIC: "1",
            env.DDL_ELASTIC_COMMAND: args.program,
        }
    )
    program = json.loads(args.program)
    sys.stdout.flush()
    os.execvpe(program[0], program, {**env.snapshot(), **variables})
    return 1  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
