"""Each rank's last commit, mirrored in its host's memory, for a relaunch after a node crash.

Open MPI 5.0's runtime (PRRTE) ends every rank of a job when it loses one
of its daemons, which is what a node crash does: the survivors' processes,
and the commits they held, are gone with them. So at each ``commit()`` every
rank of an elastic job launched by ``ddlrun`` also writes the committed
values to a file in its host's memory (``DDL_ELASTIC_MIRROR``, a folder in
``/dev/shm``: tmpfs, no disk), replacing the previous one atomically
(written aside, then renamed). ``ddlrun`` then relaunches the job on the
surviving hosts (``DDL_ELASTIC_RESUMED``), and the relaunched ranks, entering
``elastic.run``, call :func:`resume`: they agree on the newest commit any of
them finds on its host, and that rank broadcasts it to the others. Every
rank then holds the same bytes: replicas are bitwise equal, and nothing is
lost beyond the last commit a survivor held.

The files stay until ``ddlrun`` ends (it removes the folder on the hosts it
knows of): a relaunch may need them even after the ranks finished, when the
runtime lost a daemon while the last ranks shut down, and their finished line
with it. A rank that leaves the job removes its own (:func:`discard`).

A rank's file is named by its host and its index among the job's ranks on
that host (``node0.1.commit``); a relaunched rank reads the file of the same
host and index. Each file carries a commit count, equal on every rank
(newcomers receive it at their first sync), so the newest commit is the
highest count.

Example:
    >>> import tempfile
    >>> from ddl_tf.membership.mirror import mirror_path
    >>> mirror_path("/dev/shm/ddl_tf-1", ("node0", "node0", "node1"), 1)
    '/dev/shm/ddl_tf-1/node0.1.commit'
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from ddl_tf import env
from ddl_tf.errors import DDLError

__all__ = [
    "MirrorError",
    "default_folder",
    "folder",
    "mirror_path",
    "write",
    "discard",
    "resume",
    "share_count",
]

logger = logging.getLogger(__name__)

_resumed = False
_warned: set[str] = set()


class MirrorError(DDLError):
    """A mirrored commit cannot be put back into the state (it holds other variables)."""


def default_folder(job_id: str) -> str:
    """Where ``ddlrun`` asks the ranks to mirror their commits: ``/dev/shm`` (host memory).

    Falls back to the temporary folder where ``/dev/shm`` does not exist.
    """
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"ddl_tf-{job_id}")


def folder() -> str | None:
    """This job's mirror folder (``DDL_ELASTIC_MIRROR``), or None: no mirroring."""
    return env.get(env.DDL_ELASTIC_MIRROR) or None


def mirror_path(base: str, hosts: tuple[str, ...] | list[str], rank: int) -> str:
    """The file of ``rank`` of a job whose ranks are on ``hosts``: host and index on it."""
    host = hosts[rank].replace("/", "_")
    local = list(hosts[:rank]).count(hosts[rank])
    return os.path.join(base, f"{host}.{local}.commit")


def _own_path(job: Any = None) -> str | None:
    from ddl_tf.core import current

    base = folder()
    job = job if job is not None else current.get()
    if base is None or job is None:
        return None
    return mirror_path(base, job.hosts, job.rank)


def write(state: Any) -> None:
    """Mirror ``state``'s last commit to this rank's file (atomically replaced).

    States that cannot give their commit (:meth:`State.mirror_payload` is None)
    are skipped, with one warning.
    """
    path = _own_path()
    if path is None:
        return
    payload = state.mirror_payload()
    if payload is None:
        _warn_once(
            type(state).__name__,
            "elastic state %s cannot be mirrored in host memory (no mirror_payload()): a node "
            "crash would lose it",
            type(state).__name__,
        )
        return
    record = {"commit": getattr(state, "commit_count", 0), "state": payload, "time": time.time()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    spare = f"{path}.{os.getpid()}.tmp"
    try:
        with open(spare, "wb") as out:
            pickle.dump(record, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(spare, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
        with contextlib.suppress(OSError):
            os.remove(spare)
        _warn_once(
            f"write:{type(err).__name__}",
            "cannot mirror the commit of %s to %s (%s): a node crash would lose it",
            type(state).__name__,
            path,
            err,
        )


def discard(job: Any = None) -> None:
    """Remove this rank's file, and the folder once it is empty (the job finished or left).

    Args:
        job: The job whose layout names the file (default: the current one).
    """
    path = _own_path(job)
    if path is None:
        return
    with contextlib.suppress(OSError):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


def share_count(state: Any) -> None:
    """Give every rank rank 0's commit count (newcomers start at 0; collective)."""
    from ddl_tf.core import basics

    if folder() is None:
        return
    state.commit_count = basics.engine().broadcast_object(
        getattr(state, "commit_count", 0), 0, name="elastic.mirror.count"
    )


def resume(state: Any) -> bool:
    """In ranks ``ddlrun`` relaunched after a node crash: put back the survivors' newest commit.

    Collective over the relaunched job, once per process (later calls return
    False). Each rank reads its host's file; the rank with the highest commit
    count broadcasts it, and every rank loads it into ``state``.

    Returns:
        True when ``state`` was loaded (every rank holds the same values: no
        sync is needed), False when this is no relaunch or no rank found a commit.

    Raises:
        MirrorError: The commit does not fit the state (another model).
    """
    global _resumed
    from ddl_tf.core import basics

    if _resumed or not env.get(env.DDL_ELASTIC_RESUMED) or folder() is None:
        return False
    _resumed = True
    started = time.perf_counter()
    engine = basics.engine()
    job = basics.job()
    path = _own_path()
    own = None
    if path is not None and os.path.exists(path):
        try:
            with open(path, "rb") as source:
                own = pickle.load(source)
        except (OSError, pickle.UnpicklingError, EOFError) as err:
            logger.warning("mirrored commit %s is unreadable (%s); not used", path, err)
    counts = engine.allgather_object(
        -1 if own is None else int(own["commit"]), name="elastic.mirror.counts"
    )
    newest = max(counts)
    if newest < 0:
        if job.rank == 0:
            logger.warning(
                "elastic job relaunched after a node crash, but no surviving rank held a commit "
                "in host memory (%s): training starts from the program's initial state",
                folder(),
            )
        return False
    root = counts.index(newest)
    record = engine.broadcast_object(own if job.rank == root else None, root, name="elastic.mirror")
    state.load_mirror(record["state"])
    state.commit_count = newest
    write(state)  # this layout's files, for a further crash
    if job.rank == 0:
        logger.warning(
            "elastic job relaunched on %d rank(s) (%s) resumed from commit %d, kept in host "
            "memory by rank %d of the relaunch (host %s); loaded in %.2f s",
            job.size,
            ", ".join(sorted(set(job.hosts))),
            newest,
            root,
            job.hosts[root],
            time.perf_counter() - started,
        )
    return True


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)
