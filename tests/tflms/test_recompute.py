"""Recomputation of dense ops (``LMSConfig.recompute_dense``): which ops, chained groups,
values unchanged, and plans without swaps still applied."""

import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms import LMSConfig
from tflms.cost.hardware import get_device, get_link
from tflms.errors import ConfigError
from tflms.plan.recompute import MAX_CHAIN_OPS, plan_recomputes, worth_rerunning

WIDTH, BATCH, LAYERS = 256, 512, 6


def mlp_graph(batch=BATCH):
    """Six matmul + relu layers, a loss and its gradient: a long backward pass."""
    g = tf.Graph()
    rng = np.random.default_rng(3)
    with g.as_default():
        h = x = tf.compat.v1.placeholder(tf.float32, [batch, WIDTH], name="x")
        for i in range(LAYERS):
            w = tf.constant(rng.standard_normal((WIDTH, WIDTH)).astype("float32") * 0.05)
            h = tf.nn.relu(tf.linalg.matmul(h, w, name=f"mm{i}"), name=f"act{i}")
        loss = tf.reduce_sum(h * h, name="loss")
        tf.gradients(loss, [x], name="grad")
    return g


def _config(**changes):
    options = dict(swapout_threshold=4, swapin_ahead=2, min_tensor_bytes=0, recompute=True)
    return LMSConfig(**{**options, **changes})


def _types(view, plan):
    return {view.nodes[op]["type"] for group in plan.recomputes for op in group.ops}


def test_a_matmul_is_worth_rerunning_only_when_faster_than_its_copy():
    view = tflms.build_view(mlp_graph())
    device = get_device("V100-16GB")
    fast, seconds = worth_rerunning(view, "mm1", device, get_link("pcie3"), 1.0)
    copy = get_link("pcie3").seconds(BATCH * WIDTH * 4)
    assert fast and 0 < seconds < copy
    # a ratio below recompute time / copy time refuses it, an infinitely fast link too
    assert not worth_rerunning(view, "mm1", device, get_link("pcie3"), seconds / copy / 2)[0]
    assert not worth_rerunning(view, "mm1", device, get_link("ideal"), 10.0)[0]
    assert not worth_rerunning(view, "mm1", device, get_link("pcie3"), 0.0)[0]
    assert not worth_rerunning(view, "act1", device, get_link("pcie3"), 10.0)[0]  # not dense


def test_dense_groups_chain_through_matmuls_and_move_less():
    view = tflms.build_view(mlp_graph())
    cheap = tflms.make_plan(view, _config())
    dense = tflms.make_plan(view, _config(recompute_dense=10.0))
    assert "MatMul" not in _types(view, cheap)
    assert "MatMul" in _types(view, dense)
    # merged: one group re-runs several layers, its clones reading its own clones
    longest = max(dense.recomputes, key=lambda g: len(g.ops))
    assert 4 <= len(longest.ops) <= MAX_CHAIN_OPS
    assert sum(op.startswith("mm") for op in longest.ops) >= 2
    # re-running costs less time than PCIe3 copies of the same tensors, and still saves memory
    assert dense.bytes_swapped < cheap.bytes_swapped
    plain = tflms.simulate(view, link="pcie3", accounting="tensors")
    with_cheap = tflms.simulate(view, cheap, link="pcie3", baseline=plain, accounting="tensors")
    with_dense = tflms.simulate(view, dense, link="pcie3", baseline=plain, accounting="tensors")
    assert with_dense.step_time_s < with_cheap.step_time_s
    assert with_dense.device_peak_bytes < plain.device_peak_bytes
    # the planner's groups are disjoint
    ops = [op for group in dense.recomputes for op in group.ops]
    assert len(ops) == len(set(ops))


