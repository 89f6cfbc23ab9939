"""Grappler, run offline with its default pipeline, keeps every swap op in place."""

import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, cnn_bn
from tflms.simulation.grappler import grappler_optimize


def rewritten_train_step():
    model, x, y = cnn_bn(BATCH)
    model.train_on_batch(x, y)  # creates the optimizer's variables
    plans = []

    @tf.function
    def step(x, y):
        out = model.train_step((x, y))
        plans.append(
            tflms.LMS(batch_size=BATCH, swapout_threshold=8, min_tensor_bytes=1024).run(
                tf.compat.v1.get_default_graph()
            )
        )
        return out

    spec = (tf.TensorSpec([BATCH, *x.shape[1:]]), tf.TensorSpec([BATCH], tf.int64))
    return step.get_concrete_function(*spec).graph, plans[-1], model


def test_default_grappler_pipeline_keeps_swap_ops_devices_and_triggers():
    graph, plan, _keep = rewritten_train_step()
    assert plan.swaps
    optimized = {node.name: node for node in grappler_optimize(graph).node}
    for swap in plan.swaps:
        out = optimized.get(swap.swapout_name)
        assert out is not None, f"Grappler removed {swap.swapout_name}"
        assert tf.DeviceSpec.from_string(out.device).device_type == "CPU"
        for k, swap_in in enumerate(swap.swap_ins):
            node = optimized.get(swap.swapin_name(k))
            assert node is not None, f"Grappler removed {swap.swapin_name(k)}"
            assert node.input[0].split(":")[0] == swap.swapout_name
            if swap_in.trigger:
                assert f"^{swap_in.trigger}" in node.input
