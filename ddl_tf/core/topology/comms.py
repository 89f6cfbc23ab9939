"""Find the topology of a running job through MPI, and build its sub-communicators.

Nodes are the shared-memory domains MPI reports
(``Split_type(COMM_TYPE_SHARED)``), named after their hosts (the launcher's
host name when horovodrun or Slurm provides one, else MPI's processor name);
if the split fails, the host names alone. ``DDL_PSEUDO_NODES`` overrides both so that
hierarchical code paths run for real on one machine. What the launcher says
(Horovod, Open MPI, Slurm variables) is cross-checked and disagreements are
logged. All of this runs once, in ``init()``; the object exchange here uses
pickling, which is fine off the hot path.

Every rank must call :func:`detect_topology` and :func:`build_communicators`
(they are collective).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddl_tf.config import DDLConfig
from ddl_tf.core.numerics import mpi
from ddl_tf.core.topology.layout import Topology, launcher_layout, pseudo_node_names
from ddl_tf.core.topology.topology_file import load_topology_file
from ddl_tf.errors import TopologyError

__all__ = ["Communicators", "detect_topology", "build_communicators"]

logger = logging.getLogger(__name__)


@dataclass
class Communicators:
    """The communicators one rank uses.

    Attributes:
        data: Duplicate of the job communicator that carries tensor data.
        control: Duplicate that carries descriptors (mismatch/stall checks).
        node: Ranks of this rank's node.
        cross: Ranks with this rank's local rank (one per node).
        steps: ``(level, communicator)`` per hierarchical step, ending with ``world``.
    """

    data: Any
    control: Any
    node: Any
    cross: Any
    steps: list[tuple[str, Any]]

    def all(self) -> list[Any]:
        """Every distinct communicator, each once."""
        seen: dict[int, Any] = {}
        for comm in [self.data, self.control, self.node, self.cross, *(c for _, c in self.steps)]:
            seen.setdefault(id(comm), comm)
        return list(seen.values())

    def free(self) -> None:
        """Free every communicator (collective; call on all ranks)."""
        for comm in self.all():
            comm.Free()


def detect_topology(
    comm: Any,
    config: DDLConfig,
    environ: Mapping[str, str] | None = None,
    elastic: bool = False,
) -> Topology:
    """Collectively work out which rank runs where.

    Args:
        comm: The job's communicator (usually ``MPI.COMM_WORLD``).
        config: Provides ``pseudo_nodes`` and ``topology_file``.
        environ: Environment to read launcher variables from.
        elastic: An elastic job's communicator: its nodes are the hosts as
            discovery names them, not MPI's shared-memory domains (ranks a
            growing job joins through rank 0 know too little of each other's
            placement for ``MPI_Comm_split_type``, which then ran different
            steps on different ranks and hung), and no cross-check with the
            launcher's layout (ranks move after a membership change).

    Returns:
        The :class:`Topology` of this rank.

    Raises:
        TopologyError: The topology file does not fit the job.
        ConfigError: ``DDL_PSEUDO_NODES`` is malformed.
    """
    MPI = mpi.load()
    if config.pseudo_nodes:
        names = pseudo_node_names(config.pseudo_nodes, comm.size)
        source = "DDL_PSEUDO_NODES"
    else:
        # a launcher that names the host (horovodrun, Slurm) wins over MPI's processor name
        host = str(launcher_layout(environ).get("hostname") or MPI.Get_processor_name())
        leader, source = None, "hostnames"
        if not elastic:
            try:
                shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
                leader = shared.allreduce(comm.rank, op=MPI.MIN)
                shared.Free()
                source = "MPI shared-memory domains"
            except MPI.Exception:
                pass
        pairs = comm.allgather((host, leader))
        names = _node_names(pairs)
        if not elastic:
            _cross_check(comm, names, environ)
    spec = load_topology_file(config.topology_file) if config.topology_file else None
    return Topology.from_node_names(names, comm.rank, spec, source=source)


def _node_names(pairs: list[tuple[str, int | None]]) -> list[str]:
    """Name each rank's node after its host, disambiguating hosts with several domains."""
    domains_per_host: dict[str, set] = {}
    for host, leader in pairs:
        domains_per_host.setdefault(host, set()).add(leader if leader is not None else host)
    names = []
    for host, leader in pairs:
        if leader is None or len(domains_per_host[host]) == 1:
            names.append(host)
        else:
            names.append(f"{host}#{leader}")
    return names


def _cross_check(comm: Any, names: list[str], environ: Mapping[str, str] | None) -> None:
    layout = launcher_layout(environ)
    if not layout:
        return
    if layout.get("size", comm.size) != comm.size or layout.get("rank", comm.rank) != comm.rank:
        logger.warning(
            "%s reports rank %s of %s but MPI says rank %d of %d; ddl_tf follows MPI",
            layout["launcher"],
            layout.get("rank"),
            layout.get("size"),
            comm.rank,
            comm.size,
        )
        return
    topo = Topology.from_node_names(names, comm.rank)
    for key in ("local_rank", "local_size"):
        if key in layout and layout[key] != getattr(topo, key):
            logger.warning(
                "%s reports %s=%s but MPI's shared-memory layout gives %s; ddl_tf follows MPI",
                layout["launcher"],
                key,
                layout[key],
                getattr(topo, key),
            )


def build_communicators(comm: Any, topology: Topology) -> Communicators:
    """Create the data, control, node, cross and per-step communicators (collective).

    Args:
        comm: The job's communicator.
        topology: The topology from :func:`detect_topology`.

    Returns:
        The communicators (every rank must call this, in the same order).
    """
    if comm.rank != topology.rank or comm.size != topology.size:
        raise TopologyError(
            f"The topology describes rank {topology.rank} of {topology.size} but the "
            f"communicator is rank {comm.rank} of {comm.size}."
        )
    data = comm.Dup()
    control = comm.Dup()
    node_table = topology.groups[topology.levels.index("node")]
    node = comm.Split(node_table[comm.rank], key=comm.rank)
    cross = comm.Split(topology.local_rank, key=comm.rank)
    steps = [(s.level, comm.Split(s.colors[comm.rank], key=comm.rank)) for s in topology.steps()]
    return Communicators(data=data, control=control, node=node, cross=cross, steps=steps)
