"""The split rewrite: the vocabulary loss on row chunks gives the same bits, and frees the device.

A ``SparseSoftmaxCrossEntropyWithLogits`` cut into aligned row chunks (its
backprop chunks kept on the host until the backward pass) returns exactly the
loss and gradient of the whole op, also for a batch of another size than the
one planned; a language model trained with ``LMSCallback(max_op_bytes=...)``
ends with the same weights, bit for bit, as without; and the simulator sees
the logits and their gradient no longer both on the device at the loss, and
dropout masks drawn in their layer rather than all when the step starts.
"""

import numpy as np
import pytest
import tensorflow as tf

import tflms
from tflms import zoo
from tflms.apply.split import finish_view, split_graph
from tflms.errors import ConfigError, ValidationError
from tflms.plan.splits import ALIGN, RANDOM_TYPES, plan_deferrals, plan_splits
from tflms.zoo.data import synthetic_data

VOCAB = 301
ROWS = 96  # planned rows: 6 samples of 16 tokens


def _loss_graph():
    """Logits of unknown rows -> per-row loss and its gradient through a scale."""
    g = tf.Graph()
    with g.as_default():
        logits = tf.compat.v1.placeholder(tf.float32, [None, VOCAB], name="logits")
        labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
        scale = tf.compat.v1.placeholder(tf.float32, [None], name="scale")
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        (grad,) = tf.gradients(tf.reduce_sum(loss * scale), [logits])
        tf.identity(loss, name="loss_out")
        tf.identity(grad, name="grad_out")
    return g


def _run(graph, rows, seed=0):
    rng = np.random.default_rng(seed)
    feed = {
        "logits:0": (rng.standard_normal((rows, VOCAB)) * 3).astype(np.float32),
        "labels:0": rng.integers(0, VOCAB, rows).astype(np.int32),
        "scale:0": rng.standard_normal(rows).astype(np.float32),
    }
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(["loss_out:0", "grad_out:0"], feed)


def _split(graph, max_op_bytes):
    view = tflms.build_view(graph, batch_size=ROWS)
    splits = plan_splits(view, max_op_bytes)
    inserted = split_graph(graph, splits)
    return splits, inserted


