"""Which rank owns each variable under sharding, and how ZeRO-2's gradients are grouped.

The plan of :mod:`ddl_tf.keras.sharding`: :class:`ShardPlan` gives every
trainable variable one owner (whole variables, largest first onto the rank
with the fewest bytes), computed on every rank from its own variable list,
so :func:`check_same_variables` first makes sure the lists agree.
:func:`scatter_groups` cuts ZeRO-2's gradients into reduce-scatters in the
order backprop produces them (:func:`balanced_buckets`), and
:func:`gather_buckets` cuts the updated weights into the allgathers that
share them after the update.

Example:
    >>> import keras
    >>> import numpy as np
    >>> vs = [keras.Variable(np.zeros(n, "float32")) for n in (4, 10, 3, 3)]
    >>> ShardPlan.balance(vs, size=2, rank=0).owners
    (1, 0, 1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow.overlap import Bucketing, production_order

__all__ = [
    "ShardPlan",
    "balanced_buckets",
    "check_same_variables",
    "first_difference",
    "gather_buckets",
    "scatter_groups",
    "variable_signature",
]


@dataclass(frozen=True)
class ShardPlan:
    """Which rank owns each variable (by whole variable, balanced by bytes).

    Attributes:
        owners: The owning rank of each variable, in the optimizer's variable order.
        sizes: Each variable's element count.
        dtypes: Each variable's dtype name.
        rank: This rank (in the engine the plan was made for).
        size: The number of ranks sharing the variables.
    """

    owners: tuple[int, ...]
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    rank: int
    size: int

    @classmethod
    def balance(cls, variables: list, size: int, rank: int) -> ShardPlan:
        """Largest variable first onto the rank with the fewest bytes (ties: the lowest rank).

        Every rank computes the same plan from the same variable list.

        Example:
            >>> import keras
            >>> vs = [keras.Variable(np.zeros(n, "float32")) for n in (4, 10, 3, 3)]
            >>> ShardPlan.balance(vs, size=2, rank=0).owners
            (1, 0, 1, 1)
        """
        sizes = tuple(int(np.prod(v.shape, dtype=np.int64)) for v in variables)
        dtypes = tuple(keras.backend.standardize_dtype(v.dtype) for v in variables)
        nbytes = [n * np.dtype(d).itemsize for n, d in zip(sizes, dtypes, strict=True)]
        load = [0] * size
        owners = [0] * len(variables)
        for i in sorted(range(len(variables)), key=lambda i: (-nbytes[i], i)):
            owner = min(range(size), key=lambda r: (load[r], r))
            owners[i] = owner
            load[owner] += nbytes[i]
        return cls(tuple(owners), sizes, dtypes, rank, size)

    def mine(self) -> list[int]:
        """Indices of this rank's variables."""
        return self.of_rank(self.rank)

    def of(self, rank: int, dtype: str) -> list[int]:
        """Indices of ``rank``'s variables of ``dtype``, in variable order."""
        return [
            i
            for i, (owner, d) in enumerate(zip(self.owners, self.dtypes, strict=True))
            if owner == rank and d == dtype
        ]

    def of_rank(self, rank: int) -> list[int]:
        """Indices of ``rank``'s variables, in variable order."""
        return [i for i, owner in enumerate(self.owners) if owner == rank]

    def bytes_of(self, rank: int) -> int:
        """The variable bytes ``rank`` owns (its slots scale with them)."""
        return sum(
            n * np.dtype(d).itemsize
            for n, d, owner in zip(self.sizes, self.dtypes, self.owners, strict=True)
            if owner == rank
        )


def variable_signature(variables: list) -> list[tuple[str, tuple[int, ...], str]]:
    """``(path, shape, dtype)`` of each variable, as :func:`check_same_variables` compares them.

    Args:
        variables: Keras (or TensorFlow) variables.

    Returns:
        One tuple per variable, in order (the path only names it in errors).
    """
    return [
        (
            str(getattr(v, "path", None) or getattr(v, "name", "?")),
            tuple(int(d) for d in v.shape),
            keras.backend.standardize_dtype(v.dtype),
        )
        for v in variables
    ]


