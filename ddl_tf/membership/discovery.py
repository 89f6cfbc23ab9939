"""Which hosts an elastic job may use: the discovery script, and the blacklist of failed hosts.

The script is horovodrun's ``--host-discovery-script``: an executable that
prints one ``host`` or ``host:slots`` line per available host and exits 0.
It runs with a time limit; a failure, a hang or a line that is not
``host[:slots]`` raises :class:`DiscoveryError` naming what was wrong.

A host with a failed rank is blacklisted (all its ranks leave the job, as in
Horovod). Without a cooldown range it stays out for good; with one it may
come back after ``min(high, low * 2**(n-1))`` seconds, ``n`` its number of
failures. The range is given as two numbers, ``ddlrun
--blacklist-cooldown-range LOW HIGH`` (horovodrun's spelling) or
``ddl_tf.run(..., cooldown_range=(low, high))``; ddlrun passes it to the
ranks as ``DDL_ELASTIC_COOLDOWN=low,high``
(:class:`~ddl_tf.membership.settings.ElasticSettings`).

This module runs no MPI: ``ddlrun`` uses it before any rank starts.

Example:
    >>> from ddl_tf.membership.discovery import parse_hosts, Blacklist
    >>> parse_hosts("node1:2\\nnode2\\n", slots_per_host=4)
    {'node1': 2, 'node2': 4}
    >>> bl = Blacklist(cooldown=(10.0, 60.0)); bl.add("node1", now=0.0)
    >>> bl.blocked("node1", now=5.0), bl.blocked("node1", now=11.0)
    (True, False)
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from ddl_tf.errors import LaunchError

__all__ = ["DiscoveryError", "parse_hosts", "run_discovery", "Blacklist", "DISCOVERY_TIMEOUT"]

DISCOVERY_TIMEOUT = 30.0
"""Seconds the discovery script may run before it counts as hung."""

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-\[\]:]+?)(?::(?P<slots>\d+))?$")


class DiscoveryError(LaunchError):
    """The host discovery script failed, hung, or printed something that is not ``host[:slots]``."""


def parse_hosts(text: str, slots_per_host: int | None = None) -> dict[str, int]:
    """``{host: slots}`` in the script's order from its output.

    Args:
        text: The script's standard output.
        slots_per_host: Slots of a host listed without ``:slots``.

    Raises:
        DiscoveryError: A line is not ``host`` or ``host:slots``, a host has 0
            slots, or a bare host appears without ``slots_per_host``.
    """
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise DiscoveryError(
                f"host discovery line {number} is {raw!r}, not 'host' or 'host:slots' (e.g. "
                "'node1:4'). Fix the --host-discovery-script's output."
            )
        slots = match["slots"]
        if slots is None:
            if slots_per_host is None:
                raise DiscoveryError(
                    f"host discovery line {number} ({raw!r}) gives no slots; print 'host:slots' "
                    "or pass --slots-per-host."
                )
            count = slots_per_host
        else:
            count = int(slots)
        if count < 1:
            raise DiscoveryError(f"host discovery line {number} ({raw!r}) gives 0 slots.")
        hosts[match["host"]] = count
    return hosts


def run_discovery(
    script: str, slots_per_host: int | None = None, timeout: float = DISCOVERY_TIMEOUT
) -> dict[str, int]:
    """Run the discovery script once and parse what it prints.

    Args:
        script: Path of the executable script.
        slots_per_host: See :func:`parse_hosts`.
        timeout: Seconds before the script counts as hung (it is killed).

    Raises:
        DiscoveryError: It cannot run, exits non-zero, hangs, or prints garbage.
    """
    try:
        done = subprocess.run(
            [script], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise DiscoveryError(
            f"the host discovery script {script} did not finish within {timeout:g} s; it must "
            "print the current hosts and exit."
        ) from None
    except OSError as err:
        raise DiscoveryError(
            f"cannot run the host discovery script {script}: {err}. Pass an executable "
            "(chmod +x) to --host-discovery-script."
        ) from None
    if done.returncode != 0:
        raise DiscoveryError(
            f"the host discovery script {script} exited with {done.returncode}: "
            f"{done.stderr.strip()[-500:] or '(no stderr)'}"
        )
    return parse_hosts(done.stdout, slots_per_host)


@dataclass
class Blacklist:
    """Hosts whose ranks failed, and when each may come back.

    Args:
        cooldown: ``(low, high)`` seconds, or None to keep failed hosts out for good.
    """

    cooldown: tuple[float, float] | None = None
    _failures: dict[str, int] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)

    def add(self, host: str, now: float) -> None:
        """Record a failure of ``host`` at time ``now`` (seconds, any fixed origin)."""
        count = self._failures[host] = self._failures.get(host, 0) + 1
        if self.cooldown is None:
            self._until[host] = float("inf")
        else:
            low, high = self.cooldown
            self._until[host] = now + min(high, low * 2 ** (count - 1))

    def blocked(self, host: str, now: float) -> bool:
        """Whether ``host`` may not be used at time ``now``."""
        return now < self._until.get(host, float("-inf"))

    def hosts(self) -> list[str]:
        """Every host that ever failed."""
        return sorted(self._failures)
