"""Small training models exported to disk, for the `tflms` quick start and the CLI tests.

Every exporter writes a small training model in one of the formats ``tflms``
reads, with activations large enough (``[32, 256]`` float32 = 32 KiB) to be
swapped under ``--swapout-threshold 3 --min-tensor-bytes 0``. The ``train_*``
helpers load a model the way its users would (``tf.saved_model.load``, the
TF1 loader, ``import_graph_def``), run N training steps on fixed data and
return the variables, so that a rewritten model can be compared with its
original bit for bit.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

BATCH, WIDTH, DEPTH = 32, 256, 6
PLAN_FLAGS = ["--swapout-threshold", "3", "--swapin-ahead", "2", "--min-tensor-bytes", "0"]
SWAP_FLAGS = [*PLAN_FLAGS, "--batch-size", str(BATCH)]
"""CLI flags that make the tiny test models swap."""


def _data(steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((BATCH, WIDTH)).astype("float32"),
            rng.standard_normal((BATCH, WIDTH)).astype("float32"),
        )
        for _ in range(steps)
    ]


def _initial_weights(depth: int = DEPTH):
    rng = np.random.default_rng(42)
    return [(rng.standard_normal((WIDTH, WIDTH)) * 0.05).astype("float32") for _ in range(depth)]


# --------------------------------------------------------------------------- TF2


class TrainModule(tf.Module):
    """An MLP with a ``train`` tf.function (forward, gradients, momentum SGD) and ``predict``."""

    def __init__(self, depth: int = DEPTH, marker: str | None = None):
        super().__init__()
        self.w = [tf.Variable(w, name=f"w{i}") for i, w in enumerate(_initial_weights(depth))]
        self.velocity = [tf.Variable(tf.zeros_like(w), name=f"v{i}") for i, w in enumerate(self.w)]
        self.lr = tf.Variable(0.01, name="lr")
        self.marker = marker

    @tf.function(input_signature=[tf.TensorSpec([BATCH, WIDTH]), tf.TensorSpec([BATCH, WIDTH])])
    def train(self, x, y):
        if self.marker:  # proves that analysis never runs the model: running it writes a file
            tf.print("train ran", output_stream=f"file://{self.marker}")
        with tf.GradientTape() as tape:
            h = x
            for w in self.w:
                h = tf.nn.relu(h @ w)
            loss = tf.reduce_mean((h - y) ** 2)
        grads = tape.gradient(loss, self.w)
        for w, v, g in zip(self.w, self.velocity, grads, strict=True):
            v.assign(0.9 * v + g)
            w.assign_sub(self.lr * v)
        return loss

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH])])
    def predict(self, x):
        h = x
        for w in self.w:
            h = tf.nn.relu(h @ w)
        return h


class NestedTrainModule(TrainModule):
    """``train`` calls another tf.function: TensorFlow splits it into forward and backward functions."""

    @tf.function
    def forward(self, x):
        h = x
        for w in self.w:
            h = tf.nn.relu(h @ w)
        return h

    @tf.function(input_signature=[tf.TensorSpec([BATCH, WIDTH]), tf.TensorSpec([BATCH, WIDTH])])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self.forward(x) - y) ** 2)
        grads = tape.gradient(loss, self.w)
        for w, v, g in zip(self.w, self.velocity, grads, strict=True):
            v.assign(0.9 * v + g)
            w.assign_sub(self.lr * v)
        return loss


class InferenceModule(tf.Module):
    """Only a ``predict`` function: nothing to swap."""

    def __init__(self):
        super().__init__()
        self.w = [tf.Variable(w, name=f"w{i}") for i, w in enumerate(_initial_weights(3))]

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH])])
    def predict(self, x):
        h = x
        for w in self.w:
            h = tf.nn.relu(h @ w)
        return h


def export_tf2(path: Path, *, marker: str | None = None, nested: bool = False) -> Path:
    """``tf.saved_model.save`` of a :class:`TrainModule` (or the nested one), with an asset file."""
    module = NestedTrainModule() if nested else TrainModule(marker=marker)
    asset = Path(str(path) + ".vocab.txt")
    asset.write_text("a\nb\n")
    module.vocab = tf.saved_model.Asset(str(asset))
    tf.saved_model.save(
        module,
        str(path),
        signatures={"train": module.train, "serving_default": module.predict},
    )
    asset.unlink()
    return path


def export_tf2_inference(path: Path) -> Path:
    module = InferenceModule()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.predict})
    return path


def train_tf2(path: Path, steps: int = 3):
    """Load with ``tf.saved_model.load``, train ``steps`` steps; ``(losses, weights)``."""
    model = tf.saved_model.load(str(path))
    losses = [float(model.train(x, y)) for x, y in _data(steps)]
    return losses, [w.numpy() for w in model.w + model.velocity]


class KerasTrainer(tf.Module):
    """A Keras 3 CNN (convolutions, BatchNorm, pooling) trained with Keras' Adam in a tf.function."""

    def __init__(self):
        super().__init__()
        import keras

        keras.utils.set_random_seed(0)
        self.model = keras.Sequential(
            [
                keras.Input((32, 32, 3)),
                keras.layers.Conv2D(16, 3, activation="relu", padding="same", name="conv1"),
                keras.layers.BatchNormalization(name="bn1"),
                keras.layers.Conv2D(16, 3, activation="relu", padding="same", name="conv2"),
                keras.layers.MaxPooling2D(name="pool"),
                keras.layers.Conv2D(32, 3, activation="relu", padding="same", name="conv3"),
                keras.layers.GlobalAveragePooling2D(name="gap"),
                keras.layers.Dense(10, name="logits"),
            ]
        )
        self.optimizer = keras.optimizers.Adam(1e-3)
        self.optimizer.build(self.model.trainable_variables)
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([16, 32, 32, 3]), tf.TensorSpec([16], tf.int32)])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss(y, self.model(x, training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return loss


def export_keras(path: Path) -> Path:
    tf.saved_model.save(KerasTrainer(), str(path))
    return path


def train_keras(path: Path, steps: int = 3):
    """Train a loaded :class:`KerasTrainer`; ``(losses, every variable by checkpoint key)``.

    The variables (weights, BatchNorm statistics, Adam moments, the step
    counter) are read back through a checkpoint of the loaded object.
    """
    model = tf.saved_model.load(str(path))
    rng = np.random.default_rng(0)
    losses = [
        float(
            model.train(
                rng.standard_normal((16, 32, 32, 3)).astype("float32"),
                rng.integers(0, 10, 16).astype("int32"),
            )
        )
        for _ in range(steps)
    ]
    prefix = tf.train.Checkpoint(root=model).write(
        str(Path(path).parent / f"{Path(path).name}.ckpt" / "c")
    )
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(k for k in reader.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k)
    return losses, [reader.get_tensor(k) for k in names]


# --------------------------------------------------------------------------- TF1


def _tf1_training_graph(depth: int = DEPTH):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="y")
        h = x
        for i, w0 in enumerate(_initial_weights(depth)):
            w = tf.compat.v1.get_variable(f"w{i}", initializer=tf.constant(w0), use_resource=True)
            h = tf.nn.relu(tf.matmul(h, w), name=f"relu{i}")
        loss = tf.reduce_mean(tf.square(h - y), name="loss")
        train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, name="train_op")
        tf.compat.v1.add_to_collection("train_op", train_op)
        init = tf.compat.v1.global_variables_initializer()
    return graph, init, x, y, loss