def check_same_variables(engine: Any, variables: list, name: str) -> None:
    """Refuse, on every sharing rank, variable lists that differ in count, shape or dtype.

    The owner plan is computed on each rank from its own list; lists that
    differ would give each rank another plan, and the reduce-scatter and the
    weight allgather would then move the wrong bytes or wait forever. One
    ``allgather_object`` of the lists' signatures (small: a few bytes per
    variable) lets every rank see the same difference and raise the same error.

    Args:
        engine: The engine of the ranks that share the variables.
        variables: This rank's variables, in the optimizer's order.
        name: The collective's name (the same on every rank).

    Raises:
        ConfigError: Some rank's list differs from rank 0's (the error names the
            first difference and the fix).
    """
    everyone = engine.allgather_object(variable_signature(variables), name=name)
    problem = first_difference(everyone)
    if problem is not None:
        raise ConfigError(
            "DistributedOptimizer(sharding=...) was built on different variables on different "
            f"ranks: {problem}. Sharding assigns each variable to one rank from the variable "
            "list, which must be the same (count, order, shapes, dtypes) on every rank that "
            "shares it. Build the same model on every rank (no layer sizes or layers that "
            "depend on the rank), or use sharding=None, which does not need it."
        )


def first_difference(signatures: list[list[tuple[str, tuple[int, ...], str]]]) -> str | None:
    """The first way a rank's signature differs from rank 0's, in words; None when all agree.

    Example:
        >>> a = [("dense/kernel", (4, 8), "float32"), ("dense/bias", (8,), "float32")]
        >>> b = [("dense/kernel", (4, 9), "float32"), ("dense/bias", (9,), "float32")]
        >>> first_difference([a, a]) is None
        True
        >>> first_difference([a, b])
        "variable #0 is 'dense/kernel' float32 (4, 8) on rank 0 but 'dense/kernel' float32 (4, 9) on rank 1"
    """
    ours = signatures[0]
    for rank, theirs in enumerate(signatures[1:], start=1):
        for k, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if a[1:] != b[1:]:
                return (
                    f"variable #{k} is {a[0]!r} {a[2]} {a[1]} on rank 0 but "
                    f"{b[0]!r} {b[2]} {b[1]} on rank {rank}"
                )
        if len(ours) != len(theirs):
            extra, where = (ours, 0) if len(ours) > len(theirs) else (theirs, rank)
            return (
                f"rank 0 has {len(ours)} trainable variables but rank {rank} has "
                f"{len(theirs)} (the first one only rank {where} has: "
                f"{extra[min(len(ours), len(theirs))][0]!r})"
            )
    return None


def scatter_groups(
    plan: ShardPlan, by_position: dict, bucketing: Bucketing, name: str
) -> list[tuple[str, list[int]]]:
    """The variables (plan indices) of each ZeRO-2 reduce-scatter, in the order to issue them.

    Inside a graph with overlap on, the gradients are cut into buckets of at
    least ``bucketing.bucket_bytes`` in the order backprop produces them
    (:func:`~ddl_tf.tensorflow.overlap.production_order`, the same on every
    rank), as the allreduce's buckets are, each balanced between the owners
    (:func:`balanced_buckets`): each bucket's reduce-scatter then depends on
    its own gradients only and starts while backprop goes on.
    Eagerly, or with overlap off, one group holds every variable (one
    reduce-scatter after the backward pass). A variable without a gradient
    (the same on every rank) is in no group: its owner gets None and leaves
    it alone, as replicated training does.

    Args:
        plan: The owner plan.
        by_position: Each variable's gradient (or None) by plan index.
        bucketing: The reducer's bucketing (overlap, bucket size).
        name: The collectives' base name; bucket ``k`` is ``f"{name}_b{k}"``.

    Returns:
        ``(collective name, plan indices)`` per reduce-scatter.
    """
    present = [i for i in range(len(plan.sizes)) if by_position.get(i) is not None]
    if not present:
        return []
    if not bucketing.overlap or tf.executing_eagerly():
        return [(name, present)]
    order = production_order([by_position[i] for i in present])
    nbytes = [plan.sizes[i] * np.dtype(plan.dtypes[i]).itemsize for i in present]
    owners = [plan.owners[i] for i in present]
    buckets = balanced_buckets(order, nbytes, owners, plan.size, bucketing.bucket_bytes)
    return [(f"{name}_b{k}", sorted(present[j] for j in b)) for k, b in enumerate(buckets)]


