"""Benchmark: does keras.applications.ResNet50 train identically with LMSCallback?

Trains Keras' ResNet-50 (random weights, 10 classes) for a few steps twice
from the same weights and batches: plainly, and with ``tflms.LMSCallback``
with two sets of options: the defaults (which do not swap weight
gradients), and the defaults with weight-gradient swaps
(``swap_weight_gradients=True``), each with SGD (momentum) and Adam. The
compute runs on one logical CPU device and the swapped tensors go through
another, as in the test suite. With the defaults the weights must end
bitwise identical (the script exits 1 otherwise); with weight-gradient swaps
the result is recorded: Grappler may then sum gradients differently (its
memory optimizer picks an in-place ``AddN`` accumulation from its own memory
estimate, which the swaps change), which moves results in the last bits.

Writes ``benchmarks/results/resnet50_equivalence.json``: per option set and
optimizer the number of swaps, whether the weights are bitwise identical,
the largest weight difference and the losses of both runs.

Run: ``.venv/bin/python benchmarks/bench_resnet50_equivalence.py [--steps 3]``
(about 4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import tflms  # noqa: E402
from tflms.utils.cpu import cpu_state  # noqa: E402
from tflms.utils.files import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
HOST, COMPUTE = "/device:CPU:0", "/device:CPU:1"
WEIGHT_GRADIENTS = {"swap_weight_gradients": True}


def train(optimizer: str, x, y, batch: int, weights, use_lms: bool, options: dict):
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=x.shape[1:], classes=10)
    model.set_weights(weights)
    opt = (
        keras.optimizers.SGD(0.01, momentum=0.9)
        if optimizer == "sgd"
        else keras.optimizers.Adam(1e-3)
    )
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(), jit_compile=False)
    callbacks = []
    if use_lms:
        lms = tflms.LMSCallback(batch_size=batch, device=COMPUTE, host_device=HOST, **options)
        callbacks.append(lms)
    with tf.device(COMPUTE):
        history = model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=callbacks)
    plan = callbacks[0].plan if callbacks else None
    return model.get_weights(), history.history["loss"], plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", default=str(RESULTS / "resnet50_equivalence.json"))
    parser.add_argument("--lms-config", help="LMSConfig options as JSON (instead of the two sets)")
    parser.add_argument("--optimizers", default="sgd,adam")
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(0)
    shape = (args.batch * args.steps, args.image_size, args.image_size, 3)
    x = rng.standard_normal(shape).astype("float32")
    y = rng.integers(0, 10, len(x))
    keras.utils.set_random_seed(0)
    weights = keras.applications.ResNet50(
        weights=None, input_shape=x.shape[1:], classes=10
    ).get_weights()
    rows = {}
    configs = {"defaults": {}, "with weight-gradient swaps": WEIGHT_GRADIENTS}
    if args.lms_config:
        configs = {"custom": json.loads(args.lms_config)}
    rows = {}
    for label, options in configs.items():
        for optimizer in args.optimizers.split(","):
            plain_w, plain_loss, _ = train(optimizer, x, y, args.batch, weights, False, options)
            lms_w, lms_loss, plan = train(optimizer, x, y, args.batch, weights, True, options)
            identical = all(np.array_equal(a, b) for a, b in zip(plain_w, lms_w, strict=True))
            pairs = zip(plain_w, lms_w, strict=True)
            diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
            rows.setdefault(label, {})[optimizer] = {
                "options": options,
                "swaps": len(plan.swaps),
                "bytes_swapped": plan.bytes_swapped,
                "weights_bitwise_identical": identical,
                "max_abs_weight_difference": diff,
                "losses_plain": plain_loss,
                "losses_lms": lms_loss,
            }
            print(f"{label}, {optimizer}: {len(plan.swaps)} swaps, bitwise identical: "
                  f"{identical}, largest weight difference {diff:.3g}", flush=True)  # fmt: skip
    result = {
        "benchmark": "resnet50_equivalence",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "setup": (
            f"keras.applications.ResNet50(weights=None, classes=10), {args.image_size}x"
            f"{args.image_size}, batch {args.batch}, {args.steps} steps, "
            "compute on /device:CPU:1, host /device:CPU:0"
        ),
        "tensorflow": tf.__version__,
        "cpu": cpu_state(),
        "configs": rows,
    }
    write_json(Path(args.out), result)
    print(f"wrote {args.out}")
    guaranteed = rows.get("defaults", {}).values()
    return 0 if all(r["weights_bitwise_identical"] for r in guaranteed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
