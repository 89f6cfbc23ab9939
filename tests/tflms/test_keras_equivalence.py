"""Training with LMSCallback gives bitwise-identical weights, and really swaps.

Each model trains 50 steps (the 3D U-Net 10: one of its steps costs ten of the
others' on a CPU, and the plan and the function it rewrites are the same at every
step) from the same initial weights and data order: once plainly (once per model,
shared by its lever sets), and once with LMSCallback per lever set (compute on the
"device" logical CPU, swapped tensors through the "host" one) - swapping only,
swapping with recomputation and memory-aware ordering, and recomputing dense ops.
The weights must be equal bit for bit, the plan must contain swaps (for the LSTM:
of the lists its time loop keeps for the gradient loop; the loops themselves are
left alone) and the function TensorFlow registered for training must contain the
swap ops."""

import numpy as np
import pytest
import tensorflow as tf

import tflms
from tests.tflms.keras_models import BATCH, MODELS, registered_swap_ops
from tests.tflms.models import same_names

STEPS = 50
# Conv3D and its gradients: each unet3d step takes ~0.2 s on 2 cores, 50 steps twice made
# its three cases 72 of this file's 146 s. Ten steps still run the rewritten function ten
# times with changing weights and optimizer state.
STEPS_OF = {"unet3d": 10}

# Weight gradients too (the defaults leave them out): the most swaps, the strictest check.
LMS_OPTIONS = dict(
    batch_size=BATCH,
    swapout_threshold=8,
    swapin_ahead=3,
    min_tensor_bytes=1024,
    swap_weight_gradients=True,
)


def _train(build, devices, callbacks=(), steps=STEPS):
    same_names()
    model, x, y = build(BATCH * steps)
    with tf.device(devices.compute):
        history = model.fit(
            x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks)
        )
    return model, history


_PLAIN: dict = {}


def _plain(name, devices, steps):
    """The plain run's (weights, losses), trained once per model for its three lever sets:
    the models and data are seeded (tests/tflms/keras_models.py), so every plain run of a
    model gives these."""
    if name not in _PLAIN:
        model, history = _train(MODELS[name], devices, steps=steps)
        _PLAIN[name] = (model.get_weights(), history.history["loss"])
    return _PLAIN[name]


LEVERS = {
    "swap": {},
    # a shorter threshold: more swaps, so that ordering has a peak to lower in every model
    "recompute+order": dict(
        recompute=True, reorder=True, link="ideal", swapout_threshold=4, swapin_ahead=2
    ),
    # every dense op whose re-run beats 10 copies of its output over PCIe3: chained groups.
    # Grappler fuses the clones as it fuses their originals (they read gates), but a group
    # that starts or ends inside a fused Conv + BiasAdd + ReLU chain splits it; the check
    # then pins such chains round after round (the 3D U-Net: no dense op left to re-run).
    # Without the check, this shows the lever itself computes the same bits on the CPU,
    # where the fused and unfused kernels agree.
    "recompute dense": dict(
        recompute=True, recompute_dense=10.0, link="pcie3", check_rewrites=False
    ),
}
DENSE = {"Conv2D", "Conv3D", "MatMul", "BatchMatMulV2", "Einsum"}


@pytest.mark.slow
@pytest.mark.parametrize("levers", sorted(LEVERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_is_bitwise_identical(name, levers, devices):
    steps = STEPS_OF.get(name, STEPS)
    plain_weights, plain_losses = _plain(name, devices, steps)
    callback = tflms.LMSCallback(**{**LMS_OPTIONS, **LEVERS[levers]})
    swapped, lms_hist = _train(MODELS[name], devices, [callback], steps=steps)

    for w_plain, w_lms in zip(plain_weights, swapped.get_weights(), strict=True):
        np.testing.assert_array_equal(w_lms, w_plain)
    assert lms_hist.history["loss"] == plain_losses

    plan = callback.plan
    assert plan is not None
    if name == "lstm":
        # the loop itself is left alone; the lists of per-step tensors it keeps for
        # the gradient loop (tflms.graph.loops) are swapped whole
        assert any("control-flow" in note for note in plan.notes), plan.notes
        loop_swaps = [s for s in plan.swaps if s.dtype == "variant"]
        assert loop_swaps, plan.summary()
        assert all(callback.view.nodes[s.producer]["type"] == "While" for s in loop_swaps)
    elif levers != "recompute dense":  # re-running every layer may leave nothing to swap
        assert len(plan.swaps) > 0, plan.summary()
    # the function TensorFlow registered for training holds every op the plan inserts
    assert plan.op_names() <= registered_swap_ops(), "plan ops missing from the registered function"
    # the levers were really pulled (the MLP's activations are ReLUs of matmuls: only
    # recompute_dense re-runs them; its momentum products are refused, see recompute.veto)
    if "recompute" in levers and (name != "mlp" or levers == "recompute dense"):
        assert plan.recomputes, plan.summary()
    if levers == "recompute+order":
        assert plan.order, plan.summary()
    if levers == "recompute dense" and name != "lstm":
        graph = callback.view
        rerun = {graph.nodes[op]["type"] for r in plan.recomputes for op in r.ops}
        assert rerun & DENSE, plan.summary()
