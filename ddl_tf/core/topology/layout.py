"""The ``Topology`` value: which ranks share which level of the machine.

A topology is built from one node name per rank (found through MPI by
:mod:`ddl_tf.core.topology.comms`, or faked with ``DDL_PSEUDO_NODES``), optionally
refined by a :class:`~ddl_tf.core.topology.topology_file.TopologySpec`. It is pure
data, so any layout can be tested on one machine without MPI. What a
launcher (Horovod, Open MPI, Slurm, MPICH) says about a rank's place is read
here too, from its variables (:func:`launcher_layout`), for ``init()`` to
name the host and cross-check MPI's layout.

Hierarchical allreduce walks :meth:`Topology.steps`: at each level a rank
reduce-scatters with the ranks that share its group *and* hold the same shard
from the levels below; the last step (``world``) allreduces the shard across
the outermost groups among ranks with the same position.

Example:
    >>> from ddl_tf.core.topology.layout import Topology
    >>> topo = Topology.from_node_names(["a", "a", "b", "b"], rank=2)
    >>> topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size
    (0, 2, 1, 2)
    >>> [(s.level, s.size) for s in topo.steps()]
    [('node', 2), ('world', 2)]
    >>> topo.is_uniform
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddl_tf import env
from ddl_tf.core.topology.topology_file import TopologySpec
from ddl_tf.errors import ConfigError, TopologyError

__all__ = ["Topology", "Step", "pseudo_node_names", "launcher_layout", "launcher_hostname"]


@dataclass(frozen=True)
class Step:
    """One step of the hierarchical allreduce, as seen from every rank.

    Attributes:
        level: Level name, or ``"world"`` for the final cross-group allreduce.
        colors: For each rank, which communicator of this step it joins.
        size: Ranks per communicator (equal for all when the topology is uniform).
        algorithm: The step algorithm from the topology file, or None (default).
    """

    level: str
    colors: tuple[int, ...]
    size: int
    algorithm: str | None = None


@dataclass(frozen=True)
class Topology:
    """Ranks per level and the derived Horovod quantities for one rank.

    Attributes:
        rank: This process's rank in the job.
        node_names: Node name of every rank.
        levels: Level names, innermost first (always contains ``"node"``).
        groups: ``groups[level][r]`` is the group index of rank ``r`` at that level.
        algorithms: Step algorithms from the topology file (level name -> name).
        source: How nodes were identified (``shared-memory``, ``pseudo``, ...).
    """

    rank: int
    node_names: tuple[str, ...]
    levels: tuple[str, ...] = ("node",)
    groups: tuple[tuple[int, ...], ...] = ()
    algorithms: Mapping[str, str] = field(default_factory=dict)
    source: str = "given"

    def __post_init__(self) -> None:
        if not 0 <= self.rank < len(self.node_names):
            raise TopologyError(
                f"rank {self.rank} is outside a job of {len(self.node_names)} ranks."
            )
        if len(self.groups) != len(self.levels):
            raise TopologyError(
                f"Topology has {len(self.levels)} levels but {len(self.groups)} group tables."
            )

    # ------------------------------------------------------------------ builders

    @classmethod
    def from_node_names(
        cls,
        node_names: Sequence[str],
        rank: int,
        spec: TopologySpec | None = None,
        source: str = "given",
    ) -> Topology:
        """Build the topology of ``rank`` from every rank's node name.

        Args:
            node_names: One node name per rank, in rank order.
            rank: The rank this value describes.
            spec: Optional topology file adding levels around ``node``.
            source: How the names were obtained (shown by :meth:`describe`).

        Returns:
            The topology, as seen from ``rank``.

        Raises:
            TopologyError: The spec does not fit the layout (unknown node,
                node size not divisible by a split count, groups that do not nest).
        """
        spec = spec or TopologySpec()
        names = tuple(str(n) for n in node_names)
        node_ids = _canonical(names)
        local_index = _index_within(node_ids)
        local_sizes = _group_sizes(node_ids)
        node_at = spec.levels.index("node")
        tables: list[tuple[int, ...]] = []
        for level in spec.levels[:node_at]:
            blocks = spec.split[level]
            keys = []
            for r in range(len(names)):
                if local_sizes[node_ids[r]] % blocks:
                    raise TopologyError(
                        f"topology file {spec.source}: level {level!r} splits each node into "
                        f"{blocks} blocks, but node {names[r]!r} runs "
                        f"{local_sizes[node_ids[r]]} ranks. Use a split count that divides "
                        "the ranks per node."
                    )
                keys.append((node_ids[r], local_index[r] * blocks // local_sizes[node_ids[r]]))
            tables.append(_canonical(keys))
        tables.append(node_ids)
        previous = node_ids
        for level in spec.levels[node_at + 1 :]:
            group_names = [spec.group_of_node(level, n) for n in names]
            table = _canonical(group_names)
            _check_nesting(previous, table, level, spec.source)
            tables.append(table)
            previous = table
        return cls(
            rank=rank,
            node_names=names,
            levels=spec.levels,
            groups=tuple(tables),
            algorithms=dict(spec.algorithms),
            source=source,
        )

    # ------------------------------------------------------------------ queries

    @property
    def size(self) -> int:
        """Number of ranks in the job."""
        return len(self.node_names)

    def ranks_in_group(self, level: str, rank: int | None = None) -> tuple[int, ...]:
        """Ranks that share ``rank``'s group at ``level`` (``"world"`` is everyone).

        Args:
            level: A level of this topology, or ``"world"``.
            rank: The rank whose group to list; None for this process's rank.

        Returns:
            The ranks in ascending order, ``rank`` included.

        Raises:
            TopologyError: ``level`` is not a level of this topology.
        """
        rank = self.rank if rank is None else rank
        if level == "world":
            return tuple(range(self.size))
        table = self.groups[self._level_index(level)]
        return tuple(r for r in range(self.size) if table[r] == table[rank])

    def num_groups(self, level: str) -> int:
        """How many groups ``level`` has.

        Args:
            level: A level of this topology (``"node"``...).

        Returns:
            The number of distinct groups at that level.

        Raises:
            TopologyError: ``level`` is not a level of this topology.
        """
        return len(set(self.groups[self._level_index(level)]))

    @property
    def num_nodes(self) -> int:
        """Number of distinct nodes."""
        return self.num_groups("node")

    @property
    def local_rank(self) -> int:
        """Index of this rank among the ranks of its node (Horovod ``local_rank``)."""
        return self.ranks_in_group("node").index(self.rank)

    @property
    def local_size(self) -> int:
        """Ranks on this rank's node (Horovod ``local_size``)."""
        return len(self.ranks_in_group("node"))

    def _cross_ranks(self) -> tuple[int, ...]:
        local = self.local_rank
        return tuple(
            r for r in range(self.size) if self.ranks_in_group("node", r).index(r) == local
        )

    @property
    def cross_rank(self) -> int:
        """Index of this rank among ranks with the same local rank (Horovod ``cross_rank``)."""
        return self._cross_ranks().index(self.rank)

    @property
    def cross_size(self) -> int:
        """Ranks with this rank's local rank, i.e. nodes that have it (Horovod ``cross_size``)."""
        return len(self._cross_ranks())

    @property
    def is_homogeneous(self) -> bool:
        """Whether every node runs the same number of ranks."""
        return len(set(_group_sizes(self.groups[self._level_index("node")]).values())) == 1

    def steps(self) -> list[Step]:
        """The hierarchical allreduce steps, innermost first, ending with ``world``.

        Levels that do not change the grouping (one block per node, a rack per
        node, single-rank groups) are skipped. The list always ends with a
        ``world`` step; it has size 1 when everything shares one group.
        """
        positions: list[tuple[int, ...]] = [() for _ in range(self.size)]
        steps: list[Step] = []
        kept: list[tuple[str, tuple[int, ...]]] = []
        previous: tuple[int, ...] = tuple(range(self.size))  # singletons
        for level, table in zip(self.levels, self.groups, strict=True):
            if _same_partition(previous, table):
                if kept:  # same grouping as the level below: keep the outer name
                    kept[-1] = (level, table)
                continue
            kept.append((level, table))
            previous = table
        for level, table in kept:
            keys = [(table[r], positions[r]) for r in range(self.size)]
            colors = _canonical(keys)
            index = _index_within(colors)
            sizes = _group_sizes(colors)
            steps.append(Step(level, colors, max(sizes.values()), self.algorithms.get(level)))
            positions = [positions[r] + (index[r],) for r in range(self.size)]
        colors = _canonical(positions)
        sizes = _group_sizes(colors)
        steps.append(Step("world", colors, max(sizes.values()), self.algorithms.get("world")))
        return steps

    @property
    def is_uniform(self) -> bool:
        """Whether every step's communicators have equal sizes (needed by hierarchical)."""
        return all(len(set(_group_sizes(s.colors).values())) == 1 for s in self.steps())

    def describe(self) -> str:
        """A few human-readable lines: nodes, their ranks, and the allreduce steps."""
        lines = [
            f"{self.size} rank(s) on {self.num_nodes} node(s) (nodes from {self.source}); "
            f"levels inner to outer: {', '.join(self.levels)}"
        ]
        node_table = self.groups[self._level_index("node")]
        for node in sorted(set(node_table)):
            ranks = [r for r in range(self.size) if node_table[r] == node]
            lines.append(f"  node {self.node_names[ranks[0]]}: ranks {_ranges(ranks)}")
        parts = [f"{s.level}({s.size})" for s in self.steps() if s.size > 1]
        if not self.is_uniform:
            lines.append("  hierarchical allreduce: unavailable (groups of unequal size)")
        elif len(parts) > 1:
            lines.append("  hierarchical allreduce steps: " + " -> ".join(parts))
        return "\n".join(lines)

    def _level_index(self, level: str) -> int:
        try:
            return self.levels.index(level)
        except ValueError:
            raise TopologyError(
                f"Unknown topology level {level!r}; this topology has {list(self.levels)}."
            ) from None


