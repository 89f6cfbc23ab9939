"""An elastic job's settings, read once from the variables ``ddlrun --min-np`` exports.

Example:
    >>> from ddl_tf.membership.settings import ElasticSettings
    >>> s = ElasticSettings.from_env({"DDL_ELASTIC": "1", "DDL_ELASTIC_MIN_NP": "2",
    ...                               "DDL_ELASTIC_MAX_NP": "4", "DDL_ELASTIC_COOLDOWN": "1,8"})
    >>> s.min_np, s.max_np, s.cooldown, s.reset_limit
    (2, 4, (1.0, 8.0), None)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddl_tf import env
from ddl_tf.core.admission import DEFAULT_TIMEOUT
from ddl_tf.errors import ConfigError

__all__ = [
    "ElasticSettings",
    "DEFAULT_TIMEOUT",
    "DEFAULT_DISCOVERY_INTERVAL",
    "DEFAULT_SPAWN_TIMEOUT",
]


DEFAULT_DISCOVERY_INTERVAL = 1.0
"""Seconds between two runs of the discovery script (Horovod polls every second)."""

DEFAULT_SPAWN_TIMEOUT = 120.0
"""Seconds a growing job waits for its spawned ranks (Python, imports, ``MPI_Init``) to connect.

Past it the job ends with a message instead of waiting for ever: a new rank
that fails in ``MPI_Init`` leaves the others blocked in ``MPI_Comm_spawn``
(measured with Open MPI 5.0.11, see docs/elastic.md)."""


@dataclass(frozen=True)
class ElasticSettings:
    """What bounds an elastic job's membership.

    Attributes:
        min_np: Fewest ranks to train with (fewer for longer than
            :attr:`timeout` ends the job).
        max_np: Most ranks (growth stops there); None for no bound.
        discovery: The host discovery script, or None (the job only shrinks).
        discovery_interval: Seconds between two runs of the script.
        slots_per_host: Slots of a host the script lists without ``:slots``.
        reset_limit: Most membership changes before the job fails; None: no bound.
        cooldown: ``(low, high)`` seconds a failed host stays out; None: for good.
        timeout: Seconds to wait for ``min_np`` slots.
        launch_hosts: The job's host names that are mpirun's machine.
        spawn_timeout: Seconds to wait for spawned ranks to connect; then the spawning
            ranks end themselves and ``ddlrun`` relaunches the job without that host.
        prestart: Start new ranks in the background while the job trains, and admit
            them at the first commit after they connected (False: spawn them at the
            commit that sees the new hosts, the job waiting for them).
    """

    min_np: int = 1
    max_np: int | None = None
    discovery: str | None = None
    discovery_interval: float = DEFAULT_DISCOVERY_INTERVAL
    slots_per_host: int | None = None
    reset_limit: int | None = None
    cooldown: tuple[float, float] | None = None
    timeout: float = DEFAULT_TIMEOUT
    launch_hosts: tuple[str, ...] = ()
    spawn_timeout: float = DEFAULT_SPAWN_TIMEOUT
    prestart: bool = True

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ConfigError(f"--min-np must be at least 1. Received {self.min_np}.")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ConfigError(
                f"--max-np ({self.max_np}) is below --min-np ({self.min_np}); raise --max-np."
            )
        if self.cooldown is not None and not 0 <= self.cooldown[0] <= self.cooldown[1]:
            raise ConfigError(
                f"--blacklist-cooldown-range needs 0 <= low <= high. Received {self.cooldown}."
            )
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit must be >= 0. Received {self.reset_limit}.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ElasticSettings:
        """Read the ``DDL_ELASTIC_*`` variables.

        Raises:
            ConfigError: A value is not a number, or the bounds contradict.
        """

        def number(name: str, kind=int):
            value = env.get(name, environ)
            if value is None:
                return None
            try:
                return kind(value)
            except ValueError:
                raise ConfigError(f"{name} must be a number. Received {value!r}.") from None

        cooldown = env.get(env.DDL_ELASTIC_COOLDOWN, environ)
        bounds = None
        if cooldown is not None:
            try:
                low, high = (float(x) for x in cooldown.split(","))
            except ValueError:
                raise ConfigError(
                    f"{env.DDL_ELASTIC_COOLDOWN} must be 'low,high' seconds. Received {cooldown!r}."
                ) from None
            bounds = (low, high)
        min_np = number(env.DDL_ELASTIC_MIN_NP)
        return cls(
            min_np=1 if min_np is None else min_np,
            max_np=number(env.DDL_ELASTIC_MAX_NP),
            discovery=env.get(env.DDL_ELASTIC_DISCOVERY, environ),
            discovery_interval=number(env.DDL_ELASTIC_DISCOVERY_INTERVAL, float)
            or DEFAULT_DISCOVERY_INTERVAL,
            slots_per_host=number(env.DDL_ELASTIC_SLOTS_PER_HOST),
            reset_limit=number(env.DDL_ELASTIC_RESET_LIMIT),
            cooldown=bounds,
            timeout=number(env.DDL_ELASTIC_TIMEOUT, float) or DEFAULT_TIMEOUT,
            launch_hosts=tuple(
                h for h in (env.get(env.DDL_ELASTIC_LAUNCH_HOSTS, environ) or "").split(",") if h
            ),
            spawn_timeout=number(env.DDL_ELASTIC_SPAWN_TIMEOUT, float) or DEFAULT_SPAWN_TIMEOUT,
            prestart=(env.get(env.DDL_ELASTIC_PRESTART, environ) or "1").strip() != "0",
        )
