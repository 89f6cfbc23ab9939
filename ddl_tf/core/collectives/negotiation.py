"""Check every collective across ranks before moving data: mismatches become errors, stalls warnings.

Before each collective, every rank sends a fixed-size *descriptor* (sequence
number, a digest of kind/name/shapes/dtypes/op, and a readable summary) to
rank 0 on a dedicated communicator; rank 0 compares them and answers every
rank with a verdict. So:

* ranks that issue different collectives (shape, dtype, name, op or order)
  all raise :class:`~ddl_tf.errors.CollectiveMismatchError` naming who issued
  what, instead of deadlocking inside MPI;
* a rank that found its own arguments invalid (alltoall splits that do not add
  up, an unsupported op) still takes part: its descriptor carries the error,
  and every rank raises that error (same class, message naming the rank)
  instead of the others waiting for a rank that left. The refusal wins over a
  mismatch, since the refusing rank usually did not build the same descriptor;
* while some ranks have not arrived, rank 0 knows exactly which, logs a
  warning naming them every ``stall_warning_seconds`` and forwards the list to
  the waiting ranks, which log it too; after ``stall_shutdown_seconds`` (if
  set) every waiting rank raises :class:`~ddl_tf.errors.StallError`;
* a rank that called ``join()`` (it ran out of data) presents a *join*
  descriptor until every rank has: rank 0 compares only the others'
  descriptors, tells the joined ranks to take part in an allreduce with zeros
  (the lowest active rank sends them its arguments), refuses any other
  collective while some rank has joined (Horovod's semantics), and when every
  rank has joined answers each with the last rank to join.

Cost: two small messages per rank per collective (Horovod's coordinator does
the same), which is why the engine negotiates once per grouped call, not per
tensor. Waiting polls with a short spin, then yields, then sleeps at most
1 ms between polls; each poll checks the deadlines.

Example:
    >>> from ddl_tf.core.collectives.negotiation import Descriptor
    >>> d = Descriptor.make("allreduce", "grads", ("float32", (3, 4)), "op=sum")
    >>> d.summary
    "allreduce 'grads' ('float32', (3, 4)) op=sum"
    >>> len(d.encode(seq=7)), Descriptor.decode(d.encode(seq=7)).seq
    (512, 7)
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ddl_tf.core.numerics import mpi
from ddl_tf.errors import (
    CollectiveArgumentError,
    CollectiveMismatchError,
    ConfigError,
    DDLError,
    StallError,
    UnsupportedError,
)

__all__ = [
    "Descriptor",
    "Decoded",
    "Negotiator",
    "Verdict",
    "DESCRIPTOR_BYTES",
    "REFUSALS",
    "JOINABLE",
]

logger = logging.getLogger(__name__)

DESCRIPTOR_BYTES = 512
_HEADER = struct.Struct("<q16sBB")
_SUMMARY_BYTES = DESCRIPTOR_BYTES - _HEADER.size
_VERDICT_BYTES = 8192
_TAG_DESCRIPTOR, _TAG_VERDICT, TAG_JOIN_SPEC = 101, 102, 103
_OK, _STALL, _MISMATCH, _ABORT, _REFUSED = 0, 1, 2, 3, 4
# verdicts while some rank has joined (see Verdict)
OK_JOINED, PARTICIPATE, SKIP, ALL_JOINED = 5, 6, 7, 8
_FLAG_JOINED, _FLAG_JOINABLE = 1, 2

JOINABLE = frozenset({"allreduce"})
"""Collectives that ranks which called ``join()`` take part in (with zeros), as in Horovod."""

REFUSALS: tuple[type[DDLError], ...] = (CollectiveArgumentError, UnsupportedError, ConfigError)
"""Error classes a rank can refuse a collective with; the wire carries the index + 1."""


class Decoded(NamedTuple):
    """A descriptor as received: sequence number, digest, error code (0: none), flags, text."""

    seq: int
    digest: bytes
    error: int
    flags: int
    text: str


class Verdict(NamedTuple):
    """What :meth:`Negotiator.negotiate` returns when no error is raised.

    ``kind`` is ``_OK`` (0) in the common case. While some rank has joined:
    ``OK_JOINED`` for the active ranks (``ranks`` = the joined ones);
    ``PARTICIPATE`` for joined ranks (``ranks`` = ``(leader,)``, the active
    rank that sends them the collective's arguments); ``SKIP`` for joined
    ranks when the active ranks' collective was refused; ``ALL_JOINED`` once
    every rank has joined (``ranks`` = ``(last rank to join,)``).
    """

    kind: int
    ranks: tuple[int, ...] = ()


_PLAIN = Verdict(_OK)


@dataclass(frozen=True)
class Descriptor:
    """What one rank is about to do: a digest for comparison and a summary for people.

    ``error`` is 0, or the code (index + 1 in :data:`REFUSALS`) of the error this rank
    found in its own arguments; ``summary`` then holds that error's message.
    """

    digest: bytes
    summary: str
    error: int = 0
    flags: int = 0

    @classmethod
    def make(
        cls, kind: str, name: str | None, *fields: Any, summary: str | None = None
    ) -> Descriptor:
        """Describe a collective; ``fields`` (shapes, dtypes, op, ...) enter the digest.

        ``summary`` replaces the default readable text (the fields joined by spaces).

        Args:
            kind: The collective (``"allreduce"``, ``"broadcast"``...).
            name: The user's name for the call, or None.
            *fields: Whatever must match on every rank (shapes, dtypes, reduce
                op...); hashed into the digest.
            summary: Readable description shown in mismatch errors; None joins the
                fields with spaces.

        Returns:
            The descriptor (digest and summary).
        """
        label = f"{kind} {name!r}" if name else kind
        text = " ".join([label, summary if summary is not None else " ".join(map(str, fields))])
        digest = hashlib.blake2b(repr((kind, name, fields)).encode(), digest_size=16).digest()
        return cls(digest, text, flags=_FLAG_JOINABLE if kind in JOINABLE else 0)

    @classmethod
    def joined(cls) -> Descriptor:
        """The descriptor of a rank inside ``join()``: it has no data left."""
        return cls(b"\1" * 16, "join", flags=_FLAG_JOINED)

    @classmethod
    def refusal(cls, kind: str, name: str | None, error: DDLError) -> Descriptor:
        """Describe a collective this rank cannot run because of ``error`` (one of REFUSALS).

        Args:
            kind: The collective.
            name: The user's name for the call, or None.
            error: Why this rank refuses; its class (index in ``REFUSALS``) is
                re-raised on every rank.

        Returns:
            A descriptor carrying the error code and message, never matching a
            real digest.
        """
        code = next((i + 1 for i, c in enumerate(REFUSALS) if isinstance(error, c)), 1)
        label = f"{kind} {name!r}" if name else kind
        return cls(b"\0" * 16, f"{label}: {type(error).__name__}: {error}", code)

    def encode(self, seq: int) -> bytes:
        """Fixed-size wire form: sequence number, digest, error code, summary (truncated).

        Args:
            seq: The negotiation sequence number of this call.

        Returns:
            ``DESCRIPTOR_BYTES`` bytes; the summary is cut to fit.
        """
        summary = self.summary.encode()[:_SUMMARY_BYTES]
        header = _HEADER.pack(seq, self.digest, self.error, self.flags)
        return header + summary.ljust(_SUMMARY_BYTES, b"\0")

    @staticmethod
    def decode(raw: bytes) -> Decoded:
        """:class:`Decoded` from :meth:`encode`'s output.

        Args:
            raw: Bytes written by :meth:`encode`.

        Returns:
            Sequence number, digest, error code and summary text.
        """
        seq, digest, error, flags = _HEADER.unpack(raw[: _HEADER.size])
        text = raw[_HEADER.size :].rstrip(b"\0").decode(errors="replace")
        return Decoded(seq, digest, error, flags, text)


class _Waiter:
    """Poll politely: spin briefly, then yield, then sleep up to 1 ms."""

    def __init__(self) -> None:
        self.polls = 0
        self.started = time.monotonic()

    def pause(self) -> None:
        self.polls += 1
        if self.polls < 200:
            return
        waited = time.monotonic() - self.started
        if waited < 0.002:
            os.sched_yield()
        else:
            time.sleep(min(0.001, 0.00005 * 2 ** min(self.polls // 200, 5)))


class Negotiator:
    """Runs the descriptor exchange on a dedicated control communicator.

    Args:
        comm: Control communicator (a duplicate of the job's; collective traffic
            of the data communicator never mixes with it).
        stall_warning_seconds: Interval of stall warnings.
        stall_shutdown_seconds: Wait after which :class:`StallError` is raised (0: never).
        shutdown_setting: The variable the shutdown wait was set with, named in the error.
    """

    def __init__(
        self,
        comm: Any,
        stall_warning_seconds: float,
        stall_shutdown_seconds: float,
        shutdown_setting: str = "DDL_STALL_SHUTDOWN_SECONDS",
    ) -> None:
        self.comm = comm
        self.shutdown_setting = shutdown_setting
        self.rank, self.size = comm.rank, comm.size
        self.warning = stall_warning_seconds
        self.shutdown = stall_shutdown_seconds
        self.seq = 0
        self._join_order: list[int] = []  # rank 0: ranks inside join(), in the order they came
        self._mine = np.zeros(DESCRIPTOR_BYTES, np.uint8)
        if self.rank == 0:
            self._rows = np.zeros((self.size, DESCRIPTOR_BYTES), np.uint8)
            self._recvs = [
                comm.Recv_init([self._rows[r], mpi.load().BYTE], r, _TAG_DESCRIPTOR)
                for r in range(1, self.size)
            ]
        else:
            self._verdict = np.zeros(_VERDICT_BYTES, np.uint8)
            self._send = comm.Send_init([self._mine, mpi.load().BYTE], 0, _TAG_DESCRIPTOR)
            self._recv = comm.Recv_init([self._verdict, mpi.load().BYTE], 0, _TAG_VERDICT)

    def negotiate(self, descriptor: Descriptor, limit: float | None = None) -> Verdict:
        """Block until every rank presents the same descriptor (or has joined).

        With one rank there is nobody to agree with: the call returns at once
        (the caller raises a refusal of its own).

        Args:
            descriptor: This rank's description of the collective it is about to
                run (or its refusal, or :meth:`Descriptor.joined`).
            limit: Wait at most this long (as ``stall_shutdown_seconds`` does;
                the shorter of the two wins), e.g. a failed engine's shutdown.

        Returns:
            The :class:`Verdict`: plain (kind 0) unless some rank has joined.

        Raises:
            CollectiveMismatchError: Some rank presented a different one.
            CollectiveArgumentError, UnsupportedError, ConfigError: Some rank
                refused the collective (:meth:`Descriptor.refusal`), or it is not
                one joined ranks take part in; on every active rank.
            StallError: Ranks were missing for ``stall_shutdown_seconds``.
        """
        self.seq += 1
        if self.size == 1:
            return Verdict(ALL_JOINED, (0,)) if descriptor.flags & _FLAG_JOINED else _PLAIN
        self._mine[:] = np.frombuffer(descriptor.encode(self.seq), np.uint8)
        configured = self.shutdown
        if limit is not None:
            self.shutdown = min(configured, limit) if configured else limit
        try:
            if self.rank == 0:
                kind, code, text = self._coordinate(descriptor)
            else:
                kind, code, text = self._follow(descriptor)
        finally:
            self.shutdown = configured
        if kind == _OK:
            return _PLAIN
        if kind in (OK_JOINED, PARTICIPATE, SKIP, ALL_JOINED):
            return Verdict(kind, tuple(int(r) for r in text.split(",") if r))
        _raise_verdict(kind, code, text)
        raise AssertionError("unreachable")  # pragma: no cover

    def abandon(self) -> None:
        """Cancel and free the persistent requests after a failure (local; errors ignored).

        A request left active on a revoked communicator would keep
        ``MPI_Finalize`` waiting at exit.
        """
        MPI = mpi.load()
        for request in self._recvs if self.rank == 0 else [self._send, self._recv]:
            for step in (request.Cancel, request.Free):
                try:
                    step()
                except MPI.Exception:
                    pass

    def close(self) -> None:
        """Free the persistent requests (before the communicator is freed)."""
        for request in self._recvs if self.rank == 0 else [self._send, self._recv]:
            request.Free()

    # ------------------------------------------------------------------ rank 0

    def _coordinate(self, descriptor: Descriptor) -> tuple[int, int, str]:
        MPI = mpi.load()
        MPI.Prequest.Startall(self._recvs)
        pending = set(range(1, self.size))
        sends: list[Any] = []
        start = time.monotonic()
        next_warning = start + self.warning
        waiter = _Waiter()
        while pending:
            done = MPI.Request.Testsome(self._recvs) or []
            for i in done:
                pending.discard(i + 1)
            if not pending:
                break
            now = time.monotonic()
            if now >= next_warning:
                missing = sorted(pending)
                logger.warning(
                    "collective #%d (%s) has waited %.0f s for rank(s) %s of %d; they are "
                    "slower, hung, or running different code",
                    self.seq,
                    descriptor.summary,
                    now - start,
                    _ranks(missing),
                    self.size,
                )
                note = f"rank 0 reports missing rank(s) {_ranks(missing)} after {now - start:.0f} s"
                sends += self._tell(set(range(1, self.size)) - pending, _STALL, 0, note)
                next_warning += self.warning
            if self.shutdown and now - start >= self.shutdown:
                message = (
                    f"collective #{self.seq} ({descriptor.summary}) stalled: rank(s) "
                    f"{_ranks(sorted(pending))} did not arrive within {self.shutdown:g} s "
                    f"({self.shutdown_setting}). Check those ranks' logs; raise the limit "
                    "if they were legitimately busy."
                )
                sends += self._tell(set(range(1, self.size)) - pending, _ABORT, 0, message)
                MPI.Request.Waitall(sends)
                raise StallError(message)
            waiter.pause()
        verdicts = self._compare()
        groups: dict[tuple[int, int, str], set[int]] = {}  # one payload per distinct verdict
        for rank in range(1, self.size):
            groups.setdefault(verdicts[rank], set()).add(rank)
        for verdict, ranks in groups.items():
            sends += self._tell(ranks, *verdict)
        MPI.Request.Waitall(sends)
        return verdicts[0]

    def _tell(self, ranks: set[int], kind: int, code: int, text: str) -> list[Any]:
        payload = np.frombuffer(
            bytes([kind, code]) + text.encode()[: _VERDICT_BYTES - 2], np.uint8
        ).copy()
        byte = mpi.load().BYTE
        return [self.comm.Isend([payload, byte], r, _TAG_VERDICT) for r in sorted(ranks)]

    def _compare(self) -> list[tuple[int, int, str]]:
        """One ``(verdict kind, error code, message)`` per rank for the descriptors they sent."""
        self._rows[0] = self._mine
        decoded = [Descriptor.decode(self._rows[r].tobytes()) for r in range(self.size)]
        joined = [r for r, d in enumerate(decoded) if d.flags & _FLAG_JOINED]
        self._join_order += [r for r in joined if r not in self._join_order]
        active = [r for r in range(self.size) if r not in joined]
        if not active:
            last, self._join_order = self._join_order[-1], []
            return [(ALL_JOINED, 0, str(last))] * self.size
        verdict = self._judge(decoded, active)
        if not joined:
            return [verdict] * self.size
        if verdict[0] == _OK and not all(decoded[r].flags & _FLAG_JOINABLE for r in active):
            verdict = (
                _REFUSED,
                REFUSALS.index(UnsupportedError) + 1,
                f"collective #{self.seq} ({decoded[active[0]].text}) cannot run while rank(s) "
                f"{_ranks(joined)} have called join(): ranks that joined take part only in "
                f"{', '.join(sorted(JOINABLE))} (with zeros), as in Horovod. Run it before "
                "join() on every rank, or after join() has returned everywhere.",
            )
        out: list[tuple[int, int, str]] = [(0, 0, "")] * self.size
        for r in active:
            out[r] = (OK_JOINED, 0, ",".join(map(str, joined))) if verdict[0] == _OK else verdict
        for r in joined:
            out[r] = (PARTICIPATE, 0, str(active[0])) if verdict[0] == _OK else (SKIP, 0, "")
        return out

    def _judge(self, decoded: list[Decoded], ranks: list[int]) -> tuple[int, int, str]:
        """The verdict over the descriptors of ``ranks`` (refusal, mismatch or agreement)."""
        refusing = [r for r in ranks if decoded[r].error]
        if refusing:
            first = decoded[refusing[0]]
            lines = [
                f"collective #{self.seq} was refused by rank(s) {_ranks(refusing)} before any "
                "data moved; every rank raises the error so that the ranks stay in step:"
            ]
            lines += [f"  rank {r}: {decoded[r].text}" for r in refusing[:8]]
            return _REFUSED, first.error, "\n".join(lines)
        keys = {r: (decoded[r].seq, decoded[r].digest) for r in ranks}
        if len(set(keys.values())) == 1:
            return _OK, 0, ""
        by_key: dict[tuple, list[int]] = {}
        for r, key in keys.items():
            by_key.setdefault(key, []).append(r)
        lines = [
            f"Ranks issued different collectives at collective #{self.seq} (ranks must issue "
            "the same collectives, with the same names, shapes, dtypes and ops, in the same "
            "order):"
        ]
        for group in list(by_key.values())[:8]:
            d = decoded[group[0]]
            lines.append(f"  rank(s) {_ranks(group)}: #{d.seq} {d.text}")
        return _MISMATCH, 0, "\n".join(lines)

    # ------------------------------------------------------------------ other ranks

    def _follow(self, descriptor: Descriptor) -> tuple[int, int, str]:
        MPI = mpi.load()
        self._send.Start()
        self._recv.Start()
        start = time.monotonic()
        heard_from_root = False
        next_warning = start + self.warning * 1.5
        limit = self.shutdown + max(5.0, self.warning) if self.shutdown else None
        waiter = _Waiter()
        status = MPI.Status()
        while True:
            if self._recv.Test(status):
                count = status.Get_count(MPI.BYTE)
                kind, code = int(self._verdict[0]), int(self._verdict[1])
                text = self._verdict[2:count].tobytes().decode(errors="replace")
                if kind == _STALL:
                    heard_from_root = True
                    if not descriptor.flags & _FLAG_JOINED:  # a joined rank waits by design
                        logger.warning(
                            "collective #%d (%s): %s", self.seq, descriptor.summary, text
                        )
                    self._recv.Start()
                    continue
                self._send.Wait()
                return kind, code, text
            now = time.monotonic()
            if now >= next_warning:
                if not heard_from_root:
                    logger.warning(
                        "collective #%d (%s) has waited %.0f s for rank 0, which coordinates "
                        "collectives and has not answered; rank 0 may be missing",
                        self.seq,
                        descriptor.summary,
                        now - start,
                    )
                next_warning += self.warning
            if limit is not None and now - start >= limit:
                raise StallError(
                    f"collective #{self.seq} ({descriptor.summary}): rank 0 did not answer "
                    f"within {limit:g} s ({self.shutdown_setting} plus grace); rank 0 is "
                    "missing or hung. Check rank 0's log."
                )
            waiter.pause()


def _raise_verdict(kind: int, code: int, text: str) -> None:
    if kind == _OK:
        return
    if kind == _MISMATCH:
        raise CollectiveMismatchError(text)
    if kind == _REFUSED:
        raise REFUSALS[code - 1](text) if 0 < code <= len(REFUSALS) else DDLError(text)
    raise StallError(text)


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:16])
    return shown + (f" (+{len(ranks) - 16} more)" if len(ranks) > 16 else "")
