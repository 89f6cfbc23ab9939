"""An elastic GradientTape loop in the shape of Horovod's ``tensorflow2_mnist_elastic.py``, on ddl_tf.

The edits a Horovod elastic TensorFlow 2 script needs, each marked
``# ddl_tf:`` below (the migration page lists them):

* the imports (``import horovod`` -> ``import ddl_tf as horovod``,
  ``import horovod.tensorflow as hvd`` -> ``import ddl_tf.tensorflow as hvd``);
* ``opt.lr.assign(x)`` -> ``opt.learning_rate.assign(x)`` (Keras 3 optimizers
  have no ``lr``).

Random images of MNIST's shape replace the download (no network needed), and
two options (``--batches``, ``--batch-size``, Horovod's values by default)
make a short run possible; rank 0 ends with one line to check a run by.
Launched by ddlrun::

    ddlrun --min-np 1 --max-np 2 -H localhost:1,127.0.0.1:1 -np 2 \\
        examples/horovod_tf2_mnist_elastic.py --batches 40

or, as Horovod's example does, through the launch API with ``NUM_PROC
MIN_NUM_PROC MAX_NUM_PROC HOSTS``::

    python examples/horovod_tf2_mnist_elastic.py 2 1 2 localhost:1,127.0.0.1:1

``kill -9`` either rank: the other restores the last commit and goes on.
"""

import argparse
import sys

import numpy as np
import tensorflow as tf

import ddl_tf as horovod  # ddl_tf: was `import horovod`
import ddl_tf.tensorflow as hvd  # ddl_tf: was `import horovod.tensorflow as hvd`


def main(batches=100, batch_size=128):
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
        (
            tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
            tf.cast(mnist_labels, tf.int64),
        )
    )
    dataset = dataset.repeat().shuffle(10000).batch(batch_size)

    mnist_model = tf.keras.Sequential(
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
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: scale the learning rate by the number of ranks.
    lr = 0.001
    opt = tf.optimizers.Adam(lr * hvd.size())

    @tf.function
    def training_step(images, labels, allreduce=True):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: the distributed tape averages the gradients over the ranks.
        if allreduce:
            tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables, strict=True))
        return loss_value

    # Horovod: one local step builds the model and the optimizer, so that they can be synced.
    for images, labels in dataset.take(1):
        training_step(images, labels, allreduce=False)

    @hvd.elastic.run
    def train(state):
        start_batch = state.batch

        # Horovod: fewer batches on more ranks.
        for batch_idx, (images, labels) in enumerate(
            dataset.skip(state.batch).take(batches // hvd.size())
        ):
            state.batch = start_batch + batch_idx
            loss_value = training_step(images, labels)

            if state.batch % 10 == 0 and hvd.rank() == 0:
                print(f"Step #{state.batch}\tLoss: {float(loss_value):.6f}", flush=True)

            # Horovod: commit the state at the end of every batch.
            state.commit()

    def on_state_reset():
        opt.learning_rate.assign(lr * hvd.size())  # ddl_tf: was opt.lr.assign(...)

    state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0)
    state.register_reset_callbacks([on_state_reset])

    train(state)

    checkpoint_dir = "./checkpoints"
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    # Horovod: only rank 0 writes the checkpoint, so that the ranks do not overwrite each other's.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)
        # ddl_tf: a last line to check a run by, and the result ddl_tf.run returns.
        print(f"elastic training finished: size {hvd.size()}, batch {state.batch}", flush=True)
    return hvd.size(), state.batch


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1].isdigit():
        # Launch through the API (horovod.run in Horovod's example).
        num_proc = int(sys.argv[1])
        min_num_proc = int(sys.argv[2])
        max_num_proc = int(sys.argv[3])
        hosts = sys.argv[4]
        print("Running training through horovod.run")
        results = horovod.run(
            main,
            num_proc=num_proc,
            min_num_proc=min_num_proc,
            max_num_proc=max_num_proc,
            hosts=hosts,
            use_gloo=True,
            verbose=2,
        )
        print("results (size, last batch) by rank:", results)
    else:
        # Launched by ddlrun (horovodrun in Horovod's example).
        parser = argparse.ArgumentParser(description="Tensorflow 2.0 MNIST Example (elastic)")
        parser.add_argument("--batches", type=int, default=100, help="batches per call on one rank")
        parser.add_argument("--batch-size", type=int, default=128)
        args = parser.parse_args()
        main(args.batches, args.batch_size)
