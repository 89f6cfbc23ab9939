"""Bytes each allreduce algorithm sends over each node's link, to set against the counters.

``N`` nodes with ``L`` ranks each (``P = N L`` ranks, those of a node
numbered consecutively, as ``mpirun --map-by slot`` and ``ddlrun`` place
them), ``W`` bytes on the wire per rank. Traffic between ranks of one node
never touches the link. Per node and direction, in TCP payload bytes:

* minimum, for any algorithm: ``2 (N-1)/N W`` (:mod:`~ddl_tf.cluster.bounds`);
* ``hierarchical``: the minimum. Inside the node nothing crosses; the
  ``L`` shards of ``W/L`` are allreduced across nodes by ``L`` independent
  groups of one rank per node, each with a bandwidth-optimal schedule;
* ``ring`` over all ranks: ``2 (P-1)/P W``. Each rank sends ``2 (P-1)/P W``
  to its right neighbour, and of the ``P`` neighbour pairs exactly one
  leaves each node;
* ``flat`` (``MPI_Allreduce``): the minimum, assuming a bandwidth-optimal
  schedule (Open MPI 5's ``han``, or Rabenseifner's halving and doubling,
  both reach it with 2 nodes); Open MPI chooses, by size;
* ``asa``: the ``Alltoallv`` sends every off-node rank its shard,
  ``L (N-1)/N W``, and a bandwidth-optimal allgather (a ring) adds
  ``(P-1)/P W``. The allgather is MPI's ``Allgatherv``; where Open MPI
  picks recursive doubling or Bruck's algorithm instead, more crosses
  (:func:`allgather_link_bytes` counts each schedule).

Example:
    >>> from ddl_tf.cluster.traffic import expected_link_bytes
    >>> W = 16 << 20
    >>> [expected_link_bytes(a, W, nodes=2, ranks_per_node=4) / W
    ...  for a in ("hierarchical", "flat", "ring", "asa")]
    [1.0, 1.0, 1.75, 2.875]
"""

from __future__ import annotations

from ddl_tf.errors import ConfigError

__all__ = [
    "minimum_link_bytes",
    "expected_link_bytes",
    "allgather_link_bytes",
    "MODELS",
]

MODELS = {
    "hierarchical": "2 (N-1)/N W: only the cross-node allreduce of W/L shards leaves the node",
    "flat": "2 (N-1)/N W: MPI_Allreduce with a bandwidth-optimal schedule (han, Rabenseifner)",
    "ring": "2 (P-1)/P W: one of the P ring edges leaves each node",
    "asa": "L (N-1)/N W (Alltoallv) + (P-1)/P W (Allgatherv as a ring)",
}
"""What :func:`expected_link_bytes` assumes, per algorithm (for reports)."""


def minimum_link_bytes(nbytes: float, *, nodes: int) -> float:
    """``2 (N-1)/N * nbytes``: what any allreduce must send (and receive) per node link.

    Args:
        nbytes: Bytes of the buffer every rank contributes.
        nodes: Number of nodes (1 gives 0: nothing crosses a link).

    Returns:
        Bytes each node's link carries in each direction, at the least.

    Raises:
        ConfigError: ``nodes`` < 1.
    """
    _check(nodes, 1)
    return 2 * (nodes - 1) / nodes * nbytes


