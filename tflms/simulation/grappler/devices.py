"""The virtual cluster Grappler simulates on: a V100-like GPU and a host CPU.

Example:
    >>> virtual_gpu().type, virtual_cpu().type
    ('GPU', 'CPU')
"""

from __future__ import annotations

import functools

import tensorflow as tf
from tensorflow.core.protobuf import device_properties_pb2
from tensorflow.python.grappler import cluster as gcluster
from tensorflow.python.grappler import item as gitem

from tflms.cost.hardware import get_device
from tflms.cost.target import DEFAULT_DEVICE
from tflms.errors import ConfigError, UnsupportedGraphError

__all__ = [
    "GIB",
    "UNLIMITED_BYTES",
    "SIMULATOR",
    "VIRTUAL_GPU",
    "VIRTUAL_GPU_BYTES",
    "CPU_DEVICE_BYTES",
    "virtual_gpu",
    "virtual_cpu",
    "local_cpu",
    "make_cluster",
    "make_item",
]

GIB = 1 << 30
VIRTUAL_GPU = "/device:GPU:0"
"""The name of the virtual cluster's GPU: where the bridge places every op not on the host."""
VIRTUAL_GPU_BYTES = get_device(DEFAULT_DEVICE).memory_bytes
"""The virtual GPU's memory unless given: the default device preset's
(:data:`tflms.cost.target.DEFAULT_DEVICE`, the V100 the virtual GPU's speeds are of)."""
CPU_DEVICE_BYTES = 256 << 20
"""The memory TensorFlow's CPU device declares (its ``DeviceAttributes.memory_limit``,
whatever the machine has), which Grappler takes for the device's size when it
optimizes a step that runs there. It matters to one rewrite: the memory
optimizer's scheduling pass turns a sum of 3+ inputs (``AddN``) into a
``TemporaryVariable`` that ``AssignAdd`` ops accumulate into *in the order the
inputs arrive*, when Grappler's static peak of the step exceeds 80% of the
device's size and one of the sum's inputs is live at that peak: on the CPU,
any step whose static peak passes 205 MiB."""
UNLIMITED_BYTES = 1 << 50
"""1 PiB: a virtual device size that never refuses a graph (``fits`` is judged separately)."""
SIMULATOR = f"grappler VirtualCluster + GraphMemory.InferStatically (TF {tf.__version__})"


def virtual_gpu(memory_bytes: int = VIRTUAL_GPU_BYTES) -> device_properties_pb2.DeviceProperties:
    """Properties of a V100-like virtual GPU: 80 SMs at 1530 MHz, 900 GB/s.

    Args:
        memory_bytes: device memory; Grappler only compares the peak with it.

    Returns:
        A ``DeviceProperties`` proto of type ``GPU``.
    """
    return device_properties_pb2.DeviceProperties(
        type="GPU",
        vendor="NVIDIA",
        model="virtual V100",
        frequency=1530,  # MHz
        num_cores=80,
        environment={"architecture": "7.0"},
        num_registers=65536,
        l1_cache_size=128 << 10,
        l2_cache_size=6 << 20,
        shared_memory_size_per_multiprocessor=96 << 10,
        memory_size=memory_bytes,
        bandwidth=900_000_000,  # KB/s
    )


def virtual_cpu(memory_bytes: int = 256 * GIB) -> device_properties_pb2.DeviceProperties:
    """Properties of a virtual host: 20 cores at 2600 MHz, 100 GB/s.

    Args:
        memory_bytes: host memory size.

    Returns:
        A ``DeviceProperties`` proto of type ``CPU``.
    """
    return device_properties_pb2.DeviceProperties(
        type="CPU", frequency=2600, num_cores=20, memory_size=memory_bytes, bandwidth=100_000_000
    )


@functools.cache
def _local_cpu() -> bytes:
    cluster = gcluster.Cluster(disable_detailed_stats=True, disable_timeline=True)
    try:
        found = [d.properties for d in cluster.ListDevices() if d.properties.type == "CPU"]
    finally:
        cluster.Shutdown()
    return found[0].SerializeToString() if found else b""


