"""Device strings: parse them, check them, and tell compute ops from host ops.

The parser follows TensorFlow's ``DeviceSpec`` grammar (``/job:J/replica:R/
task:T/device:TYPE:N``, and the legacy ``/cpu:0``, ``/GPU:1`` forms) without
importing TensorFlow, so options are checked at once, before anything heavy
loads. :func:`check_device_string` is stricter than TensorFlow where
TensorFlow would accept a string at first and fail later: a device for swap
ops must name a type *and* an index.

Example:
    >>> parse_device("/job:localhost/replica:0/task:0/device:GPU:1")
    DeviceName(job='localhost', replica=0, task=0, type='GPU', index=1)
    >>> canonical("/cpu:0"), device_type("/gpu:1")
    ('/device:CPU:0', 'GPU')
    >>> m = DeviceMatcher(compute="/device:GPU:0", host="/device:CPU:0")
    >>> [m.placement(d) for d in ("", "/job:localhost/replica:0/task:0/device:GPU:0", "/cpu:0", "/GPU:1")]
    ['compute', 'compute', 'host', 'other']
    >>> same_device("/gpu:0", "/device:GPU:0")
    True
    >>> check_device_string("host_device", "cpu")
    Traceback (most recent call last):
    ...
    tflms.errors.ConfigError: host_device='cpu' names no device index, so ...
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from tflms.errors import ConfigError

__all__ = [
    "DeviceName",
    "DeviceMatcher",
    "parse_device",
    "check_device_string",
    "same_device",
    "canonical",
    "device_type",
    "default_compute_type",
    "local_devices",
    "check_local_device",
]

_ACCELERATORS = ("GPU", "TPU")
_LEGACY_TYPES = frozenset({"CPU", "GPU", "TPU"})
_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class DeviceName(NamedTuple):
    """The parts of a device string; ``None`` where the string leaves a part open.

    Attributes:
        job: the job name.
        replica: the replica number.
        task: the task number.
        type: the device type, upper case (``"GPU"``, ``"CPU"``, ...).
        index: the device number (``None`` for ``*`` or when absent).
    """

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    type: str | None = None
    index: int | None = None  # type: ignore[assignment]  # shadows tuple.index; public name

    def to_string(self) -> str:
        """The canonical form, as ``tf.DeviceSpec.to_string()`` writes it."""
        parts = []
        if self.job is not None:
            parts.append(f"/job:{self.job}")
        if self.replica is not None:
            parts.append(f"/replica:{self.replica}")
        if self.task is not None:
            parts.append(f"/task:{self.task}")
        if self.type is not None:
            parts.append(f"/device:{self.type}:{'*' if self.index is None else self.index}")
        return "".join(parts)


def _number(text: str, what: str, spec: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} must be a number, got {text!r} in {spec!r}")
    return int(text)


@functools.lru_cache(maxsize=512)
def parse_device(spec: str) -> DeviceName:
    """Parse a TensorFlow device string.

    Args:
        spec: e.g. ``"/device:GPU:0"``, ``"/cpu:0"``,
            ``"/job:worker/task:1/device:GPU:0"``; ``""`` is "no device".

    Returns:
        A :class:`DeviceName`.

    Raises:
        ValueError: the string does not follow TensorFlow's device grammar.
    """
    if not isinstance(spec, str):
        raise ValueError(f"a device string must be a str, got {type(spec).__name__}")
    job = replica = task = kind = index = None
    for part in spec.split("/"):
        if not part:
            continue
        fields = part.split(":")
        key = fields[0]
        if len(fields) == 2 and key == "job":
            job = fields[1]
        elif len(fields) == 2 and key == "replica":
            replica = _number(fields[1], "replica", spec)
        elif len(fields) == 2 and key == "task":
            task = _number(fields[1], "task", spec)
        elif len(fields) in (1, 2) and key.upper() in _LEGACY_TYPES:
            if kind is not None:
                raise ValueError(f"two device types in {spec!r}")
            kind = key.upper()
            if len(fields) == 2 and fields[1] != "*":
                index = _number(fields[1], "the device index", spec)
        elif len(fields) == 3 and key == "device":
            if kind is not None:
                raise ValueError(f"two device types in {spec!r}")
            if not _TYPE.match(fields[1]):
                raise ValueError(f"{fields[1]!r} is not a device type in {spec!r}")
            kind = fields[1].upper()
            if fields[2] != "*":
                index = _number(fields[2], "the device index", spec)
        else:
            raise ValueError(f"unknown part {part!r} in {spec!r}")
    return DeviceName(job, replica, task, kind, index)


def check_device_string(name: str, value: object, *, owner: str = "") -> str:
    """Check a device option: it must parse and name a device type and an index.

    Args:
        name: the option's name, for the message (``"device"`` or ``"host_device"``).
        value: the option's value.
        owner: prefix of the option in messages, e.g. ``"LMSConfig."``.

    Returns:
        ``value`` unchanged.

    Raises:
        ConfigError: naming the problem and the form to use instead.
    """
    example = "/device:GPU:0" if name == "device" else "/device:CPU:0"
    label = f"{owner}{name}"
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"{label} must be a device string such as {example!r}. Received {name}={value!r}."
        )
    try:
        parsed = parse_device(value)
    except ValueError as err:
        raise ConfigError(
            f"{label}={value!r} is not a TensorFlow device string ({err}). "
            f"Write it as {example!r} (type and index)."
        ) from None
    if parsed.type is None:
        raise ConfigError(
            f"{label}={value!r} names no device type. Write it as {example!r} (type and index)."
        )
    if parsed.index is None:
        raise ConfigError(
            f"{label}={value!r} names no device index, so TensorFlow cannot place swap ops on it. "
            f"Write it as '/device:{parsed.type}:0' (or another index)."
        )
    return value


def canonical(device: str) -> str:
    """``"/gpu:0"`` -> ``"/device:GPU:0"``; empty stays empty.

    Args:
        device: A TensorFlow device string, full or partial.

    Returns:
        The string in TensorFlow's canonical spelling; ``""`` for ``""``.
    """
    return parse_device(device).to_string() if device else ""


def device_type(device: str) -> str | None:
    """``"/job:x/device:GPU:1"`` -> ``"GPU"``; ``None`` when the string names no type.

    Args:
        device: A TensorFlow device string; ``""`` is allowed.

    Returns:
        The upper-case device type (``"GPU"`` for ``"/gpu:0"`` too), or None
            when the string names no type.
    """
    return parse_device(device).type if device else None


def same_device(a: str, b: str) -> bool:
    """Whether two device strings name the same device.

    Device type and index must match (a missing index means 0); job,
    replica and task are compared only when both strings give them.

    Args:
        a: A TensorFlow device string.
        b: Another one.

    Returns:
        True if they can name the same device.
    """
    sa, sb = parse_device(a), parse_device(b)
    if (sa.type or "") != (sb.type or ""):
        return False
    if (sa.index or 0) != (sb.index or 0):
        return False
    for field in ("job", "replica", "task"):
        va, vb = getattr(sa, field), getattr(sb, field)
        if va is not None and vb is not None and va != vb:
            return False
    return True


def default_compute_type(compute: str | None) -> str:
    """Device type unassigned ops run on: the configured device, else GPU if any.

    Args:
        compute: The configured compute device string, or None/``""`` for
            TensorFlow's placement.

    Returns:
        The type of ``compute`` (``"CPU"`` if it names none); without one,
        ``"GPU"`` when TensorFlow sees a physical GPU, else ``"CPU"``.
    """
    if compute:
        return device_type(compute) or "CPU"
    import tensorflow as tf

    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def local_devices() -> list[str]:
    """The logical devices of this process, canonical (``/device:CPU:0``, ...)."""
    import tensorflow as tf

    return [canonical(d.name) for d in tf.config.list_logical_devices()]


def check_local_device(name: str, value: str | None) -> None:
    """Check that the device option ``name`` names a logical device of this machine.

    Used when a live graph is planned (not for SavedModels rewritten for
    another machine).

    Args:
        name: the option's name, for the message.
        value: the device string (``None`` passes).

    Raises:
        ConfigError: no logical device matches; the message lists the ones there are.
    """
    if value is None:
        return
    devices = local_devices()
    if not any(same_device(value, d) for d in devices):
        raise ConfigError(
            f"{name}={value!r} is not a device of this machine; its logical devices are "
            f"{', '.join(devices)}. Pick one of them, or leave "
            + ("device=None to use TensorFlow's placement." if name == "device" else "the default.")
        )


class DeviceMatcher:
    """Classifies op device strings as ``"compute"``, ``"host"`` or ``"other"``.

    Args:
        compute: the compute device, or ``None`` to treat any accelerator
            (GPU/TPU) as compute.
        host: the host device that receives swapped-out tensors.
    """

    def __init__(self, compute: str | None, host: str):
        self.compute = compute
        self.host = host

    @functools.lru_cache(maxsize=256)  # noqa: B019 - a handful of distinct strings per graph
    def placement(self, device: str) -> str:
        """``"compute"``, ``"host"`` or ``"other"`` for an op placed on ``device``.

        Args:
            device: The op's device string; ``""`` (unplaced) counts as compute.

        Returns:
            ``"host"`` for the host device, ``"compute"`` for the compute device
            (without a configured one: any GPU/TPU-like type), else ``"other"``.
        """
        if not device:
            return "compute"
        if same_device(device, self.host):
            return "host"
        if self.compute is not None:
            return "compute" if same_device(device, self.compute) else "other"
        return "compute" if (parse_device(device).type or "") in _ACCELERATORS else "other"
