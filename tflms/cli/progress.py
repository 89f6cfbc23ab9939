"""A quiet progress indicator for the command line: stderr, TTY only, after a delay.

Small models are analysed in well under a second; printing progress for them
would only add noise. :class:`Progress` therefore shows nothing until the
work has taken ``delay`` seconds, and nothing at all unless the stream is a
terminal (logs and pipes stay clean). Then a background thread redraws one
line - a spinner, the elapsed time and the current stage - five times a
second, and the line is erased when the work is done. The line is cut to the
terminal's width (the stage text is shortened, the elapsed time kept): a line
that wrapped would leave a row behind at every redraw.

Example:
    >>> import io
    >>> stream = io.StringIO()  # not a TTY: nothing is ever written
    >>> with Progress(stream, delay=0) as progress:
    ...     progress.stage("analysing")
    >>> stream.getvalue()
    ''
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time

__all__ = ["Progress"]

_SPINNER = "|/-\\"


class Progress:
    """Context manager drawing ``tflms: <stage> ... 3.2s`` on a TTY stream.

    Args:
        stream: where to draw (the CLI passes ``sys.stderr``).
        delay: seconds of work before anything is drawn.
        interval: seconds between redraws.
        enabled: ``False`` turns it off whatever the stream.
    """

    def __init__(self, stream, *, delay: float = 1.0, interval: float = 0.2, enabled: bool = True):
        isatty = getattr(stream, "isatty", None)
        self.active = bool(enabled and isatty is not None and isatty())
        self.stream = stream
        self.delay = delay
        self.interval = interval
        self._stage = ""
        self._start = 0.0
        self._drawn = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def stage(self, text: str) -> None:
        """Set the text shown for the current stage.

        Args:
            text: Short description of the work in progress (the next redraw
                shows it; the elapsed time keeps running).
        """
        self._stage = text

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.active:
            self._thread = threading.Thread(target=self._run, name="tflms-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._drawn:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        for frame in itertools.cycle(_SPINNER):
            with self._lock:
                elapsed = time.monotonic() - self._start
                line = _fitted(
                    f"tflms: {frame} ", self._stage, f" ... {elapsed:.1f}s", self._width()
                )
                self.stream.write(f"\r\x1b[2K{line}")
                self.stream.flush()
                self._drawn = True
            if self._stop.wait(self.interval):
                return

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # no descriptor (a test's stream)
            columns = 0
        return columns if columns > 0 else shutil.get_terminal_size().columns  # $COLUMNS, 80


def _fitted(head: str, stage: str, tail: str, width: int) -> str:
    """``head + stage + tail`` in ``width - 1`` columns (the last one left free: no wrap)."""
    room = width - 1 - len(head) - len(tail)
    if len(stage) > room:
        stage = stage[: room - 3] + "..." if room > 3 else ""
    return (head + stage + tail)[: max(width - 1, 0)]
