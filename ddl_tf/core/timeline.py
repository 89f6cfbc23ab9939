"""Chrome-trace timeline of every collective's phases (``--timeline``/``DDL_TIMELINE``).

Each rank streams complete events (``"ph": "X"``) to its own file
``<name>.rank<N>.json`` in the Trace Event *array* format, whose closing
bracket is optional, so the file stays loadable after a crash. At a clean
shutdown the engine gathers every rank's events to rank 0, which writes the
merged trace to the requested path atomically (one process row per rank) and
removes the per-rank files. Open it in ``chrome://tracing`` or
https://ui.perfetto.dev.

Phases: the collective itself (``allreduce 'name'``), and inside it
``negotiate``, ``pack``, ``compress``, the algorithm's ``reduce_scatter`` /
``alltoall`` / ``local_reduce`` / ``allreduce`` / ``allgather`` steps (with
the level and algorithm in ``args``), ``decompress`` and ``unpack``, on
thread 0. Instant events (``"ph": "i"``) mark moments, e.g. ``gradients
ready`` for each overlapped bucket (:mod:`ddl_tf.tensorflow.overlap`) on thread 1
("gradients"). Events may come from several TensorFlow threads at once;
writes are serialized.

Example:
    >>> import json, tempfile, pathlib
    >>> from ddl_tf.core.timeline import Timeline, merge_traces
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "trace.json"
    >>> tl = Timeline(path, rank=0, host="h")
    >>> with tl.phase("allreduce 'x'", bytes=16):
    ...     pass
    >>> events = tl.close()
    >>> merge_traces(path, [events])
    >>> [e["name"] for e in json.loads(path.read_text())["traceEvents"]]
    ['process_name', "allreduce 'x'"]
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Timeline", "NullTimeline", "Tracer", "NULL_TRACER", "merge_traces", "rank_path"]


def rank_path(path: str | Path, rank: int) -> Path:
    """Per-rank stream of ``path``: ``trace.json`` -> ``trace.rank3.json``.

    Args:
        path: The trace file the user named (``DDL_TIMELINE``); no suffix gives ``.json``.
        rank: This process's rank.

    Returns:
        The path of this rank's own trace file, next to ``path``.
    """
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.json'}")


class NullTimeline:
    """Timeline that records nothing (the default); ``phase`` costs one call."""

    enabled = False
    _null = contextlib.nullcontext()

    def phase(self, name: str, **args: Any):
        """A no-op context manager (the shape of :meth:`Timeline.phase`).

        Args:
            name: Ignored.
            **args: Ignored.

        Returns:
            One shared ``contextlib.nullcontext``.
        """
        return self._null

    def instant(self, name: str, tid: int = 0, **args: Any) -> None:
        """Record nothing (the shape of :meth:`Timeline.instant`).

        Args:
            name: Ignored.
            tid: Ignored.
            **args: Ignored.
        """
        return None

    def close(self) -> list[dict]:
        return []


class Timeline:
    """Records phases of this rank and streams them to :func:`rank_path`.

    Args:
        path: Merged trace file (the per-rank stream lives next to it).
        rank: This rank (the trace's process id).
        host: Host name shown in the process label.
    """

    enabled = True

    def __init__(self, path: str | Path, rank: int, host: str = "") -> None:
        self.path = Path(path)
        self.rank = rank
        self.stream_path = rank_path(self.path, rank)
        self.stream_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.stream_path.open("w", buffering=1)  # line-buffered: survives aborts
        self._epoch_us = time.time_ns() / 1000.0
        self._origin_ns = time.perf_counter_ns()
        self._first = True
        self._write_lock = threading.Lock()
        self._write(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "args": {"name": f"rank {rank} {host}"},
            }
        )

    def _now_us(self) -> float:
        return self._epoch_us + (time.perf_counter_ns() - self._origin_ns) / 1000.0

    def _write(self, event: dict) -> None:
        line = json.dumps(event) + "\n"
        with self._write_lock:
            if self._file.closed:
                return
            self._file.write(("[" if self._first else ",") + line)
            self._first = False

    def instant(self, name: str, tid: int = 0, **args: Any) -> None:
        """Record the present moment as an instant event ``name`` on thread ``tid``.

        Args:
            name: Event name shown in the trace viewer.
            tid: Trace thread id (0 is the training thread).
            **args: JSON-serializable values stored as the event's ``args``.
        """
        self._write(
            {
                "name": name,
                "ph": "i",
                "s": "t",
                "ts": round(self._now_us(), 3),
                "pid": self.rank,
                "tid": tid,
                "args": args,
            }
        )

    @contextlib.contextmanager
    def phase(self, name: str, **args: Any):
        """Record the enclosed block as one complete event named ``name``.

        Args:
            name: Event name shown in the trace viewer.
            **args: JSON-serializable values stored as the event's ``args``.

        Yields:
            None; the event lasts as long as the ``with`` block.
        """
        start = self._now_us()
        try:
            yield
        finally:
            self._write(
                {
                    "name": name,
                    "ph": "X",
                    "ts": round(start, 3),
                    "dur": round(self._now_us() - start, 3),
                    "pid": self.rank,
                    "tid": 0,
                    "args": args,
                }
            )

    def close(self) -> list[dict]:
        """Finish this rank's stream and return its events (for :func:`merge_traces`).

        Events are read back from the stream, so a long run does not keep them in
        memory. Later calls return an empty list.
        """
        with self._write_lock:
            if self._file.closed:
                return []
            self._file.write("]\n")
            self._file.close()
        return json.loads(self.stream_path.read_text())


class Tracer:
    """What algorithms record phases through: ``with tracer("phase", **args):``.

    The engine points it at its current timeline (``start_timeline`` swaps it);
    hot paths test :attr:`enabled` first to skip the context manager entirely.
    """

    __slots__ = ("timeline",)

    def __init__(self, timeline: Timeline | NullTimeline | None = None) -> None:
        self.timeline = timeline if timeline is not None else NullTimeline()

    @property
    def enabled(self) -> bool:
        return self.timeline.enabled

    def __call__(self, name: str, **args: Any):
        return self.timeline.phase(name, **args)


NULL_TRACER = Tracer()


def merge_traces(path: str | Path, per_rank_events: list[list[dict]]) -> None:
    """Write all ranks' events to ``path`` atomically and drop the per-rank streams.

    Args:
        path: The merged trace (the ``--timeline`` path); replaced whole.
        per_rank_events: Every rank's events, in rank order.

    Raises:
        OSError: ``path`` cannot be written; it is then left as it was.
    """
    path = Path(path)
    events = [event for rank_events in per_rank_events for event in rank_events]
    _replace_file(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    for rank in range(len(per_rank_events)):
        with contextlib.suppress(FileNotFoundError):
            rank_path(path, rank).unlink()


def _replace_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a synced temporary file in its folder (atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