def test_dense_recomputation_computes_the_same_values():
    g = mlp_graph()
    original = g.as_graph_def()
    config = _config(recompute_dense=10.0)
    plan = tflms.make_plan(tflms.build_view(g, config=config), config)
    assert any(len(group.ops) > 2 for group in plan.recomputes)
    tflms.apply_plan(g, plan)
    tflms.validate(g, plan)
    feed = np.random.default_rng(0).standard_normal((BATCH, WIDTH)).astype("float32")
    got = []
    for graph_def in (original, g.as_graph_def()):
        with tf.Graph().as_default() as run, tf.compat.v1.Session(graph=run) as sess:
            tf.graph_util.import_graph_def(graph_def, name="")
            got.append(sess.run(["loss:0", "grad/mm0_grad/MatMul:0"], {"x:0": feed}))
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_lms_applies_a_plan_that_only_recomputes():
    g = mlp_graph()
    # a threshold only the layers' inputs exceed: re-run, with nothing left to swap
    plan = tflms.LMS(_config(recompute_dense=10.0, swapout_threshold=9)).run(g)
    assert plan.recomputes and not plan.swaps
    inserted = {op.name for op in g.get_operations() if "lms/" in op.name}
    assert inserted == plan.op_names()


def test_plan_recomputes_without_dense_ignores_the_link():
    view = tflms.build_view(mlp_graph())
    configs = [_config(link=link) for link in ("ideal", "pcie3")]
    ideal, pcie3 = (plan_recomputes(view, config, config.target()) for config in configs)
    assert ideal == pcie3
    assert "MatMul" not in {view.nodes[op]["type"] for group in ideal for op in group.ops}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(recompute_dense=0.5), "unless recompute=True"),
        (dict(recompute=True, recompute_dense=-1), "a number in [0, 10]"),
        (dict(recompute=True, recompute_dense=True), "a number in [0, 10]"),
        (dict(recompute=True, recompute_dense="fast"), "a number in [0, 10]"),
    ],
)
def test_recompute_dense_is_validated(changes, message):
    with pytest.raises(ConfigError, match="recompute_dense") as err:
        LMSConfig(**changes)
    assert message in str(err.value)


def test_plans_without_the_option_still_load():
    view = tflms.build_view(mlp_graph())
    plan = tflms.make_plan(view, _config())
    data = plan.to_dict()
    data["config"].pop("recompute_dense")  # a plan written before the option existed
    loaded = tflms.SwapPlan.from_dict(data)
    assert loaded.recomputes == plan.recomputes
    assert loaded.config.recompute_dense == 0.0


def test_autotune_reruns_matmuls_over_a_slow_link_only():
    view = tflms.build_view(mlp_graph(batch=8 * BATCH))  # activations outweigh the weights
    plain = tflms.simulate(view, accounting="tensors").device_peak_bytes
    # 82%: the tuner re-runs matmuls over PCIe3 (80% took an order edge from an op of a
    # Grappler fold too, which memory-aware ordering no longer adds)
    budget = int(plain * 0.82)
    slow = tflms.autotune(view, budget, safety_margin=0, link="pcie3")
    fast = tflms.autotune(view, budget, safety_margin=0, link="ideal")
    assert slow.lms_needed and slow.result.device_peak_bytes <= budget
    # matmuls re-run where copies are too slow: dense ops beside swaps, or whole segments
    assert slow.config.recompute_dense > 0 or slow.config.recompute_segments, slow.summary()
    assert "MatMul" in _types(view, slow.plan)
    assert fast.config.recompute_dense == 0  # the tuner does not try it without copy time
    assert any(c.options["recompute_dense"] for c in slow.candidates)


