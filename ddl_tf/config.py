"""The one configuration value of ddl_tf: a frozen, validated dataclass.

:meth:`DDLConfig.from_env` reads it from the environment (through
:mod:`ddl_tf.env`), which is how ``ddlrun`` options reach every rank.
``init()`` builds it once; the engine and the launcher only ever see this
value.

Example:
    >>> from ddl_tf.config import DDLConfig
    >>> cfg = DDLConfig.from_env({"DDL_ALLREDUCE_ALGO": "ring",
    ...                           "HOROVOD_FUSION_THRESHOLD": "1048576"})
    >>> cfg.algorithm, cfg.fusion_threshold_bytes
    ('ring', 1048576)
    >>> DDLConfig(algorithm="fastest")
    Traceback (most recent call last):
    ...
    ddl_tf.errors.ConfigError: Unknown allreduce algorithm 'fastest'. Received algorithm='fastest'; use one of auto, flat, ring, hierarchical, asa (e.g. DDL_ALLREDUCE_ALGO=auto).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ddl_tf import env
from ddl_tf.errors import ConfigError

__all__ = [
    "DDLConfig",
    "ENV_FIELDS",
    "ALGORITHMS",
    "COMPRESSIONS",
    "DEFAULT_FUSION_THRESHOLD",
    "DEFAULT_BUCKET_BYTES",
]

ALGORITHMS = ("auto", "flat", "ring", "hierarchical", "asa")
COMPRESSIONS = ("none", "fp16", "bf16")
DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024
DEFAULT_BUCKET_BYTES = 2 * 1024 * 1024

LOG_LEVELS = {
    "TRACE": "DEBUG",
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "WARN": "WARNING",
    "ERROR": "ERROR",
    "FATAL": "CRITICAL",
    "CRITICAL": "CRITICAL",
}
"""Log level names ddl_tf and Horovod accept, and the Python level each means."""

Algorithm = Literal["auto", "flat", "ring", "hierarchical", "asa"]
CompressionName = Literal["none", "fp16", "bf16"]


@dataclass(frozen=True)
class DDLConfig:
    """Settings shared by every rank of a job.

    Attributes:
        algorithm: Allreduce algorithm. ``auto`` picks per message size and
            topology from measured tables (see :mod:`ddl_tf.core.algorithms.selection`);
            the others force one algorithm for every allreduce.
        fusion_threshold_bytes: Largest fused bucket (bytes on the wire). A
            tensor larger than this travels alone; ``0`` disables fusion.
        overlap: Overlap the gradient allreduce with backprop inside graphs:
            one collective per bucket, in the order gradients are produced
            (see :mod:`ddl_tf.tensorflow.overlap`). ``False``: one fused allreduce after
            the backward pass.
        bucket_bytes: Gradient bytes per overlapped bucket; ``0`` gives every
            gradient its own bucket.
        compression: Wire compression used when a call does not pass one.
        timeline: Chrome-trace JSON file of every collective's phases, or None.
        stall_warning_seconds: A collective that waited this long for missing
            ranks logs a warning naming them (and repeats at this interval).
        stall_shutdown_seconds: A collective that waited this long raises
            :class:`~ddl_tf.errors.StallError` on every rank that arrived
            (``0`` waits forever, as Horovod's default does).
        start_timeout_seconds: Every rank must call ``init()`` within this
            many seconds of the first one; past them the ranks that did raise
            :class:`~ddl_tf.errors.StartupError` naming those that did not
            (``0`` waits forever, as MPI's start-up does). See
            :mod:`ddl_tf.core.startup`.
        check_collectives: Exchange a descriptor of each collective (name,
            shapes, dtypes, op, order) before moving data, turning mismatches
            into errors and stalls into warnings. ``False`` saves one small
            message round-trip per collective and gives both protections up.
        abort_on_error: Install an excepthook at ``init()`` that aborts the
            whole MPI job when any rank dies of an uncaught exception.
        topology_file: JSON file refining the topology (see
            :mod:`ddl_tf.core.topology.layout`).
        pseudo_nodes: Fake node layout for testing hierarchy on one host: a
            node count, or one node name per rank (comma separated).
        auto_policy_file: JSON table overriding the built-in ``auto`` choice.
        log_level: Level applied to the ``ddl_tf`` logger by ``init()`` (a Python
            level name; Horovod's ``trace`` and ``fatal`` read as ``DEBUG`` and
            ``CRITICAL``). ``init()`` also gives the logger a handler that
            prints to stderr when nothing else would.
        stall_shutdown_setting: The variable ``stall_shutdown_seconds`` came
            from, named in the stall error.
        dynamic_process_sets: Process sets may be added and removed after
            ``init()`` (Horovod's ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).
        ignored_settings: Horovod variables that were set but have no ddl_tf
            equivalent (:data:`ddl_tf.env.HOROVOD_IGNORED`); ``init()`` warns
            once on rank 0.
    """

    algorithm: Algorithm = "auto"
    fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD
    overlap: bool = True
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    compression: CompressionName = "none"
    timeline: str | None = None
    stall_warning_seconds: float = 60.0
    stall_shutdown_seconds: float = 0.0
    start_timeout_seconds: float = 60.0
    check_collectives: bool = True
    abort_on_error: bool = True
    topology_file: str | None = None
    pseudo_nodes: str | None = None
    auto_policy_file: str | None = None
    log_level: str | None = None
    stall_shutdown_setting: str = "DDL_STALL_SHUTDOWN_SECONDS"
    dynamic_process_sets: bool = False
    ignored_settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"Unknown allreduce algorithm {self.algorithm!r}. Received "
                f"algorithm={self.algorithm!r}; use one of {', '.join(ALGORITHMS)} "
                "(e.g. DDL_ALLREDUCE_ALGO=auto)."
            )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"Unknown compression {self.compression!r}. Received "
                f"compression={self.compression!r}; use one of {', '.join(COMPRESSIONS)} "
                "(e.g. DDL_COMPRESSION=fp16)."
            )
        if not isinstance(self.fusion_threshold_bytes, int) or self.fusion_threshold_bytes < 0:
            raise ConfigError(
                "The fusion threshold must be a whole number of bytes >= 0. Received "
                f"fusion_threshold_bytes={self.fusion_threshold_bytes!r} "
                "(e.g. DDL_FUSION_THRESHOLD=67108864 for 64 MiB, 0 to disable fusion)."
            )
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 0:
            raise ConfigError(
                "The overlap bucket size must be a whole number of bytes >= 0. Received "
                f"bucket_bytes={self.bucket_bytes!r} (e.g. DDL_BUCKET_BYTES=2097152 for 2 MiB, "
                "0 for one bucket per gradient; DDL_OVERLAP=0 turns overlap off)."
            )
        if not isinstance(self.overlap, bool):
            raise ConfigError(
                f"overlap must be True or False. Received overlap={self.overlap!r} "
                "(e.g. DDL_OVERLAP=0 to reduce all gradients after the backward pass)."
            )
        if not self.stall_warning_seconds > 0:
            raise ConfigError(
                "stall_warning_seconds must be > 0. Received "
                f"stall_warning_seconds={self.stall_warning_seconds!r} "
                "(e.g. DDL_STALL_WARNING_SECONDS=60)."
            )
        if self.log_level is not None and self.log_level not in LOG_LEVELS.values():
            raise ConfigError(
                f"Unknown log level {self.log_level!r}. Use one of "
                f"{', '.join(name.lower() for name in LOG_LEVELS)} (e.g. DDL_LOG_LEVEL=info; "
                "Horovod's HOROVOD_LOG_LEVEL values are accepted too)."
            )
        if self.stall_shutdown_seconds < 0:
            raise ConfigError(
                "stall_shutdown_seconds must be >= 0 (0 never shuts down). Received "
                f"stall_shutdown_seconds={self.stall_shutdown_seconds!r}."
            )
        if not self.start_timeout_seconds >= 0:  # NaN too
            raise ConfigError(
                "start_timeout_seconds must be >= 0 (0 waits for ever). Received "
                f"start_timeout_seconds={self.start_timeout_seconds!r} (e.g. DDL_START_TIMEOUT=60)."
            )
        if 0 < self.stall_shutdown_seconds < self.stall_warning_seconds:
            raise ConfigError(
                "stall_shutdown_seconds must not be shorter than stall_warning_seconds, "
                "or stalls would abort before anyone is told which rank is missing. Received "
                f"stall_shutdown_seconds={self.stall_shutdown_seconds!r}, "
                f"stall_warning_seconds={self.stall_warning_seconds!r}."
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> DDLConfig:
        """Build the configuration from ``DDL_*`` (and fallback ``HOROVOD_*``) variables.

        Args:
            environ: Mapping to read instead of ``os.environ``.
            **overrides: Field values that win over the environment.

        Raises:
            ConfigError: A variable holds a value that cannot be parsed; the
                message names the variable and echoes the value.
        """
        values: dict[str, Any] = {}  # field values, checked by __post_init__
        for field_name, names, parse in ENV_FIELDS:
            name, value = env.get_first(names, environ)
            if name is None or value is None:
                continue
            parsed = parse(name, value)
            if parsed is not _UNSET:
                values[field_name] = parsed
                if field_name == "stall_shutdown_seconds":  # the stall error names its source
                    values["stall_shutdown_setting"] = name
        # Horovod's switches that set other fields, where the DDL_ setting is absent
        name, value = env.get_first([env.HOROVOD_HIERARCHICAL_ALLREDUCE], environ)
        if "algorithm" not in values and name is not None and value is not None:
            if _parse_bool(name, value):
                values["algorithm"] = "hierarchical"
        name, value = env.get_first([env.HOROVOD_STALL_CHECK_DISABLE], environ)
        if name is not None and value is not None and _parse_bool(name, value):
            # Horovod's stall inspector off: no warnings, no shutdown, unless DDL_* says otherwise
            values.setdefault("stall_warning_seconds", float("inf"))
            if env.get(env.DDL_STALL_SHUTDOWN_SECONDS, environ) is None:
                values["stall_shutdown_seconds"] = 0.0
        values["ignored_settings"] = tuple(
            name for name in env.HOROVOD_IGNORED if env.get(name, environ) is not None
        )
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes) -> DDLConfig:
        """A copy with ``changes`` applied (and validated).

        Args:
            **changes: New values by field name, e.g. ``fusion_threshold_bytes=0``.

        Returns:
            A new, validated :class:`DDLConfig`; this one is unchanged.

        Raises:
            ConfigError: A new value is invalid.
        """
        return dataclasses.replace(self, **changes)

    def fingerprint(self) -> str:
        """Digest of the settings every rank must share, or collectives would deadlock.

        Compared across ranks by ``init()``; paths and timeouts may differ.
        """
        shared = (
            self.algorithm,
            self.fusion_threshold_bytes,
            self.overlap,
            self.bucket_bytes,
            self.compression,
            self.check_collectives,
            self.pseudo_nodes,
            self.dynamic_process_sets,
        )
        return hashlib.blake2b(repr(shared).encode(), digest_size=8).hexdigest()


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"{name} must be a whole number. Received {name}={value!r} (e.g. {name}=67108864)."
        ) from None


def _parse_float(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(
            f"{name} must be a number of seconds. Received {name}={value!r} (e.g. {name}=60)."
        ) from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name} must be 1 or 0. Received {name}={value!r} (e.g. {name}=1).")


_UNSET = object()
"""What a parser returns for a value that leaves the field at its default."""


def _lower(name: str, value: str) -> str:
    return value.lower()


def _text(name: str, value: str) -> str:
    return value


def _timeline(name: str, value: str) -> Any:
    return _UNSET if value.upper() == "DYNAMIC" else value  # DYNAMIC: start_timeline() later


def _log_level(name: str, value: str) -> str:
    return LOG_LEVELS.get(value.strip().upper(), value)


ENV_FIELDS: tuple[tuple[str, tuple[str, ...], Callable[[str, str], Any]], ...] = (
    ("algorithm", (env.DDL_ALLREDUCE_ALGO,), _lower),
    ("compression", (env.DDL_COMPRESSION,), _lower),
    (
        "fusion_threshold_bytes",
        (env.DDL_FUSION_THRESHOLD, env.HOROVOD_FUSION_THRESHOLD),
        _parse_int,
    ),
    ("overlap", (env.DDL_OVERLAP,), _parse_bool),
    ("bucket_bytes", (env.DDL_BUCKET_BYTES,), _parse_int),
    ("timeline", (env.DDL_TIMELINE, env.HOROVOD_TIMELINE), _timeline),
    (
        "stall_warning_seconds",
        (env.DDL_STALL_WARNING_SECONDS, env.HOROVOD_STALL_CHECK_TIME_SECONDS),
        _parse_float,
    ),
    (
        "stall_shutdown_seconds",
        (env.DDL_STALL_SHUTDOWN_SECONDS, env.HOROVOD_STALL_SHUTDOWN_TIME_SECONDS),
        _parse_float,
    ),
    (
        "start_timeout_seconds",
        (env.DDL_START_TIMEOUT, env.HOROVOD_START_TIMEOUT),
        _parse_float,
    ),
    ("dynamic_process_sets", (env.HOROVOD_DYNAMIC_PROCESS_SETS,), _parse_bool),
    ("check_collectives", (env.DDL_CHECK_COLLECTIVES,), _parse_bool),
    ("abort_on_error", (env.DDL_ABORT_ON_ERROR,), _parse_bool),
    ("topology_file", (env.DDL_TOPOLOGY_FILE,), _text),
    ("pseudo_nodes", (env.DDL_PSEUDO_NODES,), _text),
    ("auto_policy_file", (env.DDL_AUTO_POLICY,), _text),
    ("log_level", (env.DDL_LOG_LEVEL, env.HOROVOD_LOG_LEVEL), _log_level),
)
"""How :meth:`DDLConfig.from_env` reads each field: ``(field, variables in priority order,
parse(name, value))``. The ``DDL_`` name comes first; Horovod's fallbacks after it."""
