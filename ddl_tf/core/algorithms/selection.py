"""``auto``: pick an allreduce algorithm by message size and topology.

The choice is a small table of ``(largest message in bytes, algorithm)``
rules per situation, evaluated in order; the first rule whose bound is not
exceeded wins (``None`` is unbounded). Situations are ``single_node`` and
``multi_node``, each optionally specialised for dtypes MPI cannot reduce
natively (``/custom_op``: bfloat16, and float16 on MPIs without it), where
ddl_tf's own algorithms sum in float32 instead of calling back into Python.

A ``multi_node`` table may also be specialised for one layout of nodes x
ranks per node, ``multi_node@2x4`` (and ``multi_node@2x4/custom_op``), which
wins over the general table for jobs with exactly that layout; and an
optional ``"steps"`` entry names the step algorithm of each level of the
hierarchical allreduce per layout (``{"multi_node@2x4": {"node": "ring",
"world": "flat"}}``), unless a topology file names them.
``benchmarks/bench_cluster_allreduce.py`` writes such tables, one per layout
it measured on a rehearsal cluster (:mod:`ddl_tf.cluster`). Both benchmarks
learn their tables from their timings with ``benchmarks/policy_fit.py``.

:data:`DEFAULT_POLICY` comes from ``benchmarks/bench_allreduce.py`` on the
development machine (see the comment above it); re-run the benchmark on a
cluster and point ``DDL_AUTO_POLICY`` at the ``auto_policy.json`` it writes
to tune ``auto`` there. The choice depends only on values every rank shares
(message size, dtype, topology, the policy), so all ranks agree.

Example:
    >>> from ddl_tf.core.algorithms.selection import AutoPolicy
    >>> policy = AutoPolicy({"single_node": ((1 << 20, "flat"), (None, "ring"))})
    >>> policy.choose(4096, num_nodes=1, hierarchical_ok=False, custom_op=False)
    'flat'
    >>> policy.choose(1 << 24, num_nodes=1, hierarchical_ok=False, custom_op=False)
    'ring'
    >>> tuned = AutoPolicy({"multi_node": ((None, "flat"),),
    ...                     "multi_node@2x2": ((1 << 20, "flat"), (None, "hierarchical"))},
    ...                    steps={"multi_node@2x2": {"node": "ring"}})
    >>> tuned.choose(1 << 24, num_nodes=2, hierarchical_ok=True, custom_op=False, layout=(2, 2))
    'hierarchical'
    >>> tuned.choose(1 << 24, num_nodes=2, hierarchical_ok=True, custom_op=False, layout=(2, 4))
    'flat'
    >>> tuned.step_algorithm("node", layout=(2, 2)), tuned.step_algorithm("world", layout=(2, 2))
    ('ring', None)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddl_tf.errors import ConfigError

__all__ = ["AutoPolicy", "DEFAULT_POLICY", "load_policy", "layout_key"]

_ALGOS = ("flat", "ring", "asa", "hierarchical")
_SITUATIONS = (
    "single_node",
    "multi_node",
    "single_node/custom_op",
    "multi_node/custom_op",
)
_LAYOUT_SITUATION = re.compile(r"^multi_node@(\d+)x(\d+)(/custom_op)?$")
_STEP_ALGOS = ("flat", "ring", "asa")

Rules = tuple[tuple[int | None, str], ...]


def layout_key(layout: tuple[int, int]) -> str:
    """``multi_node@NxL`` for ``N`` nodes of ``L`` ranks each.

    Args:
        layout: ``(number of nodes, ranks per node)``.

    Returns:
        The situation key the auto policy stores per layout.
    """
    return f"multi_node@{layout[0]}x{layout[1]}"


@dataclass(frozen=True)
class AutoPolicy:
    """Rules per situation; see the module docstring.

    Attributes:
        tables: ``{situation: ((max_bytes or None, algorithm), ...)}``. The
            last rule of each table should be unbounded.
        source: Where the table came from (logged by ``init()``).
        steps: ``{"multi_node@NxL" or "multi_node": {level: step algorithm}}``
            for the hierarchical allreduce (levels without an entry use flat).
    """

    tables: Mapping[str, Rules]
    source: str = "built-in"
    steps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for situation, rules in self.tables.items():
            if situation not in _SITUATIONS and not _LAYOUT_SITUATION.match(situation):
                raise ConfigError(
                    f"auto policy {self.source}: unknown situation {situation!r}; use "
                    f"{', '.join(_SITUATIONS)}, or multi_node@NxL[/custom_op] for N nodes of "
                    "L ranks."
                )
            for bound, algo in rules:
                if algo not in _ALGOS or not (bound is None or int(bound) >= 0):
                    raise ConfigError(
                        f"auto policy {self.source}: bad rule {[bound, algo]!r} for "
                        f"{situation!r}; each rule is [max_bytes or null, one of {_ALGOS}]."
                    )
        for situation, levels in self.steps.items():
            if situation != "multi_node" and not _LAYOUT_SITUATION.match(situation):
                raise ConfigError(
                    f"auto policy {self.source}: 'steps' entry {situation!r} must be "
                    "multi_node or multi_node@NxL."
                )
            for level, algo in levels.items():
                if algo not in _STEP_ALGOS:
                    raise ConfigError(
                        f"auto policy {self.source}: step algorithm {algo!r} for level "
                        f"{level!r} in {situation!r}; use one of {_STEP_ALGOS}."
                    )

    def choose(
        self,
        nbytes: int,
        *,
        num_nodes: int,
        hierarchical_ok: bool,
        custom_op: bool,
        layout: tuple[int, int] | None = None,
    ) -> str:
        """The algorithm for a message of ``nbytes`` bytes.

        Args:
            nbytes: Bytes on the wire of the (fused) buffer.
            num_nodes: Nodes in the job.
            hierarchical_ok: Whether the topology allows ``hierarchical``.
            custom_op: Whether MPI would need a Python reduction for this dtype.
            layout: ``(nodes, ranks per node)`` when every node runs the same
                number of ranks (selects a ``multi_node@NxL`` table if present).

        Returns:
            ``flat``, ``ring``, ``asa`` or ``hierarchical``. A rule naming
            ``hierarchical`` on a topology that cannot use it yields ``flat``.
        """
        scope = "multi_node" if num_nodes > 1 else "single_node"
        if num_nodes > 1 and layout is not None and layout_key(layout) in self.tables:
            scope = layout_key(layout)
        rules = (custom_op and self.tables.get(scope + "/custom_op")) or self.tables.get(scope, ())
        for bound, algo in rules:
            if bound is None or nbytes <= bound:
                if algo == "hierarchical" and not hierarchical_ok:
                    return "flat"
                return algo
        return "flat"

    def step_algorithm(self, level: str, *, layout: tuple[int, int] | None) -> str | None:
        """The measured step algorithm for ``level`` of the hierarchical allreduce, or None.

        Args:
            level: The topology level (``"node"``, ``"rack"``...).
            layout: ``(nodes, ranks per node)`` of the job; its own entry wins
                over the generic ``"multi_node"`` one; None for the generic only.

        Returns:
            The step algorithm name measured best for that level, or None when
            the policy has no entry (the engine's default applies).
        """
        for key in ([layout_key(layout)] if layout else []) + ["multi_node"]:
            if key in self.steps:
                return self.steps[key].get(level)
        return None

    def digest(self) -> str:
        """Short digest of the tables (ranks compare it at ``init()``)."""
        text = json.dumps({k: list(v) for k, v in sorted(self.tables.items())})
        if self.steps:
            text += json.dumps({k: dict(sorted(v.items())) for k, v in sorted(self.steps.items())})
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def to_json(self) -> dict:
        """The JSON form :func:`load_policy` reads."""
        data: dict = {k: [list(rule) for rule in v] for k, v in self.tables.items()}
        if self.steps:
            data["steps"] = {k: dict(v) for k, v in self.steps.items()}
        return data


# Derived with benchmarks/bench_allreduce.py under its earlier rule (another algorithm replaced
# flat only where it was >= 1.25x faster on both 2 and 4 ranks for two consecutive sizes). On
# the 2-core development machine every rank shares memory, and no algorithm cleared that bar
# against MPI's own allreduce, so `auto` is flat everywhere there; on one host hierarchical
# only adds passes over memory (about 3x slower than flat with 2 pseudo-nodes). The benchmark
# now learns with benchmarks/policy_fit.py (the cluster benchmark's rules); on the same stored
# measurements (benchmarks/results/allreduce.json) those rules would pick ring for single-node
# float32 messages above 32 MiB (flat's worst case there: 1.29x to 1.33x slower) and for bf16
# between 256 KiB and 16 MiB on the wire; this table is left as it was until a fresh run on a
# quiet machine confirms that. Where the inter-node link is the bottleneck, measure on the
# cluster and point DDL_AUTO_POLICY at the auto_policy.json the benchmark writes; see
# README.md, "ddl_tf -> allreduce performance".
DEFAULT_POLICY = AutoPolicy(
    {
        "single_node": ((None, "flat"),),
        "single_node/custom_op": ((None, "flat"),),
        "multi_node": ((None, "flat"),),
        "multi_node/custom_op": ((None, "flat"),),
    }
)


def load_policy(path: str | Path | None) -> AutoPolicy:
    """The policy in ``path`` (JSON ``{situation: [[max_bytes|null, algo], ...]}``), or the default.

    Args:
        path: The policy JSON file (written by ``benchmarks/bench_allreduce.py``);
            None for the built-in default policy.

    Returns:
        The policy.

    Raises:
        ConfigError: The file is missing or malformed.
    """
    if path is None:
        return DEFAULT_POLICY
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"DDL_AUTO_POLICY={str(path)!r} could not be read ({err}). Point it at the "
            "auto_policy.json written by benchmarks/bench_allreduce.py, or unset it."
        ) from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"auto policy {path}: expected a JSON object of situations.")
    data = dict(data)
    steps = data.pop("steps", {})
    if not isinstance(steps, Mapping) or not all(isinstance(v, Mapping) for v in steps.values()):
        raise ConfigError(
            f'auto policy {path}: "steps" must map situations to {{level: algorithm}}, e.g. '
            '{"multi_node@2x2": {"node": "ring", "world": "flat"}}.'
        )
    tables = {
        key: tuple((None if b is None else int(b), str(a)) for b, a in rules)
        for key, rules in data.items()
    }
    return AutoPolicy(tables, source=str(path), steps={k: dict(v) for k, v in steps.items()})
