"""Minimal Large Model Support example: a Keras 3 CNN trained with LMSCallback.

Run:  .venv/bin/python examples/lms_keras.py [--batch-size 16] [--epochs 1]

On a GPU machine the swapped activations move to host memory between the
forward and the backward pass; on a CPU-only machine the rewrite still runs
(and training is bitwise identical), there is just no GPU memory to save.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tflms  # noqa: E402


def build_model(size: int) -> keras.Model:
    inputs = keras.Input((size, size, 3))
    x = inputs
    for filters in (32, 32, 64, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch_size * 8, args.image_size, args.image_size, 3)).astype(
        "float32"
    )
    y = rng.integers(0, 10, len(x))

    model = build_model(args.image_size)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,  # XLA clusters ignore the swap ops' host placement
    )
    lms = tflms.LMSCallback(batch_size=args.batch_size)  # defaults: no tuning needed
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=2, callbacks=[lms])
    print(lms.summary())


if __name__ == "__main__":
    main()
