"""The engine's runtime state and the critical section every collective runs in.

:class:`EngineState` is what a collective may change about the engine: its
lock, the failure that left the ranks out of step, and whether it was shut
down. One :class:`CollectiveGuard` per call (a plain class, not a generator-based
context manager: this is on every collective's path). It takes the engine
lock, refuses to run after an unrecoverable failure or a shutdown, opens the
timeline phase, negotiates the collective's descriptor across ranks, and on
the way out marks the engine failed if an MPI or data error escaped, since the
ranks may no longer be in step. A mismatch or a refusal leaves the engine
usable: every rank saw the same verdict before any data moved.

A rank whose own arguments are invalid passes the error in (``error=``): it
still negotiates, so every rank raises it, and only then raises it itself.

Example:
    >>> import numpy as np
    >>> from ddl_tf.core.collectives.guard import layout_text
    >>> layout_text([np.zeros((3, 4), np.float32), np.zeros((), np.int64)])
    'float32[3, 4], int64[]'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import numpy as np

from ddl_tf.core.collectives.join import send_arguments
from ddl_tf.core.collectives.negotiation import OK_JOINED
from ddl_tf.core.numerics.mpi import is_process_failure
from ddl_tf.errors import DDLError, HorovodInternalError, StallError

__all__ = ["CollectiveGuard", "CollectiveStats", "EngineState", "layout_text"]


class CollectiveStats:
    """Calls and wall seconds per collective kind on this rank (negotiation and waiting included).

    Example:
        >>> stats = CollectiveStats()
        >>> stats.record("allreduce", 0.25); stats.record("allreduce", 0.5)
        >>> stats.snapshot()
        {'allreduce': {'calls': 2, 'seconds': 0.75}}
    """

    __slots__ = ("_calls", "_seconds")

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._seconds: dict[str, float] = {}

    def record(self, kind: str, seconds: float) -> None:
        """Count one call of ``kind`` taking ``seconds``.

        Args:
            kind: The collective kind (``"allreduce"``, ``"broadcast"``...).
            seconds: Wall seconds it took, negotiation and waiting included.
        """
        self._calls[kind] = self._calls.get(kind, 0) + 1
        self._seconds[kind] = self._seconds.get(kind, 0.0) + seconds

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {
            k: {"calls": self._calls[k], "seconds": self._seconds[k]} for k in sorted(self._calls)
        }

    def reset(self) -> None:
        self._calls.clear()
        self._seconds.clear()


class EngineState:
    """The engine's runtime state: one lock, a failure, a shutdown flag.

    Collectives run one at a time under :attr:`lock` (re-entrant: shutdown
    runs a collective while holding it). After an MPI or data error escaped a
    collective (:attr:`failure`), the ranks may no longer be in step, so every
    later collective is refused; after :meth:`close`, likewise.

    Example:
        >>> state = EngineState()
        >>> state.mark_failed(RuntimeError("lost rank 1"))
        >>> state.check_usable("allreduce")
        Traceback (most recent call last):
        ...
        ddl_tf.errors.DDLError: ddl_tf cannot run allreduce after an earlier failure (RuntimeError('lost rank 1')); the ranks are no longer in step. Restart the job.
    """

    __slots__ = ("lock", "failure", "closed", "negotiated", "lost")

    def __init__(self, lock: Any = None) -> None:
        self.lock = lock if lock is not None else threading.RLock()
        self.failure: BaseException | None = None
        self.closed = False
        # set by join(): the next collective was negotiated by the active ranks already
        self.negotiated = False
        # an elastic job's membership lost a rank: its communicators are revoked
        self.lost = False

    def mark_failed(self, error: BaseException) -> None:
        """Record that ``error`` left the ranks out of step; later collectives are refused."""
        self.failure = error

    def close(self) -> None:
        """Record the shutdown; later collectives are refused until ``init()`` runs again."""
        self.closed = True

    def mark_lost(self) -> None:
        """Record that the (elastic) membership lost a rank; later collectives raise
        :class:`~ddl_tf.errors.HorovodInternalError` until the job is re-formed."""
        self.lost = self.closed = True

    def check_usable(self, kind: str) -> None:
        """Raise when a collective of ``kind`` may not run (a failure or a shutdown).

        Raises:
            DDLError: after a failure or a shutdown, naming what to do.
        """
        if self.lost:
            raise HorovodInternalError(
                f"ddl_tf cannot run {kind}: this membership of the elastic job lost a rank. "
                "hvd.elastic.run re-forms the job; call collectives inside the function it runs."
            )
        if self.failure is not None:
            raise DDLError(
                f"ddl_tf cannot run {kind} after an earlier failure "
                f"({self.failure!r}); the ranks are no longer in step. Restart the job."
            )
        if self.closed:
            raise DDLError(f"ddl_tf was shut down; cannot run {kind}. Call init() again.")


class CollectiveGuard:
    """One collective's critical section (a plain class: this is on every call's path)."""

    __slots__ = ("engine", "kind", "name", "fields", "summary", "error", "phase", "start")

    def __init__(
        self, engine: Any, kind: str, name, fields: tuple, summary, error: DDLError | None = None
    ) -> None:
        self.engine, self.kind, self.name, self.fields, self.summary = (
            engine,
            kind,
            name,
            fields,
            summary,
        )
        self.error = error
        self.phase: AbstractContextManager[Any] | None = None
        self.start = 0.0

    def __enter__(self) -> CollectiveGuard:
        engine = self.engine
        engine.state.lock.acquire()
        self.start = time.perf_counter()
        try:
            engine.state.check_usable(self.kind)
            timeline = engine.timeline
            if timeline.enabled:
                label = f"{self.kind} {self.name!r}" if self.name else self.kind
                self.phase = timeline.phase(label, kind=self.kind)
                self.phase.__enter__()
            if engine.state.negotiated:  # a joined rank running the active ranks' collective
                engine.state.negotiated = False
            elif engine.negotiator is not None:
                descriptor = engine.descriptor(
                    self.kind, self.name, self.fields, self.summary, self.error
                )
                if timeline.enabled:
                    with timeline.phase("negotiate"):
                        verdict = engine.negotiator.negotiate(descriptor)
                else:
                    verdict = engine.negotiator.negotiate(descriptor)
                if verdict.kind == OK_JOINED:
                    send_arguments(engine, verdict.ranks, self.kind, self.name, self.fields)
            if self.error is not None:  # one rank, or checks off: nobody else to tell
                raise self.error
        except BaseException as err:
            if isinstance(err, StallError):
                engine.state.mark_failed(err)
            self.__exit__(type(err), err, err.__traceback__, False)  # entered=False
            raise
        return self

    def __exit__(self, exc_type, exc, tb, entered: bool = True) -> Literal[False]:
        engine = self.engine
        lost = engine.elastic and exc is not None and is_process_failure(exc)
        if entered and exc is not None and isinstance(exc, Exception) and not lost:
            if not isinstance(exc, DDLError):  # an MPI or data error mid-collective
                engine.state.mark_failed(exc)
        try:
            if lost:  # tell every rank, even those waiting on healthy peers, then give up
                engine.revoke()
            if entered:
                engine.stats.record(self.kind, time.perf_counter() - self.start)
            if self.phase is not None:
                self.phase.__exit__(exc_type, exc, tb)
        finally:
            engine.state.lock.release()
        if lost:
            raise HorovodInternalError(
                f"rank {engine.rank}: {self.kind}{f' {self.name!r}' if self.name else ''} met "
                f"a failed rank ({exc}); the job's communicators are revoked. hvd.elastic.run "
                "restores the last commit and re-forms the job without the failed host."
            ) from exc
        return False


def layout_text(arrays: Sequence[np.ndarray], limit: int = 4) -> str:
    """``float32[3, 4], int64[] (+5 more)``: readable tensor list for error messages.

    Args:
        arrays: The arrays to describe.
        limit: How many to list before ``(+k more)``.

    Returns:
        Each array's dtype and shape, comma-separated; ``"nothing"`` for an
        empty sequence.
    """
    shown = [f"{a.dtype}[{', '.join(map(str, a.shape))}]" for a in arrays[:limit]]
    more = f" (+{len(arrays) - limit} more)" if len(arrays) > limit else ""
    return ", ".join(shown) + more if arrays else "nothing"
