"""Grappler's optimizer pipeline, run offline as on a machine with a GPU."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, device_properties_pb2
from tensorflow.python.grappler import tf_optimizer

from tflms.errors import UnsupportedGraphError
from tflms.simulation.grappler.devices import VIRTUAL_GPU, VIRTUAL_GPU_BYTES, make_cluster
from tflms.simulation.grappler.metagraph import prepare_metagraph

__all__ = ["grappler_optimize"]

logger = logging.getLogger(__name__)


def grappler_optimize(
    graph_or_graphdef,
    *,
    fetches=None,
    device: str = VIRTUAL_GPU,
    host_device: str = "/device:CPU:0",
    gpu_memory_bytes: int = VIRTUAL_GPU_BYTES,
    batch_size: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    config: config_pb2.ConfigProto | None = None,
    optimizers: Iterable[str] | None = None,
    device_properties: device_properties_pb2.DeviceProperties | None = None,
) -> graph_pb2.GraphDef:
    """Run Grappler's optimizer pipeline offline, as on a machine with a GPU.

    The MetaGraph is built as for :func:`grappler_peak` (same placement, same
    fetches kept), so the result shows what TensorFlow would run: inserted
    Identity ops survive only with ``_grappler_do_not_remove``, function calls
    are inlined, and the layout optimizer may add NHWC/NCHW transposes on the
    GPU. Feed the result to :func:`grappler_peak` for the optimized peak.

    Args:
        graph_or_graphdef: as for :func:`grappler_peak`.
        fetches: as for :func:`grappler_peak`; Grappler never removes them.
        device: name of the compute device: a virtual GPU, or a CPU to see the
            rewrites Grappler applies to a step that runs on the CPU.
        host_device: the graph's host device; it becomes a virtual CPU.
        gpu_memory_bytes: memory size of the virtual GPU.
        batch_size: as for :func:`grappler_peak` (optional here).
        input_shapes: as for :func:`grappler_peak` (optional here).
        config: a ``ConfigProto`` whose ``graph_options.rewrite_options`` steer
            Grappler. Default: TensorFlow's defaults with ``min_graph_nodes=-1``.
        optimizers: names of the only optimizers to run, e.g. ``["dependency"]``.
        device_properties: the compute device's properties (default: a virtual
            V100, or a virtual CPU for a CPU ``device``); its memory is
            ``gpu_memory_bytes``.

    Returns:
        The optimized ``GraphDef``, its nodes placed on ``device``/``host_device``.

    Raises:
        UnsupportedGraphError: the input is not a graph or is empty, or
            Grappler rejects it.
        ConfigError: a keyword has an invalid value.

    Example:
        >>> import tensorflow as tf
        >>> from tflms.simulation.grappler import grappler_optimize
        >>> @tf.function
        ... def step(x):
        ...     return tf.reduce_sum(tf.identity(tf.nn.relu(x), name="copy"))
        >>> graph = step.get_concrete_function(tf.TensorSpec([8, 8])).graph
        >>> sorted(node.op for node in grappler_optimize(graph).node)
        ['Const', 'Identity', 'Placeholder', 'Relu', 'Sum']
        >>> "copy" in {node.name for node in grappler_optimize(graph).node}
        False
    """
    prepared = prepare_metagraph(
        graph_or_graphdef,
        fetches,
        device,
        host_device,
        batch_size,
        input_shapes,
        device_kinds=("GPU", "CPU"),
    )
    options = config_pb2.ConfigProto()
    if config is None:
        options.graph_options.rewrite_options.min_graph_nodes = -1
    else:
        options.CopyFrom(config)
    if optimizers is not None:
        rewrite = options.graph_options.rewrite_options
        del rewrite.optimizers[:]
        rewrite.optimizers.extend(optimizers)
    cluster = make_cluster(device, host_device, gpu_memory_bytes, device_properties, None, 1)
    try:
        optimized = tf_optimizer.OptimizeGraph(
            options, prepared.metagraph, verbose=False, cluster=cluster
        )
    except tf.errors.OpError as err:
        raise UnsupportedGraphError(f"Grappler could not optimize the graph: {err}") from err
    finally:
        cluster.Shutdown()
    logger.info("Grappler optimized %d nodes into %d", prepared.nodes, len(optimized.node))
    return optimized
