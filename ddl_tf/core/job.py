"""One membership of the job: its communicator, topology, engine and host names.

A :class:`Job` is what ``init()`` builds and what every collective runs on
(through its :attr:`Job.engine`). A fixed-size job has one ``Job`` from
``init()`` to ``shutdown()``. An elastic job (``ddlrun --min-np``) gets a
new one each time its membership changes (:mod:`ddl_tf.membership.reform`):
the old one is *abandoned* (its communicators revoked, so every rank still
blocked in one of them returns with an error instead of waiting for a dead
peer) and nothing of it is used again; the new one is built over the
re-formed communicator with the same calls as at ``init()``.

Building a job is collective: every member calls :meth:`Job.create` on the
same communicator.

Example (one process):
    >>> from mpi4py import MPI
    >>> from ddl_tf.config import DDLConfig
    >>> from ddl_tf.core.job import Job
    >>> job = Job.create(MPI.COMM_WORLD.Dup(), DDLConfig(), host="node0")
    >>> job.engine.size, job.hosts, job.generation
    (1, ('node0',), 0)
    >>> job.close()
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ddl_tf.config import DDLConfig
from ddl_tf.core.algorithms.selection import AutoPolicy, load_policy
from ddl_tf.core.collectives.engine import Engine
from ddl_tf.core.numerics import mpi
from ddl_tf.core.topology import comms
from ddl_tf.core.topology.layout import Topology
from ddl_tf.errors import ConfigError

__all__ = ["Job", "spawned_parent"]

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """The ranks training together now, and what they communicate with.

    Attributes:
        comm: The communicator the job was built over (``COMM_WORLD``, a
            subset of it, or a re-formed elastic communicator); owned here.
        engine: The collectives' engine over duplicates of :attr:`comm`.
        hosts: Each rank's host name (the launcher's ``HOROVOD_HOSTNAME``
            when it gives one), indexed by rank.
        generation: How many membership changes came before this job (0 at
            ``init()``).
        elastic: Whether a failed peer raises
            :class:`~ddl_tf.errors.HorovodInternalError` (elastic jobs) or
            leaves the engine failed (fixed jobs abort).
        owns_comm: Whether :meth:`close` frees :attr:`comm`.
        process_sets: The registered process sets by ``process_set_id``
            (the global set, 0, is implicit); see :mod:`ddl_tf.core.process_sets`.
        dynamic_sets: Whether sets may be added after ``init()``.
    """

    comm: Any
    engine: Engine
    hosts: tuple[str, ...]
    generation: int = 0
    elastic: bool = False
    owns_comm: bool = True
    process_sets: dict[int, Any] = field(default_factory=dict)
    dynamic_sets: bool = False

    @classmethod
    def create(
        cls,
        comm: Any,
        config: DDLConfig,
        *,
        policy: AutoPolicy | None = None,
        host: str | None = None,
        generation: int = 0,
        elastic: bool = False,
        owns_comm: bool = True,
    ) -> Job:
        """Collectively build a job over ``comm`` (every rank of ``comm`` calls it).

        Args:
            comm: The job's communicator; the job owns it from now on.
            config: Settings every rank must share.
            policy: The table behind ``auto`` (default: ``config``'s).
            host: This rank's host name (default: the launcher's, else MPI's).
            generation: Membership changes before this one.
            elastic: Turn peer failures into ``HorovodInternalError``.
            owns_comm: Free ``comm`` at :meth:`close` (False for ``COMM_WORLD``
                and for a communicator the user passed to ``init()``).

        Returns:
            The job, with its engine ready for collectives.

        Raises:
            ConfigError: Ranks were started with different settings.
            TopologyError: The topology file or forced algorithm does not fit.
        """
        policy = policy if policy is not None else load_policy(config.auto_policy_file)
        topology = comms.detect_topology(comm, config, elastic=elastic)
        name = host or mpi.load().Get_processor_name()
        hosts, generation = _check_agreement(
            comm, config, policy.digest(), topology, name, generation
        )
        communicators = comms.build_communicators(comm, topology)
        engine = Engine(communicators, topology, config, policy, host=name, elastic=elastic)
        return cls(comm, engine, tuple(hosts), generation, elastic, owns_comm)

    @property
    def size(self) -> int:
        """Ranks in the job."""
        return self.engine.size

    @property
    def rank(self) -> int:
        """This rank's index in the job."""
        return self.engine.rank

    def forget_process_sets(self) -> None:
        """Unregister every process set of this job (their ``process_set_id`` becomes None)."""
        for process_set in self.process_sets.values():
            process_set.process_set_id = None
        self.process_sets.clear()

    def close(self) -> None:
        """Collectively shut the engine down and free the job's communicator."""
        try:
            self.engine.shutdown()
        finally:
            if self.owns_comm and self.engine.state.closed:
                self.comm.Free()

    def abandon(self) -> None:
        """Give up this membership after a peer failed (local: no rank waits for another).

        Every communicator of the job is revoked, so a rank still inside a
        collective on any of them returns with ``MPI_ERR_REVOKED``; then the
        engine refuses every later collective. The job communicator itself
        stays usable for ``Shrink`` (which survivors call next).
        """
        self.engine.revoke()
        try:
            self.comm.Revoke()
        except mpi.load().Exception as err:  # already revoked by a peer: nothing to do
            logger.debug("job communicator revoke: %s", err)


def _check_agreement(
    comm: Any, config: DDLConfig, policy_digest: str, topo: Topology, host: str, generation: int
) -> tuple[list[str], int]:
    """Refuse ranks started with different settings; return every rank's host, and the generation.

    The generation is the highest any rank brings: ranks spawned into a
    growing job start at 0 and learn the job's count of membership changes here.
    """
    mine = (
        config.fingerprint(),
        policy_digest,
        topo.levels,
        tuple(sorted(topo.algorithms.items())),
    )
    everyone = comm.allgather((mine, host, generation))
    odd = [r for r, (theirs, _, _) in enumerate(everyone) if theirs != everyone[0][0]]
    if odd:
        raise ConfigError(
            f"Ranks were started with different ddl_tf settings: rank(s) {odd} differ from "
            f"rank 0 ({everyone[0][0]} vs {everyone[odd[0]][0]}: algorithm/fusion/compression/"
            "checks fingerprint, auto policy, topology levels). Export the same DDL_* variables "
            "to every rank (ddlrun does; with mpirun use -x DDL_...)."
        )
    return [h for _, h, _ in everyone], max(g for _, _, g in everyone)


def spawned_parent() -> Any:
    """The intercommunicator to the job that spawned this process, or None (launched by mpirun)."""
    MPI = mpi.load()
    parent = MPI.Comm.Get_parent()
    return None if parent == MPI.COMM_NULL else parent
