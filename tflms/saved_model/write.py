"""Write a rewritten model safely: all or nothing, never over the source.

:func:`write_model` writes into a temporary directory (or file) *beside* the
destination, and renames it into place only once everything is written, so
a crash, a full disk or an interrupt never leaves a half-written model under
the destination's name. A SavedModel's other files (``variables/``,
``assets/``, anything else) are copied, never hard- or soft-linked, so the
new model does not share storage with the source. The destination is
refused when it exists (unless ``force``), is the source, lies inside it, or
contains it. With ``force`` the old destination is moved aside first and
restored if the final rename fails.

A TF2 SavedModel's ``fingerprint.pb`` hashes ``saved_model.pb``. TensorFlow
2.21 does not verify it on load (it only reports it to its metrics), but
serving systems use it to tell models apart, so a fresh one is computed
for the rewritten model (``fingerprinting.CreateFingerprintDef``, as
``tf.saved_model.save`` does) whenever the source had one.

Example:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> check_destination(root / "model", root / "model" / "lms", force=False)
    Traceback (most recent call last):
    ...
    tflms.errors.OutputError: The destination '.../model/lms' lies inside the source '.../model': ...
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from tflms.errors import OutputError
from tflms.saved_model.read import FINGERPRINT_PB, SAVED_MODEL_PB, SAVED_MODEL_PBTXT, Model

__all__ = ["write_model", "check_destination"]

logger = logging.getLogger(__name__)

_TMP_MARK = ".tflms-"


def check_destination(src, dst, *, force: bool) -> None:
    """Raise :class:`OutputError` unless ``dst`` may receive a model rewritten from ``src``.

    Args:
        src: Path of the source model.
        dst: Path to write the rewritten model to.
        force: Whether an existing ``dst`` may be replaced.

    Raises:
        OutputError: ``dst`` is ``src``, lies inside it or contains it, its
            folder does not exist, or it exists and ``force`` is False.
    """
    src_r, dst_r = Path(src).resolve(), Path(dst).resolve()
    if dst_r == src_r:
        raise OutputError(
            f"The destination '{dst}' is the source: tflms never modifies its input. Pass a new "
            f"path, e.g. `tflms rewrite {src} {Path(src).name}_lms`."
        )
    if src_r in dst_r.parents:
        raise OutputError(
            f"The destination '{dst}' lies inside the source '{src}': writing it would modify the "
            f"source. Write it beside the source, e.g. `tflms rewrite {src} {src_r.name}_lms`."
        )
    if dst_r in src_r.parents:
        raise OutputError(
            f"The destination '{dst}' contains the source '{src}': replacing it would delete the "
            "source. Pass a path outside it."
        )
    if not dst_r.parent.is_dir():
        raise OutputError(
            f"The destination's folder '{dst_r.parent}' does not exist. Create it first "
            f"(mkdir -p {dst_r.parent}) or pass another destination."
        )
    if (os.path.lexists(dst)) and not force:
        raise OutputError(
            f"The destination '{dst}' already exists. Pass --force to replace it, or choose "
            "another path."
        )


def write_model(model: Model, dst, *, force: bool = False) -> Path:
    """Write ``model`` (typically rewritten) to ``dst``; returns the written path.

    A SavedModel is written as a directory: its protobuf, a fresh fingerprint
    (if the source had one) and copies of every other file of the source
    directory. A GraphDef file is written as one file, in text format if
    ``dst`` ends in ``.pbtxt`` or ``.txt``, else binary.

    Args:
        model: The model to write.
        dst: Destination path (``str`` or ``Path``).
        force: Replace an existing ``dst`` (atomically: the old contents are
            restored if the write fails).

    Returns:
        ``dst`` as a ``Path``.

    Raises:
        OutputError: the destination is refused (see :func:`check_destination`)
            or a write failed; nothing is left at ``dst`` (or its previous
            contents are restored).
    """
    dst = Path(dst)
    check_destination(model.path, dst, force=force)
    try:
        with _staged(dst, directory=model.is_saved_model, force=force) as tmp:
            if model.is_saved_model:
                _fill_saved_model(model, tmp)
            else:  # a GraphDef file: text if DST says so (.pbtxt), else binary
                _write_bytes(tmp, model.serialize(text=dst.suffix in (".pbtxt", ".txt")))
    except OSError as err:
        reason = (
            "the disk is full"
            if err.errno in (errno.ENOSPC, errno.EDQUOT)
            else (err.strerror or str(err))
        )
        raise OutputError(
            f"Writing '{dst}' failed: {reason} ({err}). Nothing was written there"
            + (" and its previous contents are unchanged" if force and os.path.lexists(dst) else "")
            + "; free space or fix the problem and run the command again."
        ) from err
    logger.info("tflms: wrote %s", dst)
    return dst


@contextlib.contextmanager
def _staged(dst: Path, *, directory: bool, force: bool):
    parent = dst.resolve().parent
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}{_TMP_MARK}", dir=parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{dst.name}{_TMP_MARK}", dir=parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        _move_into_place(tmp, dst, force=force)
    except BaseException:
        _remove(tmp)
        raise


def _move_into_place(tmp: Path, dst: Path, *, force: bool) -> None:
    if not os.path.lexists(dst):
        os.rename(tmp, dst)
        return
    if not force:  # appeared while we were writing
        raise OutputError(
            f"The destination '{dst}' appeared while writing; pass --force to replace it."
        )
    backup = dst.resolve().parent / f".{dst.name}{_TMP_MARK}old-{uuid.uuid4().hex[:8]}"
    os.rename(dst, backup)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(backup, dst)
        raise
    _remove(backup)


def _fill_saved_model(model: Model, tmp: Path) -> None:
    src = model.path
    rewritten = {SAVED_MODEL_PB, SAVED_MODEL_PBTXT, FINGERPRINT_PB}
    # Linked files and folders are followed: the copy holds their contents, never a link.
    for folder, _dirs, files in os.walk(src, followlinks=True):
        rel = Path(folder).relative_to(src)
        (tmp / rel).mkdir(exist_ok=True)
        for name in files:
            if rel == Path(".") and name in rewritten:
                continue
            _copy_file(Path(folder) / name, tmp / rel / name)
    _write_bytes(tmp / model.proto_file.name, model.serialize())
    if model.had_fingerprint:
        fingerprint = _fingerprint(tmp)
        if fingerprint is not None:
            _write_bytes(tmp / FINGERPRINT_PB, fingerprint)


def _fingerprint(folder: Path) -> bytes | None:
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    try:
        return fingerprinting.CreateFingerprintDef(str(folder))
    except fingerprinting.FingerprintException as err:
        logger.warning(
            "tflms: no fingerprint.pb written (TensorFlow could not compute it: %s)", err
        )
        return None


def _copy_file(src, dst) -> None:
    shutil.copy2(src, dst)


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
