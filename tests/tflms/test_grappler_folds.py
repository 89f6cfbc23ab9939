"""Plans keep Grappler's rewrites: attention models and mixed precision train bitwise identically.

Grappler's arithmetic optimizer folds chains of adds and products only while
the inner results have one consumer and no control fanout, and the remapper
fuses ops only while the intermediate has one consumer. A swap-out is one more
consumer, a swap-in's trigger a control fanout, a swapped-in input a new
leaf: each can change the rewrite, hence the float rounding. The planner's
rules (:mod:`tflms.graph.grappler_rules`) keep every such link as it is; these
tests train the models where the rules were found, and compare Grappler's
optimized graphs with and without each plan.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tflms
from tests.tflms.models import same_names
from tflms import zoo
from tflms.apply.core import apply_with
from tflms.apply.proto_editor import ProtoEditor
from tflms.graph.grappler_rules import (
    foldable_link,
    folded_to_constants,
    folds_into_a_consumer,
    in_a_fold,
)
from tflms.graph.view import SWAP_ATTR
from tflms.plan.triggers import trigger_filter
from tflms.simulation.grappler.rewrites import compare_rewrites

BATCH = 8


def _chain_view():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        gamma = tf.ones([16], name="gamma")
        beta = tf.zeros([16], name="beta")
        scaled = tf.multiply(x, gamma, name="scaled")
        shifted = tf.add(scaled, beta, name="shifted")  # x * g + b: an add of a product
        total = tf.add(shifted, x, name="total")  # shifted folds into total
        tf.nn.relu(total, name="out")
    return tflms.build_view(g)


def test_the_fold_rules_name_the_ops_of_an_arithmetic_chain():
    view = _chain_view()
    assert foldable_link(view, "shifted", "total")  # add into add
    assert not foldable_link(view, "total", "out")
    assert folds_into_a_consumer(view, "shifted") and not folds_into_a_consumer(view, "total")
    # the chain's root and its inner add take part in the fold; the ReLU after it does not
    assert in_a_fold(view, "shifted") and in_a_fold(view, "total")
    assert not in_a_fold(view, "out")
    ok = trigger_filter(view)
    assert not ok("shifted") and not ok("total") and ok("out")


def _traced_step(model, x, y):
    model.train_on_batch(x[:BATCH], y[:BATCH])  # builds the optimizer's variables

    @tf.function
    def step(x, y):
        return model.train_step((x, y))

    specs = (
        tf.TensorSpec([BATCH, *x.shape[1:]], x.dtype),
        tf.TensorSpec([BATCH, *y.shape[1:]], y.dtype),
    )
    return step.get_concrete_function(*specs).graph


_TRACED: dict = {}


def _traced_language_step(name):
    """``LANGUAGE[name]``'s traced train step, built once per module: building and tracing
    takes ~9 s of the ~11 s a comparison takes; the graph is only read (views, GraphDef
    copies), never changed."""
    if name not in _TRACED:
        model = LANGUAGE[name]()
        x, y = zoo.synthetic_data(model, BATCH)
        _TRACED[name] = (model, _traced_step(model, x, y))  # the model keeps its graph alive
    return _TRACED[name][1]


def _fetches(graph):
    return [t.op.name for t in graph.outputs] + [op.name for op in graph.control_outputs]


def test_a_blocked_fusion_is_reported():
    """The check can fail: a consumer hung on a MatMul's output stops the CPU remapper's
    MatMul + BiasAdd fusion, and the comparison names the op."""

    @tf.function
    def step(x, w, b):
        return tf.reduce_sum(tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w, name="mm"), b)))

    specs = (tf.TensorSpec([8, 16]), tf.TensorSpec([16, 16]), tf.TensorSpec([16]))
    graph = step.get_concrete_function(*specs).graph
    original = graph.as_graph_def()
    rewritten = graph.as_graph_def()
    mm = next(n for n in rewritten.node if n.op == "MatMul")
    out = rewritten.node.add(name="lms/swapout_mm", op="Identity", input=[mm.name])
    out.attr["T"].type = mm.attr["T"].type
    out.attr[SWAP_ATTR].s = b"out"
    out.attr["_grappler_do_not_remove"].b = True
    total = next(n for n in rewritten.node if n.op == "Sum")
    total.input.append(f"^{out.name}")  # keep it in the fetches' fan-in
    fetches = _fetches(graph)
    same = compare_rewrites(original, original, fetches=fetches, device="/device:CPU:1")
    assert same.agree, same.summary()
    check = compare_rewrites(original, rewritten, fetches=fetches, device="/device:CPU:1")
    assert not check.agree
    assert any(mm.name in d.mentions() for d in check.differences), check.summary()


OPTION_SETS = {
    # the single swap of an attention projection's bias add, with a near trigger
    "aggressive": dict(swapout_threshold=4, swapin_ahead=2, min_tensor_bytes=0),
    # what the equivalence suite uses: weight gradients too
    "equivalence": dict(
        swapout_threshold=8, swapin_ahead=3, min_tensor_bytes=1024, swap_weight_gradients=True
    ),
    "recompute": dict(
        swapout_threshold=4, swapin_ahead=2, min_tensor_bytes=0, recompute=True, link="pcie3"
    ),
}

LANGUAGE = {
    "gpt2": lambda: zoo.gpt2(vocab=97, seq=32, dim=32, heads=4, layers=2),
    "bert": lambda: zoo.bert(vocab=97, seq=32, dim=32, heads=4, layers=2),
    "transformer": lambda: zoo.transformer(16, 32, heads=4),
}


@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("name", sorted(LANGUAGE))
def test_grapplers_rewrites_agree_with_and_without_the_plan(name, options):
    graph = _traced_language_step(name)
    config = tflms.LMSConfig(batch_size=BATCH, **OPTION_SETS[options])
    plan = tflms.make_plan(tflms.build_view(graph, config=config), config)
    assert plan.swaps or plan.recomputes, plan.summary()
    original, rewritten = graph.as_graph_def(), graph.as_graph_def()
    apply_with(ProtoEditor(rewritten), plan)
    check = compare_rewrites(
        original, rewritten, fetches=_fetches(graph), device="/device:CPU:1", batch_size=BATCH
    )
    assert check.agree, check.summary()


def _train(build, options, devices, *, steps=4, precision="float32"):
    same_names()  # before the policy: clearing Keras's state resets it
    keras.mixed_precision.set_global_policy(precision)
    try:
        model = build()
        x, y = zoo.synthetic_data(model, BATCH * steps)
        callbacks = [tflms.LMSCallback(batch_size=BATCH, **options)] if options is not None else []
        with tf.device(devices.compute):
            model.fit(
                x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks
            )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, callbacks[0].plan if callbacks else None


_PLAIN: dict = {}


def _plain_weights(name, devices, precision="float32"):
    """The weights of ``LANGUAGE[name]`` trained without LMS, trained once per module and
    precision: the models and their data are seeded, so every plain run gives these
    (test_any_options_train_a_small_gpt_bitwise compares many plans with one plain run)."""
    if (name, precision) not in _PLAIN:
        plain, _ = _train(LANGUAGE[name], None, devices, precision=precision)
        _PLAIN[name, precision] = plain.get_weights()
    return _PLAIN[name, precision]


def _assert_bitwise(plain, swapped, plan=None):
    for a, b in zip(plain, swapped.get_weights(), strict=True):
        np.testing.assert_array_equal(b, a, err_msg=plan.summary() if plan else "")


def test_one_swap_of_an_attention_projection_trains_bitwise(devices):
    """The issue's case: the key projection's bias add swapped alone (its trigger used to
    hang on the attention gradient's inner product, which Grappler reassociates)."""
    options = dict(OPTION_SETS["aggressive"], incl_scopes=("transformer_",))
    swapped, plan = _train(LANGUAGE["transformer"], options, devices)
    assert any("key" in s.tensor for s in plan.swaps), plan.summary()
    _assert_bitwise(_plain_weights("transformer", devices), swapped)


# In float32 the same GPT trains bitwise under six option sets that hypothesis draws
# (test_any_options_train_a_small_gpt_bitwise), and Grappler's rewrites of each named set's
# plan are compared op by op (test_grapplers_rewrites_agree_with_and_without_the_plan):
# the float32 runs of the named sets are a benchmark-tier repeat (`make bench`). Mixed
# precision (its casts, the loss scaling) is trained here only, so it stays in `make test`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "precision", [pytest.param("float32", marks=pytest.mark.bench), "mixed_float16"]
)
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
def test_a_gpt_with_dropout_trains_bitwise(options, precision, devices):
    swapped, plan = _train(LANGUAGE["gpt2"], OPTION_SETS[options], devices, precision=precision)
    assert plan.swaps or plan.recomputes, plan.summary()
    _assert_bitwise(_plain_weights("gpt2", devices, precision), swapped, plan)


