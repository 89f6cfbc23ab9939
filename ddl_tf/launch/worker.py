"""Start one rank of an elastic job: set what horovodrun sets, then become the program.

``ddlrun --min-np`` runs ``python -m ddl_tf.launch.worker --hosts H1:2,H2:2
--program '[...]'`` under mpirun: each rank takes its host from the launch's
host list by its MPI rank (ranks fill hosts in order, as ``--map-by slot``
places them), so that hosts are the discovery script's names even when
several of them are this machine (``localhost`` and ``127.0.0.1`` are two
hosts, as in Horovod's elastic tests). A growing job spawns it with
``--hostname H --rank N`` and the settings to pass on (``--env K=V``).

It sets what horovodrun sets (``HOROVOD_HOSTNAME``, ``HOROVOD_RANK``, the
rank at launch, and at launch ``HOROVOD_SIZE`` and the local and cross rank
and size), ``HOROVOD_ELASTIC=1`` and ``DDL_ELASTIC=1``, then replaces itself with the
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

__all__ = ["host_of_rank", "layout_of_rank", "main"]


def host_of_rank(hosts: str, rank: int) -> str:
    """The host of ``rank`` when ranks fill ``hosts`` (``h:slots,...``) in order.

    Raises:
        LaunchError: ``rank`` is beyond the hosts' slots.
    """
    return layout_of_rank(hosts, rank, rank + 1)[env.HOROVOD_HOSTNAME]


def layout_of_rank(hosts: str, rank: int, size: int) -> dict[str, str]:
    """What horovodrun tells a rank at launch: its host, local and cross rank and size.

    Args:
        hosts: ``host:slots,...`` in rank order.
        rank: The rank.
        size: Ranks launched (they fill the hosts in order).

    Example:
        >>> third = layout_of_rank("a:2,b:2", 2, 3)
        >>> [third[k] for k in ("HOROVOD_HOSTNAME", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
        ...                     "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")]
        ['b', '0', '1', '1', '2']

    Raises:
        LaunchError: ``rank`` is beyond the hosts' slots.
    """
    filled: list[tuple[str, int, int]] = []
    start = 0
    for host in parse_host_list(hosts):
        count = max(0, min(host.slots, size - start))
        if count:
            filled.append((host.name, start, count))
        start += host.slots
    for index, (name, first, count) in enumerate(filled):
        if first <= rank < first + count:
            local = rank - first
            return {
                env.HOROVOD_HOSTNAME: name,
                env.HOROVOD_RANK: str(rank),
                env.HOROVOD_SIZE: str(size),
                env.HOROVOD_LOCAL_RANK: str(local),
                env.HOROVOD_LOCAL_SIZE: str(count),
                env.HOROVOD_CROSS_RANK: str(index),
                env.HOROVOD_CROSS_SIZE: str(sum(1 for _, _, c in filled if c > local)),
            }
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
    if args.hostname is not None:  # spawned into a running job: its size is the job's
        rank = args.rank if args.rank is not None else 0
        variables.update({env.HOROVOD_HOSTNAME: args.hostname, env.HOROVOD_RANK: str(rank)})
    else:
        rank = int(env.get(env.OMPI_COMM_WORLD_RANK) or env.get(env.PMI_RANK) or "0")
        size = int(env.get(env.OMPI_COMM_WORLD_SIZE) or env.get(env.PMI_SIZE) or "1")
        variables.update(layout_of_rank(args.hosts or "localhost:1", rank, size))
    variables.update(
        {
            env.HOROVOD_ELASTIC: "1",
            env.DDL_ELASTIC: "1",
            env.DDL_ELASTIC_COMMAND: args.program,
        }
    )
    program = json.loads(args.program)
    environ = {**env.snapshot(), **variables}
    if args.hostname is not None:  # a newcomer joins the running job: it resumes nothing,
        environ.pop(env.DDL_ELASTIC_RESUMED, None)
        # and reports to no start-up check (ddlrun's is for the launch's ranks; the spawn
        # that started this one bounds its start: DDL_ELASTIC_SPAWN_TIMEOUT)
        environ.pop(env.DDL_START_ADDR, None)
    sys.stdout.flush()
    os.execvpe(program[0], program, environ)
    return 1  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