def local_cpu() -> device_properties_pb2.DeviceProperties:
    """This machine's CPU as TensorFlow describes it to Grappler when it optimizes a step
    that runs there: its cores, frequency and caches (which set the op times of
    Grappler's static schedule, hence where its static peak falls) and
    :data:`CPU_DEVICE_BYTES`. Falls back to :func:`virtual_cpu` of that size where
    TensorFlow lists no CPU.
    """
    props = device_properties_pb2.DeviceProperties()
    raw = _local_cpu()
    if raw:
        props.ParseFromString(raw)
    else:
        props.CopyFrom(virtual_cpu(CPU_DEVICE_BYTES))
    props.memory_size = CPU_DEVICE_BYTES
    return props


def make_cluster(
    device: str,
    host_device: str,
    memory_bytes: int,
    gpu_properties: device_properties_pb2.DeviceProperties | None = None,
    cpu_properties: device_properties_pb2.DeviceProperties | None = None,
    slowdown: int = 1,
    timeline: bool = False,
) -> gcluster.Cluster:
    """A Grappler virtual cluster of one GPU named ``device`` and one host.

    Args:
        device: name of the virtual GPU, e.g. ``"/device:GPU:0"``; a CPU name
            (``"/device:CPU:1"``) makes the compute device a virtual CPU of
            ``memory_bytes`` (what Grappler's CPU-only rewrites key on).
        host_device: name of the virtual host CPU. When it names ``device``
            (a step that runs on the CPU it is hosted on) the cluster has that
            one device, of ``memory_bytes``: Grappler keys a cluster's devices
            by name, so a second entry would replace the compute device's size
            with the host's.
        memory_bytes: memory size of the virtual GPU.
        gpu_properties: the GPU's properties (default :func:`virtual_gpu`).
        cpu_properties: the host's properties (default :func:`virtual_cpu`).
        slowdown: divide both devices' frequency and bandwidth by this.
        timeline: make ``MeasureCosts`` report per-op step stats.

    Returns:
        A ``tensorflow.python.grappler.cluster.Cluster``; call ``Shutdown()``
        when done.

    Raises:
        ConfigError: ``slowdown`` is not an int >= 1.
    """
    if isinstance(slowdown, bool) or not isinstance(slowdown, int) or slowdown < 1:
        raise ConfigError(f"slowdown must be an int >= 1. Received slowdown={slowdown!r}.")
    gpu = device_properties_pb2.DeviceProperties()
    on_cpu = (tf.DeviceSpec.from_string(device).device_type or "").upper() == "CPU"
    gpu.CopyFrom(gpu_properties or (virtual_cpu() if on_cpu else virtual_gpu()))
    gpu.memory_size = memory_bytes
    cpu = device_properties_pb2.DeviceProperties()
    cpu.CopyFrom(cpu_properties or virtual_cpu())
    for props in (gpu, cpu):
        if props.frequency:
            props.frequency = max(1, props.frequency // slowdown)
        if props.bandwidth:
            props.bandwidth = max(1, props.bandwidth // slowdown)
    devices = [device_properties_pb2.NamedDevice(name=device, properties=gpu)]
    if tf.DeviceSpec.from_string(host_device) != tf.DeviceSpec.from_string(device):
        devices.append(device_properties_pb2.NamedDevice(name=host_device, properties=cpu))
    return gcluster.Cluster(disable_timeline=not timeline, devices=devices)


def make_item(metagraph):
    """A Grappler item of ``metagraph`` (fetches in its ``train_op`` collection).

    Args:
        metagraph: A ``MetaGraphDef`` with a ``train_op`` collection.

    Returns:
        A ``tensorflow.python.grappler.item.Item``.

    Raises:
        UnsupportedGraphError: Grappler rejects the graph.
    """
    try:
        return gitem.Item(metagraph)
    except (tf.errors.OpError, ValueError) as err:
        raise UnsupportedGraphError(
            f"Grappler could not build an item from the graph: {err}. Check that every "
            "placeholder has a dtype and a shape."
        ) from err
