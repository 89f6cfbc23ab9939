"""Second ``fit`` of the same model, with LMSCallback and without, side by side (measured on CPU).

Keras keeps a model's train function between ``fit`` calls; LMSCallback keeps
its rewritten one (see :class:`tflms.LMSCallback`), so a second ``fit`` neither
retraces nor replans. This measures the wall time of the first and the second
``fit`` of Keras's ResNet-50 at 64x64 (batch 8, 2 steps), once with the
callback and once without, alternating, ``REPEATS`` times on fresh models, and
writes the medians and their ratio to ``benchmarks/results/refit.json``.

The times are measured on this machine's CPU (two logical devices), not
simulated; the ratio is what the docs quote.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tflms  # noqa: E402
from benchmarks.common import provenance, setup_logging, write_result  # noqa: E402

REPEATS = 3
BATCH, STEPS, SIDE = 8, 2, 64


def model():
    keras.utils.set_random_seed(0)
    net = keras.applications.ResNet50(weights=None, input_shape=(SIDE, SIDE, 3), classes=10)
    net.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    return net


def two_fits(with_lms: bool) -> tuple[float, float, bool]:
    """Seconds of the first and the second fit, and whether the second reused the plan."""
    net = model()
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * STEPS, SIDE, SIDE, 3), dtype=np.float32)
    y = rng.integers(0, 10, BATCH * STEPS)
    callback = tflms.LMSCallback(swapout_threshold=20) if with_lms else None
    times = []
    for _ in range(2):
        start = time.perf_counter()
        net.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback] if callback else [])
        times.append(time.perf_counter() - start)
    return times[0], times[1], bool(callback and callback.reused)


def main() -> int:
    setup_logging()
    runs: dict[str, list] = {"with_lms": [], "without": []}
    for _ in range(REPEATS):
        for key in runs:  # alternate: drift on this noisy machine hits both sides alike
            runs[key].append(two_fits(key == "with_lms"))
    median = {
        key: {
            "first_fit_s": statistics.median(r[0] for r in rows),
            "second_fit_s": statistics.median(r[1] for r in rows),
        }
        for key, rows in runs.items()
    }
    ratio = median["with_lms"]["second_fit_s"] / median["without"]["second_fit_s"]
    data = {
        **provenance(
            "Wall time of a first and a second fit of ResNet-50 (64x64, batch 8, 2 steps) with "
            "LMSCallback and without, alternating, medians of fresh models; measured on this "
            "machine's CPU, not simulated."
        ),
        "simulated": False,
        "repeats": REPEATS,
        "runs": runs,
        "median": median,
        "second_fit_ratio": ratio,
        "reused_every_time": all(r[2] for r in runs["with_lms"]),
        "target_ratio": 1.5,
    }
    path = write_result("refit.json", data)
    print(f"second fit with/without LMSCallback: {ratio:.2f}x ({median}) -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
