"""Topology files: extra levels (socket, rack, ...) and per-level algorithms.

A topology file is JSON, in the spirit of ddlrun's topology-aware
configuration. Levels are listed innermost first and must include ``node``
(the ranks that share memory, found by MPI). Levels inside a node are equal
contiguous blocks of a node's local ranks (``split``); levels above the node
group whole nodes by name (``groups``). ``algorithms`` optionally names the
algorithm each hierarchical step uses (``flat``, ``ring`` or ``asa``); the key
``world`` is the allreduce across the outermost groups::

    {
      "levels": ["socket", "node", "rack"],
      "split": {"socket": 2},
      "groups": {"rack": {"rack-a": ["host1", "host2"], "rack-b": ["host3", "host4"]}},
      "algorithms": {"socket": "ring", "node": "flat", "rack": "flat", "world": "ring"}
    }

Example:
    >>> from ddl_tf.core.topology.topology_file import TopologySpec
    >>> spec = TopologySpec.from_dict({"levels": ["socket", "node"], "split": {"socket": 2}})
    >>> spec.levels, spec.split
    (('socket', 'node'), {'socket': 2})
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddl_tf.errors import TopologyError

__all__ = ["TopologySpec", "STEP_ALGORITHMS", "load_topology_file"]

STEP_ALGORITHMS = ("flat", "ring", "asa")
_EXAMPLE = (
    '{"levels": ["node", "rack"], "groups": {"rack": {"r1": ["host1", "host2"], '
    '"r2": ["host3", "host4"]}}}'
)


@dataclass(frozen=True)
class TopologySpec:
    """A parsed topology file.

    Attributes:
        levels: Level names, innermost first; contains ``"node"``.
        split: For each level inside a node, how many equal blocks of local
            ranks a node is split into.
        groups: For each level above the node, ``{group name: [node names]}``.
        algorithms: Step algorithm per level name (and ``"world"``).
        source: Where the spec came from (for error messages).
    """

    levels: tuple[str, ...] = ("node",)
    split: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    algorithms: Mapping[str, str] = field(default_factory=dict)
    source: str = "<defaults>"

    def __post_init__(self) -> None:
        where = f"topology file {self.source}"
        if len(set(self.levels)) != len(self.levels) or "node" not in self.levels:
            raise TopologyError(
                f"{where}: 'levels' must list distinct names including 'node', innermost "
                f"first. Received levels={list(self.levels)}; e.g. {_EXAMPLE}"
            )
        node_at = self.levels.index("node")
        inner, outer = self.levels[:node_at], self.levels[node_at + 1 :]
        if set(self.split) != set(inner):
            raise TopologyError(
                f"{where}: every level inside 'node' needs a block count in 'split' and "
                f"nothing else may be split. Received levels={list(self.levels)}, "
                f'split={dict(self.split)}; e.g. "split": {{"socket": 2}}.'
            )
        counts = [self.split[name] for name in inner]
        for name, count in zip(inner, counts, strict=True):
            if not isinstance(count, int) or count < 1:
                raise TopologyError(
                    f"{where}: split[{name!r}] must be a whole number >= 1. Received {count!r}."
                )
        for inner_count, outer_count in itertools.pairwise(counts):
            if inner_count % outer_count:
                raise TopologyError(
                    f"{where}: inner levels must nest, so each block count must be a multiple "
                    f"of the next level's. Received split={dict(self.split)}."
                )
        if set(self.groups) != set(outer):
            raise TopologyError(
                f"{where}: every level above 'node' needs its node groups in 'groups'. "
                f"Received levels={list(self.levels)}, groups for {sorted(self.groups)}; "
                f"e.g. {_EXAMPLE}"
            )
        for level, algo in self.algorithms.items():
            if level not in self.levels and level != "world":
                raise TopologyError(
                    f"{where}: 'algorithms' names unknown level {level!r}. "
                    f"Received algorithms={dict(self.algorithms)}; levels are "
                    f"{list(self.levels)} plus 'world'."
                )
            if algo not in STEP_ALGORITHMS:
                raise TopologyError(
                    f"{where}: unknown algorithm {algo!r} for level {level!r}. "
                    f"Use one of {', '.join(STEP_ALGORITHMS)}."
                )

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "<dict>") -> TopologySpec:
        """Build a spec from parsed JSON, with errors naming ``source``.

        Args:
            data: The parsed topology JSON (``levels``, ``split``, ``groups``,
                ``algorithms``; all optional).
            source: What ``data`` came from (a file path), for error messages.

        Returns:
            The validated spec.

        Raises:
            TopologyError: ``data`` is not an object, has unknown keys, or is
                inconsistent.
        """
        if not isinstance(data, Mapping):
            raise TopologyError(
                f"topology file {source}: expected a JSON object. Received "
                f"{type(data).__name__}; e.g. {_EXAMPLE}"
            )
        unknown = set(data) - {"levels", "split", "groups", "algorithms"}
        if unknown:
            raise TopologyError(
                f"topology file {source}: unknown keys {sorted(unknown)}. Allowed: levels, "
                f"split, groups, algorithms; e.g. {_EXAMPLE}"
            )
        groups = {
            level: {name: tuple(nodes) for name, nodes in dict(by_name).items()}
            for level, by_name in dict(data.get("groups", {})).items()
        }
        return cls(
            levels=tuple(data.get("levels", ("node",))),
            split=dict(data.get("split", {})),
            groups=groups,
            algorithms=dict(data.get("algorithms", {})),
            source=source,
        )

    def group_of_node(self, level: str, node: str) -> str:
        """Name of the ``level`` group that holds ``node``.

        Args:
            level: A level with explicit ``groups`` in the file.
            node: A node (host or pseudo-node) name.

        Returns:
            The group's name.

        Raises:
            TopologyError: The node is not listed, or listed twice.
        """
        owners = [name for name, nodes in self.groups[level].items() if node in nodes]
        if len(owners) != 1:
            problem = "is not listed in any" if not owners else f"is listed in {owners} of the"
            raise TopologyError(
                f"topology file {self.source}: node {node!r} {problem} {level!r} groups "
                f"{dict(self.groups[level])}. List every node of the job exactly once per "
                "level (node names are the hosts' names, or the DDL_PSEUDO_NODES names)."
            )
        return owners[0]


def load_topology_file(path: str | Path) -> TopologySpec:
    """Read and validate a topology file.

    Args:
        path: The JSON topology file.

    Returns:
        The validated spec, with ``source`` set to ``path``.

    Raises:
        TopologyError: Missing file, invalid JSON, or an inconsistent spec.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TopologyError(
            f"topology file {path} does not exist. Pass an existing JSON file "
            f"(--topology FILE or DDL_TOPOLOGY_FILE), e.g. {_EXAMPLE}"
        ) from None
    except json.JSONDecodeError as err:
        raise TopologyError(f"topology file {path} is not valid JSON: {err}.") from None
    return TopologySpec.from_dict(data, source=str(path))
