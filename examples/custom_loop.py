"""Custom training loop with both halves of the product: ``tflms.function`` + ``DistributedGradientTape``.

Run on 2 ranks::

    ddlrun -np 2 examples/custom_loop.py [--steps 20] [--batch-size 8]

Each rank trains a small CNN on its own shard of synthetic images. The step
is a ``tflms.function`` (its traced graph is rewritten to swap long-lived
activations to host memory) whose gradients go through ddl_tf's
``DistributedGradientTape`` (averaged over all ranks). The same loop then
runs again from the same initial weights with a plain ``tf.function``, and
rank 0 reports whether the two runs produced the same losses and whether all
ranks ended with the same weights. ``--no-compare`` skips the second run.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ddl_tf as hvd  # noqa: E402
import tflms  # noqa: E402
from tflms import zoo  # noqa: E402


def build_model(size: int) -> keras.Model:
    """Twelve 3x3 convolutions + ReLU and a classifier (the zoo's CNN without BatchNorm)."""
    return zoo.cnn(size, (16,) * 4 + (32,) * 4 + (64,) * 4, batch_norm=False, seed=0)


def train(args, x, y, initial_weights, use_lms: bool):
    """Train for ``args.steps`` steps; returns (losses, flat weights, plan or None)."""
    model = build_model(args.image_size)
    model.set_weights(initial_weights)
    optimizer = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)  # gradients averaged over all ranks
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return hvd.allreduce(loss, name="loss")  # the mean loss over ranks

    config = tflms.LMSConfig(batch_size=args.batch_size, min_tensor_bytes=args.min_tensor_bytes)
    train_step = tflms.function(step, config=config) if use_lms else tf.function(step)
    # Same starting point on every rank (Horovod's recipe): rank 0's weights and slots.
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
    losses = []
    for i in range(args.steps):
        start = (i * args.batch_size) % (len(x) - args.batch_size + 1)
        batch = slice(start, start + args.batch_size)
        losses.append(float(train_step(x[batch], y[batch])))
    plan = train_step.plan_for(x[: args.batch_size], y[: args.batch_size]) if use_lms else None
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return losses, weights, plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--min-tensor-bytes",
        default="64KiB",
        help="LMSConfig.min_tensor_bytes (the example's activations are small)",
    )
    parser.add_argument("--no-compare", action="store_true", help="skip the run without LMS")
    args = parser.parse_args(argv)

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per rank, as in Horovod's recipe
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    # Each rank its own shard of a learnable task: the class sets the mean colour.
    palette = np.random.default_rng(0).standard_normal((10, 1, 1, 3))
    rng = np.random.default_rng(1 + hvd.rank())
    y = rng.integers(0, 10, args.batch_size * 4)
    noise = rng.standard_normal((len(y), args.image_size, args.image_size, 3))
    x = (palette[y] + noise).astype("float32")
    keras.utils.set_random_seed(0)
    initial = build_model(args.image_size).get_weights()

    losses, weights, plan = train(args, x, y, initial, use_lms=True)
    same_everywhere = all(
        np.array_equal(weights, w) for w in hvd.allgather(weights[None, :]).numpy()
    )
    if not args.no_compare:
        plain_losses, _, _ = train(args, x, y, initial, use_lms=False)
    if hvd.rank() == 0:
        print(plan.summary())
        print(f"losses (mean over {hvd.size()} ranks): {losses[0]:.4f} -> {losses[-1]:.4f}")
        if not args.no_compare:
            print(f"losses identical to the run without LMS: {losses == plain_losses}")
        print(f"weights identical on all ranks: {same_everywhere}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
