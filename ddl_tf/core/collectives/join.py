"""Horovod's ``join()``: a rank that ran out of data keeps the others' allreduces going.

A rank that calls :func:`join` presents a *join* descriptor to every
negotiation (:mod:`~ddl_tf.core.collectives.negotiation`) until all ranks have joined.
For each allreduce the other (active) ranks start meanwhile, rank 0's verdict
tells the joined ranks to take part, and the lowest active rank sends them the
collective's arguments (kind, name and the negotiated fields: dtypes, shapes,
op, compression, scale factors). A joined rank then runs the same allreduce on
zeros, through the same buckets and algorithms, so the data exchange is the
one the active ranks expect. As in Horovod, Average still divides by the job
size: a joined rank contributes zeros, not its absence. Any other collective
while some rank has joined is refused on the active ranks (the joined ranks
keep waiting). When the last rank joins, every rank's ``join()`` returns that
rank, typically to broadcast its variables from.

Example (one process: nobody to wait for):
    >>> from ddl_tf.core import basics
    >>> basics.init().join()
    0
    >>> basics.shutdown()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddl_tf.core.collectives.negotiation import (
    ALL_JOINED,
    JOINABLE,
    SKIP,
    TAG_JOIN_SPEC,
    Descriptor,
)
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.compression import Compression
from ddl_tf.errors import ConfigError

__all__ = ["join", "send_arguments"]

_JOINED = Descriptor.joined()


def join(engine: Any) -> int:
    """Take part, with zeros, in the other ranks' allreduces until every rank has joined.

    Args:
        engine: This rank's :class:`~ddl_tf.core.collectives.engine.Engine`.

    Returns:
        The rank that joined last (the same on every rank).

    Raises:
        ConfigError: Collective checks are off (``DDL_CHECK_COLLECTIVES=0``),
            which ``join()`` needs to learn what the other ranks run.
        StallError: Ranks stayed away for ``stall_shutdown_seconds``.
    """
    if engine.size == 1:
        return 0
    if engine.negotiator is None:
        raise ConfigError(
            "join() needs the collective checks, which tell a joined rank what the others "
            "run. Received DDL_CHECK_COLLECTIVES=0; unset it (checks are on by default)."
        )
    state = engine.state
    with state.lock:
        state.check_usable("join")
        while True:
            verdict = engine.negotiator.negotiate(_JOINED)
            if verdict.kind == ALL_JOINED:
                return verdict.ranks[0]
            if verdict.kind == SKIP:  # the active ranks' collective was refused
                continue
            kind, name, fields = engine.comms.control.recv(
                source=verdict.ranks[0], tag=TAG_JOIN_SPEC
            )
            state.negotiated = True  # the active ranks negotiated it; run it, do not renegotiate
            try:
                _with_zeros(engine, kind, name, fields)
            finally:
                state.negotiated = False


def send_arguments(engine: Any, joined: tuple[int, ...], kind: str, name, fields: tuple) -> None:
    """On the lowest active rank: send a joinable collective's arguments to the joined ranks.

    Args:
        engine: This rank's engine.
        joined: Ranks inside ``join()``.
        kind: The collective (one of :data:`~ddl_tf.core.collectives.negotiation.JOINABLE`).
        name: Its name.
        fields: Its negotiated fields (everything but the data).
    """
    leader = min(set(range(engine.size)) - set(joined))
    if engine.rank != leader:
        return
    for rank in joined:
        engine.comms.control.send((kind, name, fields), dest=rank, tag=TAG_JOIN_SPEC)


def _with_zeros(engine: Any, kind: str, name, fields: tuple) -> None:
    assert kind in JOINABLE, kind  # rank 0 refuses the rest
    layout, op, compression, prescale, postscale = fields
    spec = ReduceSpec(
        op=op,
        compressor=Compression.get(compression),
        prescale_factor=prescale,
        postscale_factor=postscale,
    )
    engine.allreduce([np.zeros(shape, dtype) for dtype, shape in layout], spec, name=name)