# --------------------------------------------------------------------------- helpers


def pseudo_node_names(value: str, size: int) -> list[str]:
    """Node names for ``DDL_PSEUDO_NODES``: a count of contiguous blocks or a name per rank.

    Args:
        value: The variable's value: a node count that divides the ranks into
            contiguous blocks, or comma-separated names, one per rank.
        size: Number of ranks of the job.

    Returns:
        One node name per rank.

    Example:
        >>> pseudo_node_names("2", 4)
        ['pseudo0', 'pseudo0', 'pseudo1', 'pseudo1']
        >>> pseudo_node_names("a,b,a,b", 4)
        ['a', 'b', 'a', 'b']

    Raises:
        ConfigError: The count is out of range or the list has the wrong length.
    """
    value = value.strip()
    if value.isdigit():
        count = int(value)
        if not 1 <= count <= size:
            raise ConfigError(
                f"DDL_PSEUDO_NODES must be between 1 and the number of ranks ({size}). "
                f"Received DDL_PSEUDO_NODES={value!r}; e.g. DDL_PSEUDO_NODES=2."
            )
        return [f"pseudo{r * count // size}" for r in range(size)]
    names = [n.strip() for n in value.split(",")]
    if len(names) != size or not all(names):
        raise ConfigError(
            f"DDL_PSEUDO_NODES lists {len(names)} node names for {size} ranks. Received "
            f"DDL_PSEUDO_NODES={value!r}; give one name per rank (e.g. a,a,b,b) or a count."
        )
    return names


