"""MNIST-shaped Keras training in the shape of Horovod's TF2 Keras example, on ddl_tf.

The points that matter for a Horovod user moving to Keras 3:

* the model is a ``Sequential`` **without** an ``Input`` layer, so Keras
  builds it (and the optimizer) inside the first training step;
  ``BroadcastGlobalVariablesCallback`` then broadcasts after that step, as
  Horovod does, instead of failing;
* ``DistributedOptimizer`` wraps a Keras 3 optimizer (Horovod's Keras-2-only
  ``compile(experimental_run_tf_function=False)`` is not needed);
* metrics are averaged over ranks, the learning rate warms up from
  ``lr / size`` to ``lr`` (scaled by the number of ranks), checkpoints are
  written by rank 0 only (``.keras`` files: Keras 3's format).

Random images and labels of MNIST's shape, so nothing is downloaded::

    ddlrun -np 2 examples/horovod_keras_mnist.py --epochs 3

Prints ``weights identical on all ranks: True`` at the end.
"""

import argparse
import hashlib
import logging
import os

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd


def random_mnist(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random 28x28 uint8 images and labels in 0..9 (MNIST's shapes and dtypes)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, 28, 28), np.uint8)
    return images, rng.integers(0, 10, count, np.uint8)


def convnet() -> keras.Model:
    """The classic Keras MNIST convnet, deliberately without an Input layer."""
    return keras.Sequential(
        [
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different initial weights: the broadcast matters

    images, labels = random_mnist(seed=hvd.rank(), count=args.images)
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., None] / 255.0, tf.float32), tf.cast(labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

    model = convnet()
    scaled_lr = 0.001 * hvd.size()
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(),
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr)),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3),
    ]
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        path = os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")
        callbacks.append(keras.callbacks.ModelCheckpoint(path))

    history = model.fit(
        dataset,
        steps_per_epoch=max(1, args.steps_per_epoch // hvd.size()),
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    digests = hvd.allgather_object(digest)
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}")
        print(f"final loss (averaged over ranks): {history.history['loss'][-1]:.4f}")
        print(f"weights identical on all ranks: {len(set(digests)) == 1}")


if __name__ == "__main__":
    main()
