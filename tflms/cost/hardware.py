"""Device and link models for the simulator: what a GPU and its host link can do.

The simulator (:func:`tflms.simulate`) times each op with a roofline on a
:class:`DeviceModel` and each swap copy at the bandwidth of a
:class:`LinkModel`. The presets are the data-sheet figures of real parts
(every number the simulator prints is simulated, never measured):

============  ========  ==========================  ===============  ==========
preset        memory    dense float32 (as TF runs)  vector float32   bandwidth
============  ========  ==========================  ===============  ==========
V100-16GB     16 GiB    15.7 TFLOP/s (no TF32)      15.7 TFLOP/s     900 GB/s
V100-32GB     32 GiB    15.7 TFLOP/s                15.7 TFLOP/s     900 GB/s
A100-80GB     80 GiB    156 TFLOP/s (TF32 cores)    19.5 TFLOP/s     2039 GB/s
H100-80GB     80 GiB    495 TFLOP/s (TF32 cores)    67 TFLOP/s       3350 GB/s
============  ========  ==========================  ===============  ==========

TensorFlow runs float32 convolutions and matmuls on TF32 tensor cores on
Ampere and later unless told otherwise, hence the dense rate. Links are per
direction (copies to and from the host overlap on separate streams):
``pcie3`` 12 GB/s (x16, effective), ``pcie4`` 24 GB/s, ``pcie5`` 48 GB/s,
``nvlink2`` 75 GB/s (POWER9 CPU-GPU, three bricks), ``ideal`` infinitely fast.

Example:
    >>> dev = get_device("V100-16GB")
    >>> dev.memory_bytes == 16 * 2**30, dev.dense_flops
    (True, 15700000000000.0)
    >>> get_link("nvlink2").seconds(75 * 10**9) > 1.0
    True
    >>> get_link("ideal").seconds(10**12)
    0.0
    >>> get_device("P100")
    Traceback (most recent call last):
    ...
    tflms.errors.ConfigError: Unknown device model 'P100'. Known presets: ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tflms.errors import ConfigError

__all__ = ["DeviceModel", "LinkModel", "DEVICES", "LINKS", "HOST", "get_device", "get_link"]

GIB = 1 << 30


@dataclass(frozen=True)
class DeviceModel:
    """A compute device for the roofline time model.

    An op takes ``kernel_overhead_s + max(flops / rate, bytes / bandwidth)``
    where ``rate`` is ``dense_flops * dense_efficiency`` for convolutions and
    matmuls (``half_dense_flops`` for 16-bit floats) and ``vector_flops`` for
    the rest, and ``bandwidth`` is ``memory_bandwidth * memory_efficiency``.

    Attributes:
        name: preset name, e.g. ``"V100-16GB"``.
        memory_bytes: device memory (the default memory budget).
        dense_flops: peak FLOP/s of float32 convolutions/matmuls as TF runs them.
        half_dense_flops: peak FLOP/s of float16/bfloat16 convolutions/matmuls.
        vector_flops: peak float32 FLOP/s of elementwise work.
        memory_bandwidth: device memory bandwidth, bytes/s.
        dense_efficiency: fraction of ``dense_flops`` cuDNN/cuBLAS reach.
        memory_efficiency: fraction of ``memory_bandwidth`` kernels reach.
        kernel_overhead_s: fixed cost per kernel (launch and tail).
        description: what the numbers are.
    """

    name: str
    memory_bytes: int
    dense_flops: float
    half_dense_flops: float
    vector_flops: float
    memory_bandwidth: float
    dense_efficiency: float = 0.6
    memory_efficiency: float = 0.75
    kernel_overhead_s: float = 4e-6
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "dense_flops", "half_dense_flops", "vector_flops"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"DeviceModel.{name} must be > 0. Received {name}={getattr(self, name)!r}."
                )
        if self.memory_bandwidth <= 0:
            raise ConfigError(
                f"DeviceModel.memory_bandwidth must be > 0 bytes/s. "
                f"Received memory_bandwidth={self.memory_bandwidth!r}."
            )
        for name in ("dense_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(
                    f"DeviceModel.{name} must be in (0, 1]. Received {name}={value!r}."
                )
        if self.kernel_overhead_s < 0:
            raise ConfigError(
                f"DeviceModel.kernel_overhead_s must be >= 0. "
                f"Received kernel_overhead_s={self.kernel_overhead_s!r}."
            )

    def to_dict(self) -> dict:
        """The model as plain JSON-ready values."""
        return asdict(self)


@dataclass(frozen=True)
class LinkModel:
    """The host link that swap copies use; each direction has its own stream.

    Attributes:
        name: preset name, e.g. ``"pcie3"``.
        bandwidth: bytes/s per direction (``float("inf")`` for ``ideal``).
        latency_s: fixed cost per copy.
        description: what the numbers are.
    """

    name: str
    bandwidth: float
    latency_s: float = 10e-6
    description: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ConfigError(
                f"LinkModel.bandwidth must be > 0 bytes/s. Received bandwidth={self.bandwidth!r}."
            )
        if self.latency_s < 0:
            raise ConfigError(
                f"LinkModel.latency_s must be >= 0. Received latency_s={self.latency_s!r}."
            )

    def seconds(self, nbytes: int) -> float:
        """Time to copy ``nbytes`` one way.

        Args:
            nbytes: Bytes to copy.

        Returns:
            Seconds: latency plus ``nbytes / bandwidth``; 0.0 for an infinitely
            fast link (the ``"ideal"`` preset).
        """
        if self.bandwidth == float("inf"):
            return 0.0
        return self.latency_s + nbytes / self.bandwidth

    def to_dict(self) -> dict:
        """The model as plain JSON-ready values (infinite bandwidth as ``None``)."""
        data = asdict(self)
        if data["bandwidth"] == float("inf"):
            data["bandwidth"] = None
        return data


DEVICES: dict[str, DeviceModel] = {
    d.name: d
    for d in (
        DeviceModel(
            "V100-16GB",
            16 * GIB,
            15.7e12,
            125e12,
            15.7e12,
            900e9,
            description="NVIDIA V100 SXM2 16 GB: 15.7 TFLOP/s float32, 900 GB/s HBM2",
        ),
        DeviceModel(
            "V100-32GB",
            32 * GIB,
            15.7e12,
            125e12,
            15.7e12,
            900e9,
            description="NVIDIA V100 SXM2 32 GB: 15.7 TFLOP/s float32, 900 GB/s HBM2",
        ),
        DeviceModel(
            "A100-80GB",
            80 * GIB,
            156e12,
            312e12,
            19.5e12,
            2039e9,
            description="NVIDIA A100 SXM 80 GB: 156 TFLOP/s TF32, 19.5 float32, 2039 GB/s HBM2e",
        ),
        DeviceModel(
            "H100-80GB",
            80 * GIB,
            495e12,
            989e12,
            67e12,
            3350e9,
            description="NVIDIA H100 SXM 80 GB: 495 TFLOP/s TF32, 67 float32, 3350 GB/s HBM3",
        ),
    )
}

HOST = DeviceModel(
    "host-CPU",
    256 * GIB,
    1.0e12,
    1.0e12,
    1.0e12,
    100e9,
    kernel_overhead_s=2e-6,
    description="a two-socket server CPU: about 1 TFLOP/s, 100 GB/s DRAM",
)
"""Times ops placed on the host (other than swap copies)."""

LINKS: dict[str, LinkModel] = {
    link.name: link
    for link in (
        LinkModel("pcie3", 12e9, description="PCIe 3.0 x16, about 12 GB/s per direction"),
        LinkModel("pcie4", 24e9, description="PCIe 4.0 x16, about 24 GB/s per direction"),
        LinkModel("pcie5", 48e9, description="PCIe 5.0 x16, about 48 GB/s per direction"),
        LinkModel(
            "nvlink2", 75e9, description="NVLink 2.0 CPU-GPU (POWER9), 75 GB/s per direction"
        ),
        LinkModel("ideal", float("inf"), 0.0, description="copies take no time"),
    )
}


def get_device(device: str | DeviceModel) -> DeviceModel:
    """A :class:`DeviceModel` from a preset name (case-insensitive) or itself.

    Args:
        device: A preset name of :data:`DEVICES` (``"V100-16GB"``...) or a
            :class:`DeviceModel`.

    Returns:
        The preset, or ``device`` itself.

    Raises:
        ConfigError: the name is not a preset.
    """
    if isinstance(device, DeviceModel):
        return device
    by_lower = {name.lower(): model for name, model in DEVICES.items()}
    if isinstance(device, str) and device.lower() in by_lower:
        return by_lower[device.lower()]
    raise ConfigError(
        f"Unknown device model {device!r}. Known presets: {', '.join(DEVICES)}; "
        "or pass a tflms.cost.hardware.DeviceModel(...)."
    )


def get_link(link: str | LinkModel) -> LinkModel:
    """A :class:`LinkModel` from a preset name (case-insensitive) or itself.

    Args:
        link: A preset name of :data:`LINKS` (``"pcie3"``, ``"nvlink2"``,
            ``"ideal"``...) or a :class:`LinkModel`.

    Returns:
        The preset, or ``link`` itself.

    Raises:
        ConfigError: the name is not a preset.
    """
    if isinstance(link, LinkModel):
        return link
    if isinstance(link, str) and link.lower() in LINKS:
        return LINKS[link.lower()]
    raise ConfigError(
        f"Unknown link model {link!r}. Known presets: {', '.join(LINKS)}; "
        "or pass a tflms.cost.hardware.LinkModel(...)."
    )