@pytest.mark.slow
def test_a_budget_over_pcie3_weighs_rerunning_convolutions_and_training_is_bitwise(devices):
    """End to end: LMSCallback(memory_budget=...) over PCIe3 tries re-running convolutions,
    and with the plan it picks the weights after three steps equal those of plain training.

    Whether dense re-runs win here depends on the other levers: since swap-in triggers
    and order edges keep off the ops of Grappler's folds, swaps with plain recompute do
    (``tests/tflms/test_keras_equivalence.py`` trains dense re-runs bitwise on every model).
    """
    from tflms import zoo

    batch, steps = 256, 3
    plain_peak = tflms.simulate(
        tflms.analyze(zoo.resnet(), batch_size=batch), accounting="tensors"
    ).device_peak_bytes
    weights = []
    for callbacks in ([], "lms"):
        model = zoo.resnet()
        x, y = zoo.synthetic_data(model, batch * steps)
        if callbacks:
            lms = tflms.LMSCallback(
                memory_budget=int(plain_peak * 0.7), safety_margin=0, link="pcie3"
            )
            callbacks = [lms]
        with tf.device(devices.compute):
            model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=callbacks)
        weights.append(model.get_weights())
    tuned = lms.tunings[0]
    assert tuned.lms_needed, tuned.summary()
    assert any(c.options["recompute_dense"] for c in tuned.candidates), tuned.summary()
    if tuned.config.recompute_dense > 0:
        assert {"Conv2D", "MatMul"} & _types(lms.view, lms.plan), lms.plan.summary()
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_swap_off_plans_recomputation_and_order_alone():
    """``LMSConfig(swap=False)``: nothing leaves the device; the other levers still plan."""
    view = tflms.build_view(mlp_graph())
    plan = tflms.make_plan(view, _config(swap=False, recompute_dense=10.0, swapout_threshold=9))
    assert not plan.swaps and plan.recomputes
    assert "swapping is off (LMSConfig.swap=False)" in plan.summary()
    with pytest.raises(ConfigError, match=r"swap=False\) with no other lever plans nothing"):
        tflms.LMS(swap=False).plan(mlp_graph())


def test_a_budget_with_swap_off_is_met_by_recomputation_and_trains_bitwise(devices):
    """A CPU user's budget in the tensors accounting, with swaps off: the auto-tuner
    searches recomputation and order only, and training equals plain training."""
    from tflms import zoo

    batch, steps = 64, 3
    plain_peak = tflms.simulate(
        tflms.analyze(zoo.cnn(32, (16, 16, 32, 32)), batch_size=batch), accounting="tensors"
    ).device_peak_bytes
    budget = int(plain_peak * 0.9)
    weights = []
    for callbacks in ([], "lms"):
        model = zoo.cnn(32, (16, 16, 32, 32))
        x, y = zoo.synthetic_data(model, batch * steps)
        if callbacks:
            lms = tflms.LMSCallback(memory_budget=budget, safety_margin=0, swap=False)
            callbacks = [lms]
        with tf.device(devices.compute):
            model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=callbacks)
        weights.append(model.get_weights())
    tuned = lms.tunings[0]
    assert tuned.lms_needed and tuned.target.accounting == "tensors"
    assert not lms.plan.swaps and (lms.plan.recomputes or lms.plan.order), lms.plan.summary()
    assert tuned.result.device_peak_bytes <= budget
    assert all(c.swaps == 0 for c in tuned.candidates)
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_clone_serves_the_backward_pass_not_a_forward_reader_across_a_block():
    """A residual add reads its block's input across the block, more than swapout_threshold
    levels on: rerouted to a clone, it had the clones (whole dense chains) made in the
    forward pass and kept until the backward pass. bench_fidelity's ResNet-50 (batch 64,
    recompute_dense=0.25 over PCIe3) peaked at 3.0 GiB so, against 1.85 without dense
    re-runs. Forward readers stay on the originals when a group has backward readers."""
    from benchmarks.models import resnet50
    from tflms.plan.phases import turn_level

    view = tflms.build_view(resnet50().trace(16, (64, 64, 3)))
    levels = {n: d["level"] for n, d in view.nodes(data=True)}
    turn = turn_level(view)
    depth = view.graph["depth"]
    config = LMSConfig(
        swapout_threshold=max(1, depth // 40), swapin_ahead=3, recompute=True,
        recompute_dense=0.25, link="pcie3",
    )  # fmt: skip
    plan = tflms.make_plan(view, config)
    assert plan.recomputes
    for r in plan.recomputes:
        sides = {levels[c] >= turn for c, _, _, _ in r.consumers}
        assert len(sides) == 1, (r.ops[-1], sorted(levels[c] for c, *_ in r.consumers), turn)
        if sides == {True}:
            assert r.trigger_level >= turn - config.swapin_ahead - 1, r.trigger
    without = tflms.make_plan(view, config.replace(recompute_dense=0.0))
    peak = tflms.simulate(view, plan, accounting="tensors").device_peak_bytes
    assert peak <= 1.05 * tflms.simulate(view, without, accounting="tensors").device_peak_bytes
