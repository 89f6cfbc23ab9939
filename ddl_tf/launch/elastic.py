"""``ddlrun``'s elastic launch: horovodrun's elastic options onto one fault-tolerant mpirun.

With ``--min-np``, ``--max-np`` or ``--host-discovery-script`` the job is
elastic. ddlrun then

1. finds the hosts: the discovery script's (polled until they give
   ``--min-np`` slots, at most ``--elastic-timeout`` seconds), else ``-H``;
2. starts ``min(--max-np, slots)`` ranks (or ``-np``) under Open MPI's fault
   tolerance (``--with-ft ulfm``) on the ``ob1`` PML with the ``tcp,self``
   BTLs: measured here, a failed peer hangs the survivors with the shared
   memory BTL or the UCX PML, and is reported to them at once with these;
   without Open MPI's ``han`` collectives, which choose their algorithm from
   what each rank knows of the others' placement: ranks a growing job joins
   through rank 0 (:mod:`ddl_tf.membership.reform`) know less of them than
   rank 0 does, and the ranks then ran different algorithms and hung
   (measured here, growth onto this machine);
3. wraps each rank in :mod:`ddl_tf.launch.worker` so that it knows its host
   by the discovery script's name and the program to spawn when the job grows;
4. exports the elastic settings (``DDL_ELASTIC_*``) the ranks re-form by.

Hosts that are this machine (``localhost``, ``127.0.0.1``, its name) are one
physical host for mpirun and distinct hosts for the job.

Example:
    >>> from ddl_tf.launch.elastic import physical_hosts
    >>> physical_hosts({"localhost": 2, "127.0.0.1": 2, "node9": 4})
    [('localhost', 4), ('node9', 4)]
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from ddl_tf import env
from ddl_tf.errors import LaunchError
from ddl_tf.launch.command import LaunchPlan
from ddl_tf.launch.hosts import Host
from ddl_tf.membership.discovery import run_discovery
from ddl_tf.membership.settings import ElasticSettings

if TYPE_CHECKING:
    from ddl_tf.launch.supervise import FinishedWatch

__all__ = [
    "ULFM_ARGS",
    "retrying",
    "find_hosts",
    "launch_hosts",
    "physical_hosts",
    "make_elastic",
    "settings_env",
]

ULFM_ARGS = [
    "--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "coll", "^han",
]  # fmt: skip
"""mpirun arguments of an elastic job (see the module docstring for why these)."""


def settings_env(settings: ElasticSettings) -> dict[str, str]:
    """The ``DDL_ELASTIC_*`` variables that carry ``settings`` to the ranks."""
    values = {
        env.DDL_ELASTIC: "1",
        env.HOROVOD_ELASTIC: "1",
        env.DDL_ELASTIC_MIN_NP: str(settings.min_np),
        env.DDL_ELASTIC_TIMEOUT: f"{settings.timeout:g}",
        env.DDL_ELASTIC_DISCOVERY_INTERVAL: f"{settings.discovery_interval:g}",
    }
    if settings.max_np is not None:
        values[env.DDL_ELASTIC_MAX_NP] = str(settings.max_np)
    if settings.discovery is not None:
        values[env.DDL_ELASTIC_DISCOVERY] = settings.discovery
    if settings.slots_per_host is not None:
        values[env.DDL_ELASTIC_SLOTS_PER_HOST] = str(settings.slots_per_host)
    if settings.reset_limit is not None:
        values[env.DDL_ELASTIC_RESET_LIMIT] = str(settings.reset_limit)
    if settings.cooldown is not None:
        values[env.DDL_ELASTIC_COOLDOWN] = f"{settings.cooldown[0]:g},{settings.cooldown[1]:g}"
    return values


def find_hosts(
    settings: ElasticSettings,
    given: list[Host],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    exclude: Collection[str] = (),
) -> dict[str, int]:
    """The hosts to start on: discovered ones once they give ``min_np`` slots, else ``given``.

    Args:
        settings: The elastic settings.
        given: The ``-H`` hosts (used without a discovery script).
        clock: Seconds, for the ``--elastic-timeout`` deadline.
        sleep: Waits between two discovery runs.
        exclude: Hosts to leave out (those a crashed launch lost with their daemon),
            by the job's name or mpirun's (``localhost`` for this machine's aliases).

    Raises:
        DiscoveryError: The script fails, hangs or prints garbage.
        LaunchError: Fewer than ``min_np`` slots for ``timeout`` seconds.
    """

    def kept(hosts: dict[str, int]) -> dict[str, int]:
        return {h: n for h, n in hosts.items() if h not in exclude and _machine(h) not in exclude}

    lost = f" without the lost host(s) {', '.join(exclude)}" if exclude else ""
    if settings.discovery is None:
        hosts = kept({h.name: h.slots for h in given} or {"localhost": settings.max_np or 1})
        if sum(hosts.values()) < settings.min_np:
            raise LaunchError(
                f"ddlrun: --min-np {settings.min_np} needs that many slots; the hosts give "
                f"{sum(hosts.values())} ({_text(hosts) or 'none'}){lost}. Add hosts or lower "
                "--min-np."
            )
        return hosts
    deadline = clock() + settings.timeout
    while True:
        hosts = kept(run_discovery(settings.discovery, settings.slots_per_host))
        if sum(hosts.values()) >= settings.min_np:
            return hosts
        if clock() >= deadline:
            raise LaunchError(
                f"ddlrun: the discovery script gave {sum(hosts.values())} slot(s) "
                f"({_text(hosts) or 'no hosts'}){lost}, fewer than --min-np {settings.min_np}, for "
                f"{settings.timeout:g} s (--elastic-timeout). Start more hosts or lower --min-np."
            )
        sleep(settings.discovery_interval)


def physical_hosts(hosts: dict[str, int]) -> list[tuple[str, int]]:
    """mpirun's hosts for the job's: this machine's aliases become one ``localhost``."""
    merged: dict[str, int] = {}
    for name, slots in hosts.items():
        merged[_machine(name)] = merged.get(_machine(name), 0) + slots
    return list(merged.items())


def is_this_machine(name: str) -> bool:
    """Whether ``name`` is this machine (``localhost``, a loopback address, its host name)."""
    return name in {"localhost", socket.gethostname(), socket.getfqdn()} or name.startswith("127.")


def make_elastic(plan: LaunchPlan, settings: ElasticSettings, hosts: dict[str, int]) -> None:
    """Turn ``plan`` into the elastic launch over ``hosts`` (in place).

    Raises:
        LaunchError: ``-np`` is outside ``[min_np, max_np]`` or above the slots.
    """
    slots = sum(hosts.values())
    cap = min(slots, settings.max_np) if settings.max_np is not None else slots
    np_ = plan.np or cap
    if not settings.min_np <= np_ <= cap:
        raise LaunchError(
            f"ddlrun: -np {np_} must lie between --min-np {settings.min_np} and "
            f"{cap} (the smaller of --max-np and the {slots} slot(s) of {_text(hosts)})."
        )
    # ranks fill mpirun's hosts in order: list the job's hosts in that order too
    machines = [name for name, _ in physical_hosts(hosts)]
    ordered = sorted(hosts.items(), key=lambda item: machines.index(_machine(item[0])))
    plan.np = np_
    plan.hosts = [Host(name, count) for name, count in physical_hosts(dict(ordered))]
    plan.oversubscribe = True  # ranks spawned later go where the discovery script says
    plan.mpi_args = [*ULFM_ARGS, *plan.mpi_args]
    plan.env.update(settings_env(settings))
    plan.env[env.DDL_ELASTIC_HOSTS] = _text(dict(ordered))
    plan.env[env.DDL_ELASTIC_LAUNCH_HOSTS] = ",".join(launch_hosts(hosts))
    plan.program = [
        sys.executable,
        "-m",
        "ddl_tf.launch.worker",
        "--hosts",
        _text(dict(ordered)),
        "--program",
        json.dumps(plan.program),
    ]


def launch_hosts(hosts: dict[str, int]) -> list[str]:
    """The names mpirun's machine goes by: this machine's usual names and the job's aliases of it.

    Example:
        >>> "127.0.0.1" in launch_hosts({"node9": 2}) and "node9" not in launch_hosts({"node9": 2})
        True
    """
    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    return sorted(names | {name for name in hosts if is_this_machine(name)})


def _machine(name: str) -> str:
    return "localhost" if is_this_machine(name) else name


def _text(hosts: dict[str, int]) -> str:
    return ",".join(f"{h}:{n}" for h, n in hosts.items())


def retrying(watch: FinishedWatch, again, command: list[str], child_env: dict[str, str], ran=None):
    """``again(code)`` that first launches the last command again after a start-up failure.

    :meth:`FinishedWatch.retry_start` decides (mpirun failed before any rank ran,
    and ``ran()``, if given, says no rank reached ddlrun's start-up check);
    otherwise ``again`` decides (a relaunch after a node crash).
    """
    last = [(command, child_env)]

    def after(code: int):
        if watch.retry_start(128 - code if code < 0 else code, ran=ran is not None and ran()):
            return last[0]
        relaunch = again(code)
        if relaunch is not None:
            last[0] = relaunch
        return relaunch

    return after
