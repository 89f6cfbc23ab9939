"""Minimal Large Model Support example: a Keras 3 CNN trained with LMSCallback.

Run:  .venv/bin/python examples/lms_keras.py [--batch-size 16] [--epochs 1]

On a GPU machine the swapped activations move to host memory between the
forward and the backward pass; on a CPU-only machine the rewrite still runs
(and training is bitwise identical), there is just no GPU memory to save.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tflms  # noqa: E402
from tflms import zoo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    # A CNN with BatchNorm from the zoo, compiled with SGD and jit_compile=False
    # (XLA clusters would ignore the swap ops' host placement).
    model = zoo.cnn(args.image_size, filters=(32, 32, 64, 64, 128), seed=0)
    x, y = zoo.synthetic_data(model, args.batch_size * 8)
    lms = tflms.LMSCallback(batch_size=args.batch_size)  # defaults: no tuning needed
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=2, callbacks=[lms])
    print(lms.summary())


if __name__ == "__main__":
    main()