def export_tf1(path: Path) -> Path:
    """A TF1 SavedModel (``Builder``) whose MetaGraph holds the training op."""
    graph, init, x, y, loss = _tf1_training_graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        builder = tf.compat.v1.saved_model.Builder(str(path))
        signature = tf.compat.v1.saved_model.predict_signature_def({"x": x, "y": y}, {"loss": loss})
        builder.add_meta_graph_and_variables(
            sess, ["train"], signature_def_map={"train": signature}
        )
        builder.save()
    return path


def train_tf1(path: Path, steps: int = 3):
    """Load with the TF1 loader, run the train op ``steps`` times; ``(losses, variables)``."""
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        tf.compat.v1.saved_model.loader.load(sess, ["train"], str(path))
        train_op = graph.get_collection("train_op")[0]
        losses = []
        for x, y in _data(steps):
            loss, _ = sess.run(["loss:0", train_op], {"x:0": x, "y:0": y})
            losses.append(float(loss))
        variables = sess.run(graph.get_collection("variables"))
    return losses, variables


def write_graph_def(path: Path) -> Path:
    """The TF1 training graph as a binary ``GraphDef`` (variables with initializers)."""
    graph, init, *_ = _tf1_training_graph()
    graph.add_to_collection("init", init)
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


def train_graph_def(path: Path, steps: int = 3):
    """Import a GraphDef from :func:`write_graph_def`, initialize, train; ``(losses, variables)``."""
    graph_def = tf.compat.v1.GraphDef.FromString(Path(path).read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run("init")
        losses = []
        for x, y in _data(steps):
            loss, _ = sess.run(["loss:0", "train_op"], {"x:0": x, "y:0": y})
            losses.append(float(loss))
        variables = sess.run([f"w{i}/Read/ReadVariableOp:0" for i in range(DEPTH)])
    return losses, variables


def write_frozen_inference_graph(path: Path) -> Path:
    """A frozen inference GraphDef: weights as constants, no gradients."""
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
        for i, w in enumerate(_initial_weights(3)):
            h = tf.nn.relu(tf.matmul(h, tf.constant(w)), name=f"relu{i}")
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


def write_custom_op_graph(path: Path) -> Path:
    """The training GraphDef plus a node whose op type no TensorFlow registers."""
    graph, *_ = _tf1_training_graph()
    graph_def = graph.as_graph_def()
    node = graph_def.node.add(name="mystery", op="TflmsTestCustomOp")
    node.input.append("relu0")
    path.write_bytes(graph_def.SerializeToString())
    return path


# --------------------------------------------------------------------------- files


def tree_digest(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (or of ``root`` itself)."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {
        os.path.relpath(p, root.parent if root.is_file() else root): hashlib.sha256(
            p.read_bytes()
        ).hexdigest()
        for p in files
    }


EXPORTERS = {
    "tf2": export_tf2,
    "keras": export_keras,
    "tf1": export_tf1,
    "graph_def": write_graph_def,
    "inference": export_tf2_inference,
}

if __name__ == "__main__":  # python examples/saved_models.py keras /tmp/keras_trainer
    import sys

    if len(sys.argv) != 3 or sys.argv[1] not in EXPORTERS:
        sys.exit(f"usage: python examples/saved_models.py {{{','.join(EXPORTERS)}}} PATH")
    print(EXPORTERS[sys.argv[1]](Path(sys.argv[2])))
