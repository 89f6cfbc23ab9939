"""An elastic Keras ``fit`` in the shape of Horovod's ``tensorflow2_keras_mnist_elastic.py``, on ddl_tf.

The edits a Horovod elastic Keras script needs, each marked ``# ddl_tf:``
below (the migration page lists them):

* the import (``import horovod.tensorflow.keras as hvd`` ->
  ``import ddl_tf.keras as hvd``);
* ``compile(..., experimental_run_tf_function=False)``: the argument goes
  (Keras 3 refuses it);
* ``tf.keras.backend.set_value(optimizer.lr, x)`` ->
  ``optimizer.learning_rate.assign(x)`` (Keras 3 has neither ``set_value``
  nor ``lr``);
* ``ModelCheckpoint("./checkpoint-{epoch}.h5")`` -> ``.keras``.

Random images of MNIST's shape replace the download (no network needed), and
three options (``--epochs``, ``--steps``, ``--batch-size``, Horovod's values
by default) make a short run possible; rank 0 ends with one line to check
a run by. A job that keeps training when a host
is lost, with one or two ranks::

    ddlrun --min-np 1 --max-np 2 -H localhost:1,127.0.0.1:1 -np 2 \\
        examples/horovod_tf2_keras_mnist_elastic.py --epochs 4 --steps 40

``kill -9`` either rank: the other restores the last commit and goes on.
The last line is ``elastic training finished: size S, epoch E`` from the
final rank 0.
"""

import argparse

import numpy as np
import tensorflow as tf
from packaging import version

import ddl_tf.keras as hvd  # ddl_tf: was `import horovod.tensorflow.keras as hvd`

parser = argparse.ArgumentParser(description="Tensorflow 2.0 Keras MNIST Example (elastic)")
parser.add_argument(
    "--use-mixed-precision",
    action="store_true",
    default=False,
    help="use mixed precision for training",
)
parser.add_argument("--epochs", type=int, default=24, help="epochs in all")
parser.add_argument("--steps", type=int, default=500, help="steps per epoch on one rank")
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

if args.use_mixed_precision:
    if version.parse(tf.__version__) >= version.parse("2.4.0"):
        from tensorflow.keras import mixed_precision

        mixed_precision.set_global_policy("mixed_float16")

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin the GPU of this process's local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# ddl_tf: random images of MNIST's shape instead of tf.keras.datasets.mnist.load_data.
rng = np.random.default_rng(hvd.rank())
mnist_images = rng.integers(0, 256, (2048, 28, 28), dtype=np.uint8)
mnist_labels = rng.integers(0, 10, 2048)

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(args.batch_size)

model = tf.keras.Sequential(
    [
        tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ]
)

# Horovod: scale the learning rate by the number of ranks.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: the distributed optimizer averages the gradients over the ranks.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

model.compile(
    loss=tf.losses.SparseCategoricalCrossentropy(),
    optimizer=opt,
    metrics=["accuracy"],
)  # ddl_tf: `experimental_run_tf_function=False` removed (Keras 3 refuses it)

# Horovod: one step builds the model and the optimizer's state, so that they can be synced.
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    # ddl_tf: was tf.keras.backend.set_value(state.model.optimizer.lr, 0.001 * hvd.size())
    state.model.optimizer.learning_rate.assign(0.001 * hvd.size())
    # Build again with the new membership (ranks that joined have not trained yet).
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
]

# Horovod: only rank 0 writes checkpoints, so that the ranks do not overwrite each other's.
if hvd.rank() == 0:
    # ddl_tf: was "./checkpoint-{epoch}.h5"; Keras 3 saves whole models as .keras.
    callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))


# Horovod: fewer steps per epoch on more ranks (the same samples per epoch in all).
@hvd.elastic.run
def train(state):
    state.model.fit(
        dataset,
        steps_per_epoch=args.steps // hvd.size(),
        epochs=args.epochs - state.epoch,
        callbacks=callbacks,
        verbose=1,
    )


train(state)

if hvd.rank() == 0:  # ddl_tf: a last line to check a run by
    print(f"elastic training finished: size {hvd.size()}, epoch {state.epoch}", flush=True)