def expected_link_bytes(algorithm: str, nbytes: float, *, nodes: int, ranks_per_node: int) -> float:
    """Payload bytes ``algorithm`` sends (and receives) over each node's link per allreduce.

    Args:
        algorithm: ``flat``, ``ring``, ``asa``, ``hierarchical`` or a
            ``hierarchical[<node step>/<world step>]`` variant.
        nbytes: Bytes on the wire per rank (half the float32 size with fp16).
        nodes: Number of nodes ``N``.
        ranks_per_node: Ranks per node ``L``.

    Raises:
        ConfigError: An unknown algorithm (``auto``: pass what it chose) or a bad layout.
    """
    _check(nodes, ranks_per_node)
    n, ranks = nodes, nodes * ranks_per_node
    if n == 1:
        return 0.0
    name = "hierarchical" if algorithm.startswith("hierarchical[") else algorithm
    if name in ("hierarchical", "flat"):
        return minimum_link_bytes(nbytes, nodes=n)
    if name == "ring":
        return 2 * (ranks - 1) / ranks * nbytes
    if name == "asa":
        alltoall = ranks_per_node * (n - 1) / n * nbytes
        return alltoall + allgather_link_bytes(nbytes, nodes=n, ranks_per_node=ranks_per_node)
    raise ConfigError(
        f"No traffic model for allreduce algorithm {algorithm!r}; use one of "
        f"{', '.join(MODELS)} or hierarchical[<node>/<world>] (for 'auto', pass the "
        "algorithm it chose)."
    )


def allgather_link_bytes(
    nbytes: float, *, nodes: int, ranks_per_node: int, schedule: str = "ring"
) -> float:
    """Bytes node 0 sends over its link in an allgather of ``nbytes`` (``P`` blocks of ``nbytes/P``).

    Schedules (step ``k``, distance ``d = 2^k``, rank ``r``):

    * ``ring``: ``P - 1`` steps, each rank sends one block to ``r + 1``;
    * ``recursive_doubling``: ``r`` sends its ``d`` blocks to ``r XOR d`` (``P`` a power of 2);
    * ``bruck``: ``r`` sends ``min(d, P - d)`` blocks to ``r - d``.

    Open MPI's ``Allgatherv`` picks among these by size and rank count; the
    last two are not topology-aware, so more than ``(P-1)/P nbytes`` can cross.

    Args:
        nbytes: Bytes of the gathered result (every rank contributes ``nbytes / P``).
        nodes: Number of nodes.
        ranks_per_node: Ranks on each node (``P = nodes * ranks_per_node``).
        schedule: ``"ring"``, ``"recursive_doubling"`` or ``"bruck"``.

    Returns:
        Bytes node 0 sends off-node (by symmetry, what it also receives).

    Example:
        >>> from ddl_tf.cluster.traffic import allgather_link_bytes
        >>> [allgather_link_bytes(8, nodes=2, ranks_per_node=4, schedule=s)
        ...  for s in ("ring", "recursive_doubling", "bruck")]
        [7.0, 16.0, 21.0]

    Raises:
        ConfigError: An unknown schedule, recursive doubling on a ``P`` that is
            not a power of 2, or ``nodes``/``ranks_per_node`` < 1.
    """
    _check(nodes, ranks_per_node)
    ranks = nodes * ranks_per_node

    def off_node(peer: int) -> bool:
        return peer % ranks // ranks_per_node != 0

    mine = range(ranks_per_node)  # node 0's ranks
    if schedule == "ring":
        blocks = (ranks - 1) * sum(off_node(r + 1) for r in mine)
    elif schedule == "recursive_doubling" and ranks & (ranks - 1) == 0:
        blocks, d = 0, 1
        while d < ranks:
            blocks += d * sum(off_node(r ^ d) for r in mine)
            d *= 2
    elif schedule == "bruck":
        blocks, d = 0, 1
        while d < ranks:
            blocks += min(d, ranks - d) * sum(off_node(r - d) for r in mine)
            d *= 2
    else:
        raise ConfigError(
            f"Unknown allgather schedule {schedule!r} for {ranks} ranks; use ring, bruck or "
            "recursive_doubling (the last only for a power-of-2 number of ranks)."
        )
    return blocks * nbytes / ranks


def _check(nodes: int, ranks_per_node: int) -> None:
    if nodes < 1 or ranks_per_node < 1:
        raise ConfigError(
            f"A layout needs at least one node and one rank per node. Received "
            f"nodes={nodes}, ranks_per_node={ranks_per_node}."
        )
