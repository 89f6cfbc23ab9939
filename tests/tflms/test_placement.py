"""Swap-outs run on the host device and swap-ins on the compute device.

Proved from TensorFlow's own placement record: the partition graphs in the
RunMetadata of a Session run (TF1 graphs) and of the eager context (Keras),
where every node is listed under the device it was placed on.
"""

import re

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

import tflms
from tests.tflms.graphs import WIDTH, chain_with_skip
from tests.tflms.keras_models import BATCH, cnn_bn


def _placed(partition_graphs):
    """Node name -> device, with the prefixes of inlined function calls removed."""
    placed = {}
    for graph in partition_graphs:
        for node in graph.node:
            name = re.sub(r"^(?:[^/]*PartitionedCall[^/]*/)+", "", node.name)
            placed[name] = tf.DeviceSpec.from_string(node.device).to_string()
    return placed


def _device(name):
    return tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0" + name).to_string()


def test_session_graph_places_swap_ops_as_planned(devices):
    g = chain_with_skip(n=12)
    with g.as_default():
        for op in g.get_operations():
            op._set_device(devices.compute)
    plan = tflms.LMS(device=devices.compute, swapout_threshold=5, min_tensor_bytes=0).run(g)
    assert plan.swaps
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(
            "out:0", {"x:0": np.ones((8, WIDTH), "float32")}, options=options, run_metadata=metadata
        )
    placed = _placed(metadata.partition_graphs)
    assert placed["lms/swapout_h1_0"] == _device(devices.host)
    assert placed["h1-lms/swapin"] == _device(devices.compute)
    assert placed["out"] == _device(devices.compute)


def test_keras_train_function_places_swap_ops_as_planned(devices):
    model, x, y = cnn_bn(BATCH * 2)
    callback = tflms.LMSCallback(batch_size=BATCH, swapout_threshold=8, min_tensor_bytes=1024)
    ctx = context.context()
    ctx.enable_run_metadata()  # before the function is instantiated
    try:
        with tf.device(devices.compute):
            model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    placed = _placed(pg for fg in metadata.function_graphs for pg in fg.partition_graphs)
    plan = callback.plan
    assert plan.swaps
    for swap in plan.swaps:
        assert placed[swap.swapout_name] == _device(devices.host), swap.swapout_name
        for k in range(len(swap.swap_ins)):
            assert placed[swap.swapin_name(k)] == _device(devices.compute), swap.swapin_name(k)