@pytest.mark.parametrize("rows", [ROWS, ROWS + 37, 8])
def test_split_loss_and_gradient_are_bitwise_those_of_the_whole_op(rows):
    whole = _run(_loss_graph(), rows)
    graph = _loss_graph()
    splits, inserted = _split(graph, ROWS * VOCAB * 4 // 5 + 1)
    assert [s.chunks for s in splits] == [5] and inserted > 5 * 4
    assert splits[0].boundaries() == [0, 16, 32, 48, 64, ROWS]
    assert all(b % ALIGN == 0 for b in splits[0].boundaries()[:-1])
    cut = _run(graph, rows)
    for a, b in zip(whole, cut, strict=True):
        assert a.shape == b.shape
        np.testing.assert_array_equal(b, a)


def test_the_view_of_a_split_graph_drops_the_op_and_sizes_the_chunks():
    graph = _loss_graph()
    splits, _ = _split(graph, ROWS * VOCAB * 4 // 3)
    (split,) = splits
    view = finish_view(tflms.build_view(graph, batch_size=ROWS), splits)
    assert split.op not in view
    chunks = [n for n in view if "-split/loss_" in n]
    assert len(chunks) == 3
    sizes = [view.nodes[n]["outputs"][1].bytes for n in sorted(chunks)]
    assert sum(sizes) == ROWS * VOCAB * 4
    assert view.nodes[f"{split.op}-split/backprop_host"]["device"] == "/device:CPU:0"


def test_nothing_is_split_below_the_threshold_and_bad_thresholds_are_refused():
    view = tflms.build_view(_loss_graph(), batch_size=ROWS)
    assert plan_splits(view, None) == ()
    assert plan_splits(view, ROWS * VOCAB * 4) == ()
    with pytest.raises(ConfigError, match="max_op_bytes"):
        plan_splits(view, 0)
    with pytest.raises(ConfigError, match="max_op_bytes"):
        tflms.LMSConfig(max_op_bytes="0B")
    assert tflms.LMSConfig(max_op_bytes="1MiB").max_op_bytes == 1 << 20


def test_a_graph_is_split_once():
    graph = _loss_graph()
    view = tflms.build_view(graph, batch_size=ROWS)
    splits = plan_splits(view, 4096)
    split_graph(graph, splits)
    with pytest.raises(ValidationError, match="split already"):
        split_graph(graph, splits)


def test_splitting_lowers_the_simulated_peak_only_where_the_logits_outlive_the_loss():
    """TensorFlow's kernel writes the backprop into the logits' buffer when nothing else
    reads the logits: the loss then holds one logits-sized tensor and a split frees
    nothing at it. A metric reading the logits after the loss keeps both alive there,
    and the split lowers that peak."""
    peaks = {}
    for metrics in ((), ("sparse_categorical_accuracy",)):
        model = zoo.gpt2(vocab=4096, seq=64, dim=32, heads=2, layers=1)
        if metrics:
            model.compile(optimizer=model.optimizer, loss=model.loss, metrics=list(metrics))
        graph = tflms.train_step_graph(model, batch_size=8)
        view = tflms.build_view(graph)
        plain = tflms.simulate(view, accounting="tensors", baseline=False)
        splits = plan_splits(view, 1 << 20)
        split_graph(graph, splits)
        cut = finish_view(tflms.build_view(graph), splits)
        after = tflms.simulate(cut, accounting="tensors", baseline=False)
        peaks[bool(metrics)] = (plain, after, splits[0].bytes)
    plain, _, logits = peaks[False]
    assert plain.peak_op_type != "SparseSoftmaxCrossEntropyWithLogits"
    plain, after, logits = peaks[True]
    assert after.device_peak_bytes <= plain.device_peak_bytes - logits // 8


def test_dropout_masks_are_drawn_in_their_layer_not_when_the_step_starts():
    """Stateless masks depend on no data: deferred to their layer, they stop piling up."""
    model = zoo.gpt2(vocab=50, seq=128, dim=16, heads=4, layers=4)
    graph = tflms.train_step_graph(model, batch_size=4)
    view = tflms.build_view(graph)
    deferrals = plan_deferrals(view, 512 << 10)
    assert len(deferrals) == 4  # one attention mask per layer; the smaller ones stay
    assert all(view.nodes[d.op]["type"] in RANDOM_TYPES for d in deferrals)
    split_graph(graph, (), deferrals=deferrals)
    deferred = finish_view(tflms.build_view(graph), ())
    options = dict(swapout_threshold=1, swapin_ahead=1, min_tensor_bytes=0, link="ideal")
    peaks = []
    for v in (view, deferred):
        plan = tflms.make_plan(v, tflms.LMSConfig(**options))
        peaks.append(tflms.simulate(v, plan, accounting="tensors", link="ideal", baseline=False))
    assert peaks[0].peak_op_type in RANDOM_TYPES
    assert peaks[1].device_peak_bytes < 0.8 * peaks[0].device_peak_bytes


def _fit(build, devices, steps, callbacks=()):
    model = build()
    x, y = synthetic_data(model, 4 * steps)
    with tf.device(devices.compute):
        history = model.fit(
            x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks)
        )
    return model, history


TINY = {
    "gpt2": lambda: zoo.gpt2(vocab=97, seq=16, dim=16, heads=2, layers=1),
    "bert": lambda: zoo.bert(vocab=97, seq=16, dim=16, heads=2, layers=1),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_training_with_the_loss_split_is_bitwise_identical(name, devices):
    plain, plain_hist = _fit(TINY[name], devices, steps=3)
    callback = tflms.LMSCallback(
        batch_size=4, max_op_bytes=4 * 16 * 97 * 4 // 4, min_tensor_bytes=0, swapout_threshold=4
    )
    cut, cut_hist = _fit(TINY[name], devices, steps=3, callbacks=[callback])
    for a, b in zip(plain.get_weights(), cut.get_weights(), strict=True):
        np.testing.assert_array_equal(b, a)
    assert cut_hist.history["loss"] == plain_hist.history["loss"]
    view = callback.view
    split_ops = [n for n in view if "-split/" in n]
    assert any(view.nodes[n]["type"] == "SparseSoftmaxCrossEntropyWithLogits" for n in split_ops)
    assert callback.plan.swaps, callback.plan.summary()
    assert plan_deferrals(view, 4 * 16 * 97 * 4 // 4)  # the attention masks were deferred too
