"""MNIST-shaped training with a GradientTape loop, in the shape of Horovod's TF2 example, on ddl_tf.

The edits a Horovod TensorFlow 2 script needs, each marked ``# ddl_tf:`` below:

* the import (``import horovod.tensorflow as hvd`` -> ``import ddl_tf.tensorflow as hvd``);
* ``opt.variables()`` -> ``opt.variables``: a property in Keras 3, and the
  optimizer's variables exist only once it is built (``opt.build(...)``);

everything else (``hvd.DistributedGradientTape``, broadcasting the model's
and the optimizer's variables after the first step, ``hvd.rank() == 0``
checkpoints) keeps Horovod's meaning. Random images of MNIST's shape::

    ddlrun -np 2 examples/horovod_tf2_mnist.py --steps 40

Prints ``weights identical on all ranks: True`` at the end.
"""

import argparse
import hashlib

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.tensorflow as hvd  # ddl_tf: was `import horovod.tensorflow as hvd`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different initial weights: the broadcast matters
    rng = np.random.default_rng(hvd.rank())
    images = rng.random((args.batch_size * 8, 28, 28, 1), np.float32)
    labels = rng.integers(0, 10, args.batch_size * 8)
    dataset = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .repeat()
        .shuffle(1000, seed=hvd.rank())
        .batch(args.batch_size)
    )

    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.Adam(0.001 * hvd.size())
    opt.build(model.trainable_variables)  # ddl_tf: Keras 3 optimizers own variables once built

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)  # ddl_tf: was opt.variables()
        return loss

    for step, (x, y) in enumerate(dataset.take(args.steps // hvd.size())):
        loss = training_step(x, y, step == 0)
        if step % 10 == 0 and hvd.rank() == 0:
            print(f"step {step}: loss {float(loss):.4f}")

    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    digests = hvd.allgather_object(digest)
    if hvd.rank() == 0:
        print(f"weights identical on all ranks: {len(set(digests)) == 1}")


if __name__ == "__main__":
    main()
