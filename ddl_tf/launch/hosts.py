"""Hosts and slots for ``ddlrun``: ``-H host:slots,...`` and Open MPI-style hostfiles.

Ranks are placed by slot, as ``mpirun --map-by slot`` does: the first host's
slots get ranks 0.., then the next host's.

Example:
    >>> from ddl_tf.launch.hosts import parse_host_list, place_ranks
    >>> hosts = parse_host_list("node1:2,node2:2")
    >>> [(h.name, h.slots) for h in hosts]
    [('node1', 2), ('node2', 2)]
    >>> place_ranks(hosts, 3)
    ['node1', 'node1', 'node2']
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddl_tf.errors import LaunchError

__all__ = [
    "Host",
    "host_list",
    "parse_host_list",
    "parse_hostfile",
    "place_ranks",
    "is_local",
    "local_slots",
    "EXAMPLE",
]

EXAMPLE = "ddlrun -np 4 -H node1:2,node2:2 python train.py"
_LOCAL = {"localhost", "127.0.0.1", "::1"}


@dataclass(frozen=True)
class Host:
    """A host name and how many ranks may run on it."""

    name: str
    slots: int = 1

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_host_list(text: str) -> list[Host]:
    """Parse ``-H host[:slots],...`` (a host listed twice adds up its slots).

    Args:
        text: The ``-H`` value, e.g. ``"node1:2,node2:2"``; a host without
            ``:slots`` gets one slot.

    Returns:
        The hosts in first-seen order.

    Raises:
        LaunchError: Empty names or slot counts that are not positive integers.
    """
    slots: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        if not name or (count and (not count.isdigit() or int(count) < 1)):
            raise LaunchError(
                f"ddlrun: cannot read host {item!r} in -H {text!r}; write host or host:slots "
                f"with slots >= 1, e.g. {EXAMPLE}"
            )
        slots[name] = slots.get(name, 0) + (int(count) if count else 1)
    if not slots:
        raise LaunchError(f"ddlrun: -H lists no hosts; e.g. {EXAMPLE}")
    return [Host(name, n) for name, n in slots.items()]


_LINE = re.compile(r"^(?P<name>[^\s:#]+)(?::(?P<colon>\d+))?(?P<rest>.*)$")
_SLOTS = re.compile(r"(?:^|\s)(?:slots|max_slots|max-slots)=(?P<n>\d+)")


def parse_hostfile(path: str | Path) -> list[Host]:
    """Parse a hostfile: one ``host [slots=N]`` or ``host:N`` per line, ``#`` comments.

    Args:
        path: The hostfile; a host without a slot count gets one slot.

    Returns:
        The hosts in first-seen order.

    Raises:
        LaunchError: The file is missing, empty, or has an unreadable line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise LaunchError(
            f"ddlrun: cannot read hostfile {path} ({err.strerror}); e.g. a file with lines "
            "'node1 slots=2'."
        ) from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        slots_match = _SLOTS.search(match.group("rest")) if match else None
        if match is None or (match.group("rest").strip() and slots_match is None):
            raise LaunchError(
                f"ddlrun: {path}:{number}: cannot read {raw.strip()!r}; write 'host slots=N' "
                "or 'host:N'."
            )
        count = match.group("colon") or (slots_match.group("n") if slots_match else "1")
        if int(count) < 1:
            raise LaunchError(f"ddlrun: {path}:{number}: slots must be >= 1 in {raw.strip()!r}.")
        hosts[match.group("name")] = hosts.get(match.group("name"), 0) + int(count)
    if not hosts:
        raise LaunchError(
            f"ddlrun: hostfile {path} lists no hosts; add lines like 'node1 slots=2'."
        )
    return [Host(name, n) for name, n in hosts.items()]


def place_ranks(hosts: list[Host], np: int, oversubscribe: bool = False) -> list[str]:
    """Host of each rank when filling slots in order (cycling if oversubscribed).

    Args:
        hosts: The hosts with their slot counts, in order.
        np: Number of ranks to place.
        oversubscribe: Allow more ranks than slots (placement cycles through
            the hosts again).

    Returns:
        ``np`` host names, the host of rank ``i`` at index ``i``.

    Raises:
        LaunchError: More ranks than slots and ``oversubscribe`` is False.
    """
    total = sum(h.slots for h in hosts)
    if np > total and not oversubscribe:
        listing = ",".join(str(h) for h in hosts)
        raise LaunchError(
            f"ddlrun: {np} ranks need {np} slots but the hosts offer {total} ({listing}). "
            f"Give more slots (e.g. -H {hosts[0].name}:{np}), fewer ranks (-np {total}), or "
            "pass --oversubscribe."
        )
    placement: list[str] = []
    while len(placement) < np:
        for host in hosts:
            placement.extend([host.name] * min(host.slots, np - len(placement)))
    return placement


def is_local(name: str) -> bool:
    """Whether ``name`` means this machine without asking DNS (localhost or our hostname).

    Args:
        name: A host name from ``-H`` or a hostfile.

    Returns:
        True for ``localhost``, ``127.0.0.1``, ``::1`` and this machine's
        short or fully qualified hostname.
    """
    import socket

    return name in _LOCAL or name in {socket.gethostname(), socket.getfqdn()}


def local_slots() -> int:
    """The slots of this machine when no hosts are given: its cores, as Open MPI counts them.

    Open MPI's ``mpirun`` without a host list gives the local machine one slot
    per processor core (hardware threads count only with
    ``--use-hwthread-cpus``); ``ddlrun`` defaults ``-np`` to the same number.

    Returns:
        The number of physical cores (``psutil``), else of logical CPUs, at least 1.
    """
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def host_list(slots: dict[str, int]) -> list[Host]:
    """``Host`` entries of ``{name: slots}``, in its order."""
    return [Host(name, n) for name, n in slots.items()]
