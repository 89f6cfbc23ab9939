"""Tiny training steps for tflms tests, and a hand-made swap rewrite.

Each builder traces a ``@tf.function`` training step (forward pass under a
``GradientTape``, gradients, optimizer update) and returns its ``FuncGraph``
with the sizes a test needs to derive memory figures by hand.

:func:`swap_by_hand` inserts the swap pattern tflms will produce
(``Identity`` on the host = swap-out, ``Identity`` back on the compute device =
swap-in, optionally delayed by a control edge from a trigger op) with plain
TensorFlow calls, so that simulators can be checked before tflms exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

HOST = "/device:CPU:0"
COMPUTE = "/device:CPU:1"


@dataclass
class Step:
    """A traced training step.

    Attributes:
        graph: the step's FuncGraph.
        activation_bytes: bytes of one ``[batch, width]`` float32 activation.
        weight_bytes: bytes of one ``[width, width]`` float32 weight.
        keep: objects (variables, model, optimizer) the graph's captures need.
    """

    graph: tf.Graph
    activation_bytes: int = 0
    weight_bytes: int = 0
    keep: tuple = ()


def dense_chain_step(batch: int | None, width: int, depth: int) -> Step:
    """``depth`` layers ``h = relu(h @ W_i)`` without bias, loss ``sum(h)``, plain SGD.

    Nodes are named ``fc{i}`` (MatMul) and ``relu{i}``; gradients live under
    ``gradient_tape/``. The input placeholder is ``x`` of shape ``[batch, width]``.
    """
    weights = [tf.Variable(tf.zeros([width, width]), name=f"w{i}") for i in range(depth)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for i, w in enumerate(weights):
                h = tf.nn.relu(tf.matmul(h, w, name=f"fc{i}"), name=f"relu{i}")
            loss = tf.reduce_sum(h, name="loss")
        grads = tape.gradient(loss, weights)
        for w, g in zip(weights, grads, strict=True):
            w.assign_sub(0.1 * g)
        return loss

    graph = step.get_concrete_function(tf.TensorSpec([batch, width], name="x")).graph
    return Step(graph, (batch or 1) * width * 4, width * width * 4, tuple(weights))


def keras_cnn_step(batch: int | None = None, optimizer: str = "adam") -> Step:
    """A small Keras 3 CNN on 32x32x3 images, 10 classes, trained with ``optimizer``.

    The first convolution ``conv1`` (16 filters, 3x3, valid) produces the
    largest activation, ``[batch, 30, 30, 16]``.
    """
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(name="pool1"),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.GlobalAveragePooling2D(name="gap"),
            keras.layers.Dense(10, name="logits"),
        ]
    )
    opt = keras.optimizers.get(optimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    specs = (tf.TensorSpec([batch, 32, 32, 3], name="x"), tf.TensorSpec([batch], tf.int32, "y"))
    graph = step.get_concrete_function(*specs).graph
    return Step(graph, (batch or 1) * 30 * 30 * 16 * 4, keep=(model, opt))


def tape_step(model, optimizer, loss_fn):
    """A custom loop's step function, undecorated: loss under a tape, gradients, update.

    Decorate it as the test needs (``tf.function``, ``tflms.function(config=...)``).
    """

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return train_step


def protect(*tensors: tf.Tensor) -> None:
    """Mark the producers of ``tensors`` so that Grappler never removes them."""
    for tensor in tensors:
        tensor.op._set_attr("_grappler_do_not_remove", attr_value_pb2.AttrValue(b=True))


def swap_by_hand(
    graph: tf.Graph,
    tensor_name: str,
    *,
    trigger: str | None = None,
    consumers_prefix: str = "gradient_tape/",
    host: str = HOST,
    compute: str | None = COMPUTE,
    mark: bool = True,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Route ``tensor_name`` to its backward consumers through the host.

    Adds ``lms/swapout_<op>`` (Identity on ``host``) and ``lms/swapin_<op>``
    (Identity on ``compute``), reroutes the consumers whose names start with
    ``consumers_prefix`` to the swap-in, and, if ``trigger`` names an op, adds
    a control edge from it to the swap-in. Returns (swap-out, swap-in).
    """
    tensor = graph.get_tensor_by_name(tensor_name)
    targets = [
        (op, index)
        for op in tensor.consumers()
        if op.name.startswith(consumers_prefix)
        for index, inp in enumerate(op.inputs)
        if inp is tensor
    ]
    assert targets, f"{tensor_name} has no consumer named {consumers_prefix}*"
    base = tensor.op.name.replace("/", "_")
    with graph.as_default():
        with tf.device(host):
            out = tf.identity(tensor, name=f"lms/swapout_{base}")
        with tf.device(compute):
            back = tf.identity(out, name=f"lms/swapin_{base}")
    for op, index in targets:
        op._update_input(index, back)
    if trigger is not None:
        back.op._add_control_input(graph.get_operation_by_name(trigger))
    if mark:
        protect(out, back)
    return out, back


_MEASURED_STEP = """
import hashlib, json, sys
sys.path.insert(0, {root!r})
import keras, tensorflow as tf, tflms
from benchmarks.remat_models import batch, build
from tests.tflms.models import tape_step
from tflms.simulation.measure import measure_cpu_step
model = build({family!r}, False)
optimizer = keras.optimizers.AdamW(1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
step = tape_step(model, optimizer, loss_fn)
config = {config}
fn = tflms.function(step, config=tflms.LMSConfig(**config)) if config else tf.function(step)
x, y = (tf.constant(a) for a in batch({family!r}))
m = measure_cpu_step(fn, x, y, runs=3, warmup=1, profile=False)
digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()
print(json.dumps(dict(peak=m.peak_bytes, weights=digest)))
"""


def measured_in_a_fresh_process(family: str, config: dict | None) -> dict:
    """A bench_remat family trained by AdamW in a fresh process on TensorFlow's CPU allocator
    (``measurement_env``; the median of 3 steps): ``{"peak": bytes, "weights": sha256}``;
    ``config``: ``LMSConfig`` options, None for plain training."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tflms.utils.cpu import measurement_env

    root = str(Path(__file__).resolve().parents[2])
    code = _MEASURED_STEP.format(root=root, family=family, config=config)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=measurement_env(),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_names() -> None:
    """Reset Keras's global state before building a model two runs compare bit for bit.

    Keras names layers (and so the traced step's ops) from global counters, and
    Grappler walks a graph in an order its names decide: the same seeded model
    built after other models can run other float arithmetic. Seen with oneDNN
    on: a plain diffusion U-Net trained 7.5e-9 away from itself once in four
    builds. A test that compares a run with a cached plain one calls this first,
    so both are built under the same names.
    """
    keras.backend.clear_session(free_memory=False)