def launcher_layout(environ: Mapping[str, str] | None = None) -> dict[str, int | str]:
    """What the launcher says about this rank (Horovod, Open MPI, Slurm, MPICH variables).

    The launcher's word on this rank's place in the job: ``init()`` takes the
    host name from it (:func:`launcher_hostname`) and cross-checks the rest
    against the layout MPI reports (:mod:`ddl_tf.core.topology.comms`). The
    first launcher (in the order Horovod, Open MPI, Slurm, MPICH) whose rank
    variable is set wins.

    Args:
        environ: Mapping to read instead of ``os.environ`` (tests, fake launchers).

    Returns:
        The keys the launcher set, among ``launcher``, ``rank``, ``size``,
        ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size`` (ints)
        and ``hostname`` (a string); ``{}`` when no launcher is recognized.

    Raises:
        ValueError: A launcher variable that should be an integer is not.

    Example:
        >>> launcher_layout({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        ...                  "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
        {'launcher': 'openmpi', 'rank': 3, 'size': 4, 'local_rank': 1}
    """
    tables = (
        (
            "horovod",
            {
                "rank": env.HOROVOD_RANK,
                "size": env.HOROVOD_SIZE,
                "local_rank": env.HOROVOD_LOCAL_RANK,
                "local_size": env.HOROVOD_LOCAL_SIZE,
                "cross_rank": env.HOROVOD_CROSS_RANK,
                "cross_size": env.HOROVOD_CROSS_SIZE,
                "hostname": env.HOROVOD_HOSTNAME,
            },
        ),
        (
            "openmpi",
            {
                "rank": env.OMPI_COMM_WORLD_RANK,
                "size": env.OMPI_COMM_WORLD_SIZE,
                "local_rank": env.OMPI_COMM_WORLD_LOCAL_RANK,
                "local_size": env.OMPI_COMM_WORLD_LOCAL_SIZE,
            },
        ),
        (
            "slurm",
            {
                "rank": env.SLURM_PROCID,
                "size": env.SLURM_NTASKS,
                "local_rank": env.SLURM_LOCALID,
                "cross_rank": env.SLURM_NODEID,
                "hostname": env.SLURMD_NODENAME,
            },
        ),
        (
            "mpich",
            {
                "rank": env.PMI_RANK,
                "size": env.PMI_SIZE,
                "local_rank": env.MPI_LOCALRANKID,
                "local_size": env.MPI_LOCALNRANKS,
            },
        ),
    )
    for launcher, names in tables:
        if env.get(names["rank"], environ) is None:
            continue
        layout: dict[str, int | str] = {"launcher": launcher}
        for key, var in names.items():
            value = env.get(var, environ)
            if value is None:
                continue
            layout[key] = value if key == "hostname" else int(value)
        return layout
    return {}