@pytest.mark.slow
def test_bert_with_dropout_trains_bitwise_under_the_equivalence_options(devices):
    swapped, plan = _train(LANGUAGE["bert"], OPTION_SETS["equivalence"], devices)
    assert plan.swaps, plan.summary()
    _assert_bitwise(_plain_weights("bert", devices), swapped, plan)


@pytest.mark.slow
# each example trains a model: a handful, not the profile's thousands; `devices` is the
# same logical-device pair for every example
@settings(
    max_examples=6,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    options=st.fixed_dictionaries(
        {
            "swapout_threshold": st.integers(1, 12),
            "swapin_ahead": st.integers(1, 6),
            "swapin_groupby": st.integers(0, 6),
            "sync_mode": st.sampled_from([0, 1, 2, 3]),
            "min_tensor_bytes": st.sampled_from([0, 256, 4096]),
            "recompute": st.booleans(),
            "swap_weight_gradients": st.booleans(),
        }
    )
)
def test_any_options_train_a_small_gpt_bitwise(options, devices):
    """A property over the plan's options: a GPT-2-style decoder with dropout and a causal
    mask trains bit for bit as without LMS, whatever the plan swaps or re-runs."""
    swapped, plan = _train(LANGUAGE["gpt2"], options, devices)
    _assert_bitwise(_plain_weights("gpt2", devices), swapped, plan)


def test_what_grappler_folds_to_constants_is_never_moved():
    """The causal mask and the loss gradient's tiled 1/N are computed from shapes alone:
    Grappler folds them to constants, so a swap or a clone of them could only add work."""
    graph = _traced_language_step("gpt2")
    config = tflms.LMSConfig(batch_size=BATCH, recompute=True, **OPTION_SETS["aggressive"])
    view = tflms.build_view(graph, config=config)
    folded = folded_to_constants(view)
    kinds = {view.nodes[op]["type"] for op in folded}
    assert {"LogicalAnd", "Tile"} & kinds, sorted(kinds)  # the mask, the mean's gradient
    plan = tflms.make_plan(view, config)
    assert plan.swaps and not {s.producer for s in plan.swaps} & folded
    assert not {op for group in plan.recomputes for op in group.ops} & folded
    reasons = dict(plan.skipped)
    assert any("folds it into a constant" in why for why in reasons.values()), reasons
