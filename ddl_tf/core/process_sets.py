"""Horovod's process sets: collectives on a subset of the job's ranks.

A :class:`ProcessSet` names some ranks of the job. Once registered, by
``init(process_sets=[...])`` or, with ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or
``init(process_sets="dynamic")``), by :func:`add_process_set`, its members
run collectives among themselves (``process_set=`` on every collective and on
``DistributedOptimizer``) while the other ranks carry on. Each set runs over
its own MPI sub-communicators with its own engine: the same negotiation,
fusion and algorithms as the whole job, over the set's part of the topology.
Registering and removing are collective over the whole job: every rank calls
them, in the same order, with the same ranks (a mismatch raises everywhere).

Semantics follow Horovod: ranks are the job's ranks (``root_rank`` of a
broadcast too); ``ProcessSet.rank()`` is the position in the set (-1 outside
it); a collective on a set that does not include the calling rank raises
:class:`~ddl_tf.errors.NotInProcessSetError` (the TensorFlow layer raises it as a
``tf.errors.InvalidArgumentError`` too). A removed set's ``process_set_id`` is
None again and the object can be added again; a new set takes the lowest free
id; a set with the same ranks as a registered one, or as the whole job, is
refused.

Example (one process):
    >>> from ddl_tf.core import basics
    >>> from ddl_tf.core.process_sets import ProcessSet, global_process_set
    >>> _ = basics.init(process_sets="dynamic")
    >>> global_process_set
    ProcessSet(process_set_id=0, ranks=[0], mpi_comm=None)
    >>> first = ProcessSet([0])
    >>> first.size(), first.rank(), first.included(), global_process_set.size()
    (1, 0, True, 1)
    >>> add_process_set(first)
    Traceback (most recent call last):
    ...
    ddl_tf.errors.ConfigError: ProcessSet(process_set_id=None, ranks=[0], mpi_comm=None) has the ranks of the global process set ...
    >>> basics.shutdown()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ddl_tf.core import current
from ddl_tf.errors import CollectiveArgumentError, ConfigError, NotInProcessSetError

if TYPE_CHECKING:
    from ddl_tf.core.job import Job

__all__ = [
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "register_at_init",
    "check_init_argument",
    "engine_for",
    "check_process_set",
    "member_engine",
    "set_root",
    "by_id",
    "registered",
    "excludes_this_rank",
]


class ProcessSet:
    """Some ranks of the job that run collectives among themselves (Horovod's ``ProcessSet``).

    Args:
        ranks: The job's ranks in the set (any order, no repeats). None: the
            global set.
    """

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        self.process_set_id: int | None = 0 if ranks is None else None
        self._ranks: list[int] = []
        if ranks is None:
            return
        if hasattr(ranks, "Get_group"):  # an mpi4py communicator
            raise ConfigError(
                "ddl_tf makes process sets from lists of ranks, not from communicators "
                "(a communicator exists only on its members, while every rank registers every "
                "set). Received an mpi4py communicator; pass the job ranks, e.g. "
                "ProcessSet(MPI.COMM_WORLD.allgather(rank_or_None)) filtered to its members."
            )
        try:
            listed = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise ConfigError(
                f"ProcessSet takes a list of ranks or an mpi4py communicator. Received "
                f"{ranks!r}; e.g. ProcessSet([0, 1])."
            ) from None
        if not listed or len(set(listed)) != len(listed) or min(listed) < 0:
            raise ConfigError(
                f"A process set needs distinct, non-negative ranks. Received {listed}; "
                "e.g. ProcessSet([0, 2])."
            )
        self._ranks = sorted(listed)

    @property
    def ranks(self) -> list[int]:
        """The job's ranks in the set, sorted (all of them for the global set)."""
        if self.process_set_id == 0:
            return list(range(current.job().size))
        return list(self._ranks)

    def size(self) -> int:
        """Number of ranks in the set."""
        return current.job().size if self.process_set_id == 0 else len(self.ranks)

    def rank(self) -> int:
        """This process's position in the set, or -1 when it is not a member."""
        me = current.job().rank
        if self.process_set_id == 0:
            return me
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        """Whether this process belongs to the set."""
        return self.process_set_id == 0 or current.job().rank in self.ranks

    def root(self, root_rank: int) -> int:
        """The set's own rank of the job's rank ``root_rank`` (a broadcast's root).

        Raises:
            CollectiveArgumentError: ``root_rank`` is not in the set.
        """
        if self.process_set_id == 0:
            return root_rank
        if root_rank not in self.ranks:
            raise CollectiveArgumentError(
                f"root_rank={root_rank} is not in {self!r}; pick one of its ranks "
                f"{self.ranks} (root ranks are the job's ranks, as in Horovod)."
            )
        return self.ranks.index(root_rank)

    def __repr__(self) -> str:  # Horovod's form; ranks of the global set need init()
        ranks = self._ranks
        if self.process_set_id == 0:
            job = current.get()
            ranks = list(range(job.size)) if job is not None else []
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks}, mpi_comm=None)"


