"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one helper every writer of this distribution uses (tflms results and
plots, ddl_tf timelines, the benchmarks and the demo): the data goes to a
temporary file in the destination's folder, is flushed to disk, and is then
renamed over the destination, which POSIX makes atomic on one file system.
If anything fails, the temporary file is removed and the destination is left
as it was.

Example:
    >>> import json, os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "sub", "result.json")
    >>> write_json(path, {"peak_bytes": 1024})
    >>> json.load(open(path))
    {'peak_bytes': 1024}
    >>> write_atomic(path, b"raw bytes")
    >>> open(path, "rb").read(), sorted(os.listdir(os.path.dirname(path)))
    (b'raw bytes', ['result.json'])
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["write_atomic", "write_json"]


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically, creating missing parent folders.

    Args:
        path: the destination file; replaced whole if it exists.
        data: text (written as UTF-8) or bytes.

    Raises:
        OSError: the folder cannot be created or written; the destination
            is then unchanged and no temporary file is left behind.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 1) -> None:
    """Write ``data`` as JSON (plus a final newline) to ``path`` atomically.

    Args:
        path: the destination file.
        data: anything ``json.dumps`` accepts.
        indent: passed to ``json.dumps``.

    Raises:
        TypeError: ``data`` is not JSON-serializable (nothing is written).
        OSError: as for :func:`write_atomic`.
    """
    write_atomic(path, json.dumps(data, indent=indent) + "\n")