def launcher_hostname(environ: Mapping[str, str] | None = None) -> str | None:
    """The host name the launcher gave this rank (``HOROVOD_HOSTNAME``, Slurm's), or None."""
    name = launcher_layout(environ).get("hostname")
    return str(name) if name else None


def _canonical(keys: Sequence) -> tuple[int, ...]:
    """Number distinct keys 0, 1, ... in order of first appearance."""
    ids: dict = {}
    return tuple(ids.setdefault(k, len(ids)) for k in keys)


def _index_within(ids: Sequence[int]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    out = []
    for i in ids:
        out.append(seen.get(i, 0))
        seen[i] = seen.get(i, 0) + 1
    return tuple(out)


def _group_sizes(ids: Sequence[int]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for i in ids:
        sizes[i] = sizes.get(i, 0) + 1
    return sizes


def _same_partition(a: Sequence[int], b: Sequence[int]) -> bool:
    return _canonical(a) == _canonical(b)


def _check_nesting(inner: Sequence[int], outer: Sequence[int], level: str, source: str) -> None:
    owner: dict[int, int] = {}
    for i, o in zip(inner, outer, strict=True):
        if owner.setdefault(i, o) != o:
            raise TopologyError(
                f"topology file {source}: level {level!r} splits a group of the level below "
                "it; every group must contain whole groups of the inner level."
            )


def _ranges(ranks: Sequence[int]) -> str:
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)