global_process_set = ProcessSet()


def check_process_set(process_set: ProcessSet | None) -> None:
    """Refuse a ``process_set`` argument that is neither None nor a :class:`ProcessSet`.

    Raises:
        ConfigError: Anything else (e.g. a list of ranks).
    """
    if process_set is not None and not isinstance(process_set, ProcessSet):
        raise ConfigError(
            f"process_set must be a ddl_tf ProcessSet. Received {process_set!r}; use "
            "hvd.global_process_set or a set returned by hvd.add_process_set(ranks)."
        )


def engine_for(process_set: ProcessSet | None) -> Any:
    """The engine that runs a collective on ``process_set`` (the job's for None or the global set).

    Args:
        process_set: The ``process_set`` argument of a collective.

    Returns:
        The :class:`~ddl_tf.core.collectives.engine.Engine` of the set on this rank (for
        an elastic job's whole set, :data:`~ddl_tf.core.current.CURRENT`,
        which stands for it).

    Raises:
        ConfigError: Not a registered process set.
        NotInProcessSetError: This rank is not in the set (a ``ConfigError``).
    """
    job = current.job()
    engine = current.CURRENT if job.elastic else job.engine
    if process_set is None or process_set is global_process_set:
        return engine
    check_process_set(process_set)
    assert process_set is not None  # checked above; for mypy
    set_id = process_set.process_set_id
    if set_id == 0:
        return engine
    if set_id is None or job.process_sets.get(set_id) is not process_set:
        raise ConfigError(
            f"{process_set!r} is not registered with this job; pass it to "
            "init(process_sets=[...]) or add_process_set() (on every rank) first (after an "
            "elastic job re-forms, add its sets again, e.g. in a reset callback)."
        )
    sub = job.engine.subsets.get(set_id)
    if sub is None:
        raise NotInProcessSetError(
            f"rank {job.rank} is not in {process_set!r}: only its members run its "
            "collectives. Guard the call with `if process_set.included():`."
        )
    return sub


def member_engine(process_set: ProcessSet | None) -> Any:
    """:func:`engine_for`, or None when ``process_set`` is a registered set this rank is not in.

    Horovod's gradient reducers (``DistributedGradientTape``,
    ``DistributedOptimizer``) leave the gradients of such a rank local: it
    trains alone while the set's members reduce among themselves.

    Raises:
        ConfigError: ``process_set`` is neither None nor a registered set.
    """
    try:
        return engine_for(process_set)
    except NotInProcessSetError:
        return None


def excludes_this_rank(process_set: ProcessSet | None) -> bool:
    """Whether ``process_set`` is a registered set that this rank is not in (see :func:`member_engine`).

    Raises:
        ConfigError: ``process_set`` is neither None nor a registered set.
    """
    return member_engine(process_set) is None


def by_id(process_set_id: int) -> ProcessSet:
    """The registered process set with ``process_set_id`` (0: the global set).

    Raises:
        ConfigError: No registered set has that id.
    """
    if process_set_id == 0:
        return global_process_set
    registered_sets = current.job().process_sets
    found = registered_sets.get(process_set_id)
    if found is None:
        raise ConfigError(
            f"No process set has process_set_id={process_set_id}; registered: "
            f"{sorted(registered_sets) or 'none'} (0 is the whole job)."
        )
    return found


