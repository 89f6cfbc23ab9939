"""Device strings: which ops run on the compute device and which on the host.

Example:
    >>> m = DeviceMatcher(compute="/device:GPU:0", host="/device:CPU:0")
    >>> [m.placement(d) for d in ("", "/job:localhost/replica:0/task:0/device:GPU:0", "/cpu:0", "/GPU:1")]
    ['compute', 'compute', 'host', 'other']
    >>> same_device("/gpu:0", "/device:GPU:0")
    True
"""

from __future__ import annotations

import functools

import tensorflow as tf

__all__ = ["DeviceMatcher", "same_device", "canonical", "device_type", "default_compute_type"]

_ACCELERATORS = ("GPU", "TPU")


@functools.lru_cache(maxsize=256)
def _spec(device: str) -> tf.DeviceSpec:
    return tf.DeviceSpec.from_string(device)


def canonical(device: str) -> str:
    """``"/gpu:0"`` -> ``"/device:GPU:0"``; empty stays empty."""
    return _spec(device).to_string() if device else ""


def device_type(device: str) -> str | None:
    """``"/job:x/device:GPU:1"`` -> ``"GPU"``; ``None`` when the string names no type."""
    kind = _spec(device).device_type if device else None
    return kind.upper() if kind else None


def default_compute_type(compute: str | None) -> str:
    """Device type unassigned ops run on: the configured device, else GPU if any."""
    if compute:
        return device_type(compute) or "CPU"
    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def same_device(a: str, b: str) -> bool:
    """Whether two device strings name the same device.

    Device type and index must match (a missing index means 0); job,
    replica and task are compared only when both strings give them.
    """
    sa, sb = _spec(a), _spec(b)
    if (sa.device_type or "").upper() != (sb.device_type or "").upper():
        return False
    if (sa.device_index or 0) != (sb.device_index or 0):
        return False
    for field in ("job", "replica", "task"):
        va, vb = getattr(sa, field), getattr(sb, field)
        if va is not None and vb is not None and va != vb:
            return False
    return True


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
        if not device:
            return "compute"
        if same_device(device, self.host):
            return "host"
        if self.compute is not None:
            return "compute" if same_device(device, self.compute) else "other"
        return "compute" if (_spec(device).device_type or "").upper() in _ACCELERATORS else "other"
