"""Learn the ``auto`` tables of an :class:`~ddl_tf.core.algorithms.selection.AutoPolicy` from timings.

The one rule set behind ``benchmarks/bench_allreduce.py`` (one machine) and
``benchmarks/bench_cluster_allreduce.py`` (rehearsal clusters). Its input is
benchmark rows, dicts with ``algorithm``, ``compression``, ``seconds`` and
the message size (``wire_bytes``, or ``bytes`` of float32 data); its output
is rules in the JSON form :func:`~ddl_tf.core.algorithms.selection.load_policy` reads.

The rules, written to tolerate the noise of a shared machine (two timings of
the same algorithm in one run differ by up to ~20 % there, and a table that
switches algorithm at every size fits that noise):

1. *Cost.* At each message size (bytes on the wire, what
   :meth:`AutoPolicy.choose <ddl_tf.core.algorithms.selection.AutoPolicy.choose>` is
   given), an algorithm's cost is its largest ratio to the fastest algorithm
   over the layouts measured (its worst-case regret; with one layout, its
   time relative to the fastest). Only :data:`CANDIDATES` compete (``auto``'s
   own rows and baselines such as plain mpi4py do not), and only sizes and
   algorithms measured in every layout.
2. *Ties.* Algorithms within ``1 + margin`` (:data:`MARGIN`, 10 %) of the
   lowest cost are tied: a challenger must beat the incumbent by the margin.
3. *Choice.* The previous (smaller) size's choice stays while it is tied, so
   the table does not flip-flop; otherwise ``flat`` (MPI's own allreduce, the
   default, needs no case made for it) if tied; otherwise the cheapest.
4. *Rules.* Consecutive sizes with the same choice merge into one rule;
   boundaries sit at the geometric midpoint between measured sizes; the last
   rule is unbounded.

Example:
    >>> from benchmarks.policy_fit import fit_tables
    >>> rows = [
    ...     {"algorithm": a, "compression": "none", "bytes": b, "seconds": s}
    ...     for b, a, s in [(1024, "flat", 1.0), (1024, "ring", 0.97),
    ...                     (4096, "flat", 2.0), (4096, "ring", 1.0)]
    ... ]
    >>> fit_tables([rows], {"single_node": "none"})
    {'single_node': [[2048, 'flat'], [None, 'ring']]}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "MARGIN",
    "CANDIDATES",
    "Costs",
    "wire_bytes",
    "costs_from_rows",
    "regrets",
    "choose_per_size",
    "rules_from",
    "fit_rules",
    "fit_tables",
]

MARGIN = 0.10
"""An algorithm counts as tied with the cheapest within this fraction of its cost."""

CANDIDATES = ("flat", "ring", "hierarchical", "asa")
"""The algorithms an ``auto`` table may name, in the order they are considered."""

Costs = dict[int, dict[str, float]]
"""``{message bytes: {algorithm: cost}}``; lower is better."""

# bytes on the wire per byte of float32 data, for rows that carry only ``bytes``
_WIRE_SHARE = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}


def wire_bytes(row: Mapping) -> int:
    """Bytes on the wire of a benchmark row: ``wire_bytes``, else ``bytes`` of float32 data.

    Args:
        row: A row with ``wire_bytes``, or with ``bytes`` (float32 data) and
            ``compression`` (``none``, ``fp16`` or ``bf16``).

    Returns:
        The size ``auto`` sees for that message.

    Raises:
        KeyError: The row has neither size, or an unknown compression.

    Example:
        >>> wire_bytes({"bytes": 4096, "compression": "bf16"})
        2048
    """
    if "wire_bytes" in row:
        return int(row["wire_bytes"])
    return int(row["bytes"] * _WIRE_SHARE[row["compression"]])


def costs_from_rows(rows: Iterable[Mapping], compression: str) -> Costs:
    """Seconds per wire size and candidate algorithm, from the rows of one layout.

    Args:
        rows: Benchmark rows (see the module docstring). Rows of another
            compression, of non-candidate algorithms, or of a separate phase
            (a truthy ``phase``, e.g. bench_allreduce's ``target`` A/B) are skipped.
        compression: Which wire format's rows to read.

    Returns:
        ``{wire bytes: {algorithm: seconds}}`` (empty if nothing matched).
    """
    costs: Costs = {}
    for row in rows:
        if (
            row["compression"] != compression
            or row["algorithm"] not in CANDIDATES
            or row.get("phase")
        ):
            continue
        costs.setdefault(wire_bytes(row), {})[row["algorithm"]] = row["seconds"]
    return costs


def regrets(layouts: Sequence[Costs]) -> Costs:
    """Worst-case ratio of each algorithm to the fastest, over layouts (rule 1).

    Args:
        layouts: Seconds per size and algorithm, one mapping per layout.

    Returns:
        Costs for the sizes measured in every layout and, at each size, the
        algorithms measured there in every layout.

    Example:
        >>> regrets([{1: {"flat": 1.0, "ring": 2.0}}, {1: {"flat": 3.0, "ring": 2.0}}])
        {1: {'flat': 1.5, 'ring': 2.0}}
    """
    if not layouts:
        return {}
    sizes = sorted(set.intersection(*(set(costs) for costs in layouts)))
    return {
        size: {
            algo: max(costs[size][algo] / min(costs[size].values()) for costs in layouts)
            for algo in CANDIDATES
            if all(algo in costs[size] for costs in layouts)
        }
        for size in sizes
    }


def choose_per_size(costs: Costs, margin: float = MARGIN) -> dict[int, str]:
    """The algorithm per size from a cost per algorithm (rules 2 and 3).

    Args:
        costs: Seconds or regrets per size and algorithm; lower is better.
        margin: Fraction within which algorithms are tied.

    Returns:
        ``{size: algorithm}`` for every size of ``costs``.

    Example:
        >>> choose_per_size({1: {"flat": 1.0, "ring": 0.95}, 2: {"flat": 1.0, "ring": 0.5},
        ...                  4: {"flat": 0.55, "ring": 0.58}, 8: {"flat": 0.5, "ring": 0.8}})
        {1: 'flat', 2: 'ring', 4: 'ring', 8: 'flat'}
    """
    chosen: dict[int, str] = {}
    previous: str | None = None
    for size in sorted(costs):
        best = min(costs[size].values())
        tied = {a for a, c in costs[size].items() if c <= best * (1 + margin)}
        if previous in tied:
            algo = previous
        elif "flat" in tied:
            algo = "flat"
        else:
            algo = min(costs[size], key=costs[size].__getitem__)
        chosen[size] = previous = algo
    return chosen


def rules_from(chosen: Mapping[int, str]) -> list[list]:
    """``[[max_bytes or None, algorithm], ...]`` from a choice per size (rule 4).

    Args:
        chosen: The algorithm per measured size.

    Returns:
        Rules in the order :meth:`AutoPolicy.choose` reads them, with
        boundaries at geometric midpoints of the sizes; the last is unbounded.

    Example:
        >>> rules_from({1024: "flat", 4096: "ring", 16384: "ring"})
        [[2048, 'flat'], [None, 'ring']]
    """
    sizes = sorted(chosen)
    rules: list[list] = []
    for i, size in enumerate(sizes):
        bound = None if i == len(sizes) - 1 else int(math.sqrt(size * sizes[i + 1]))
        if rules and rules[-1][1] == chosen[size]:
            rules[-1][0] = bound
        else:
            rules.append([bound, chosen[size]])
    return rules


def fit_rules(layouts: Sequence[Costs], margin: float = MARGIN) -> list[list] | None:
    """One ``auto`` table from the timings of one or more layouts (rules 1 to 4).

    Args:
        layouts: Seconds per size and algorithm, one mapping per layout;
            empty mappings (a layout that did not measure this case) are ignored.
        margin: Fraction within which algorithms are tied.

    Returns:
        The rules, or None when no size was measured in every layout.
    """
    costs = regrets([layout for layout in layouts if layout])
    if not costs:
        return None
    return rules_from(choose_per_size(costs, margin))


def fit_tables(
    layout_rows: Sequence[Iterable[Mapping]],
    situations: Mapping[str, str],
    margin: float = MARGIN,
) -> dict[str, list[list]]:
    """``auto`` tables per situation from the benchmark rows of one or more layouts.

    Args:
        layout_rows: The rows of each layout that the tables must serve.
        situations: Policy situation (e.g. ``multi_node@2x2/custom_op``) ->
            the compression whose rows it is learned from (``none``, ``fp16``, ``bf16``).
        margin: Fraction within which algorithms are tied.

    Returns:
        ``{situation: rules}`` for the situations that had measurements.
    """
    layout_rows = [list(rows) for rows in layout_rows]
    tables: dict[str, list[list]] = {}
    for situation, compression in situations.items():
        rules = fit_rules([costs_from_rows(rows, compression) for rows in layout_rows], margin)
        if rules is not None:
            tables[situation] = rules
    return tables