def registered() -> dict[int, list[int]]:
    """Every registered set's ranks by ``process_set_id``, the global set (0) included.

    Horovod's ``_basics._get_process_set_ids_and_ranks()``.
    """
    job = current.job()
    found = {0: list(range(job.size))}
    found.update((set_id, list(s.ranks)) for set_id, s in sorted(job.process_sets.items()))
    return found


def set_root(process_set: ProcessSet | None, root_rank: int) -> int:
    """The set's own rank of job rank ``root_rank`` (unchanged for None or the global set).

    Raises:
        CollectiveArgumentError: ``root_rank`` is not in the set.
    """
    return root_rank if process_set is None else process_set.root(root_rank)


def check_init_argument(process_sets: object) -> None:
    """Refuse a bad ``init(process_sets=...)`` before anything starts.

    Raises:
        ConfigError: Neither None, ``"dynamic"`` nor a list.
    """
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, str) or not isinstance(process_sets, Sequence):
        raise ConfigError(
            f"init(process_sets=...) takes a list of ProcessSet or 'dynamic'. Received "
            f"{process_sets!r}; e.g. init(process_sets=[hvd.ProcessSet([0, 1])])."
        )


def register_at_init(job: Job, process_sets: Sequence[ProcessSet] | str | None) -> None:
    """``init(process_sets=...)``: register a list of sets, or allow adding them later.

    Args:
        job: The job, just built.
        process_sets: None, ``"dynamic"``, or a list of :class:`ProcessSet`.

    Raises:
        ConfigError: Anything else.
    """
    job.dynamic_sets = job.engine.config.dynamic_process_sets or process_sets == "dynamic"
    if process_sets is None or isinstance(process_sets, str):  # "dynamic" (checked at init)
        return
    for process_set in process_sets:
        _add(job, process_set, at_init=True)


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set after ``init()`` (collective: every rank calls it, same ranks).

    Needs dynamic process sets (``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or
    ``init(process_sets="dynamic")``), as in Horovod.

    Args:
        process_set: A :class:`ProcessSet`, or its list of ranks.

    Returns:
        The registered set (``process_set_id`` assigned).

    Raises:
        ConfigError: Dynamic process sets are off, the ranks are out of range,
            or the same ranks are already a registered set.
        CollectiveMismatchError: Ranks passed different sets.
    """
    job = current.job()
    if not job.dynamic_sets:
        raise ConfigError(
            "Process sets can be added after init() only with dynamic process sets. Set "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1 (or call init(process_sets='dynamic')), or pass "
            "the sets to init(process_sets=[...])."
        )
    return _add(job, process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective: every rank calls it).

    Args:
        process_set: A set returned by :func:`add_process_set` or given to ``init()``.

    Returns:
        True when the set was removed; False for the global set or a set that
        is not registered, as in Horovod.
    """
    job = current.job()
    set_id = getattr(process_set, "process_set_id", None)
    if not set_id or job.process_sets.get(set_id) is not process_set:
        return False
    job.engine.drop_subset(set_id)
    del job.process_sets[set_id]
    process_set.process_set_id = None  # as in Horovod: the object can be added again
    return True


def _add(job: Job, process_set: ProcessSet | Sequence[int], at_init: bool = False) -> ProcessSet:
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ConfigError(f"{process_set!r} is already registered; make a new ProcessSet.")
    ranks = tuple(process_set.ranks)
    if ranks[-1] >= job.size or any(r < 0 for r in ranks):
        raise ConfigError(
            f"{process_set!r} names ranks outside the job (size {job.size}); use ranks "
            f"0..{job.size - 1}."
        )
    if ranks == tuple(range(job.size)):
        if at_init:  # as in Horovod's init(): the set is the global set, id 0
            process_set.process_set_id = 0
            return process_set
        raise ConfigError(
            f"{process_set!r} has the ranks of the global process set (the whole job); use "
            "hvd.global_process_set instead of adding it."
        )
    registered_sets = job.process_sets
    if any(tuple(other.ranks) == ranks for other in registered_sets.values()):
        raise ConfigError(
            f"A process set with ranks {list(ranks)} is already registered; reuse it."
        )
    set_id = next(i for i in range(1, len(registered_sets) + 2) if i not in registered_sets)
    job.engine.subset(ranks, set_id)
    process_set.process_set_id = set_id
    registered_sets[set_id] = process_set
    return process_set