def gather_buckets(plan: ShardPlan, fusion_bytes: int) -> list[list[int]]:
    """The variables (plan indices) of each allgather of the updated weights, in the order to issue them.

    After the update every rank holds its own variables' new values and
    receives the others'. Gathered at once, the received values are a second
    copy of the whole model beside its variables until they are assigned
    (GPT-2 XL's 6.5 GB on each rank, more than sharding its optimizer state
    saves on 8 ranks). Fused as Horovod fuses collectives instead: whole
    variables in variable order, at most ``fusion_bytes`` a message, a
    larger variable alone (one variable a message when it is 0). ddl_tf runs
    its collectives one after another in program order, so a rank holds
    about one message of received weights at a time. An allgather takes rows
    of any length from each rank, so a message needs no balance between
    owners (a rank owning nothing in it sends an empty row).

    Args:
        plan: The owner plan.
        fusion_bytes: Largest fused message (the job's ``DDL_FUSION_THRESHOLD``).

    Returns:
        Plan indices per allgather, each in variable order.

    Example:
        >>> plan = ShardPlan(owners=(0, 1, 1, 0), sizes=(4, 4, 2, 8), dtypes=("float32",) * 4,
        ...                  rank=0, size=2)
        >>> gather_buckets(plan, 40)
        [[0, 1, 2], [3]]
        >>> gather_buckets(plan, 0)
        [[0], [1], [2], [3]]
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, (n, dtype) in enumerate(zip(plan.sizes, plan.dtypes, strict=True)):
        nbytes = n * np.dtype(dtype).itemsize
        if current and held + nbytes > fusion_bytes:
            buckets.append(current)
            current, held = [], 0
        current.append(i)
        held += nbytes
    if current:
        buckets.append(current)
    return buckets


def balanced_buckets(
    order: list[int],
    nbytes: list[int],
    owners: list[int],
    size: int,
    bucket_bytes: int,
    waste: float = 0.125,
) -> list[list[int]]:
    """Cut gradients, in production order, into buckets whose owners' segments are about equal.

    A bucket's reduce-scatter sends ``size`` rows as wide as its largest
    owner's segment, so a bucket that one rank owns alone would send ``size``
    times its bytes. A bucket therefore closes once it holds ``bucket_bytes``
    *and* its padding is at most ``waste`` of its bytes; whole variables of
    one size, dealt to the ranks in turn, close after one per rank. The last
    bucket takes what is left (at worst, everything: one fused reduce-scatter).

    Args:
        order: Gradient indices, earliest produced first.
        nbytes: Bytes of each gradient.
        owners: The owning rank of each gradient.
        size: The number of ranks.
        bucket_bytes: Least bytes of a bucket (0: as soon as it is balanced).
        waste: Largest share of padding in a closed bucket.

    Returns:
        The buckets (gradient indices, in ``order``), in the order to issue them.

    Example:
        >>> balanced_buckets([0, 1, 2, 3], [40, 40, 40, 40], [0, 1, 1, 0], 2, 16)
        [[0, 1], [2, 3]]
        >>> balanced_buckets([0, 1, 2, 3], [40, 40, 40, 40], [0, 0, 1, 1], 2, 16)
        [[0, 1, 2, 3]]
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    load = [0] * size
    for i in order:
        current.append(i)
        load[owners[i]] += nbytes[i]
        total = sum(load)
        if total >= bucket_bytes and size * max(load) - total <= waste * total:
            buckets.append(current)
            current, load = [], [0] * size
    if current:
        buckets.append(current)
    return buckets
