"""Will a training step fit a 16 GiB GPU, and what does LMS cost? (simulated)

Traces the training step of Keras' ResNet-50 at a batch of 384 (about twice
what a 16 GiB V100 holds), simulates it without swaps, lets tflms.autotune
pick the swap plan that fits over PCIe3 and over NVLink2, and writes the
memory timeline to ``out/resnet50_timeline.png``. Every number printed is
simulated by tflms.simulate; nothing runs on a GPU.

Run: ``.venv/bin/python examples/simulate_and_autotune.py [batch]``
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tflms  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.errors import PlanInfeasibleError  # noqa: E402


def main(argv: list[str]) -> int:
    batch = int(argv[1]) if len(argv) > 1 else 384
    view = tflms.analyze(zoo.resnet50(), batch_size=batch)
    plain = tflms.simulate(view, device="V100-16GB")
    print(plain.summary())
    for link in ("pcie3", "nvlink2"):
        try:
            tuned = tflms.autotune(view, "V100-16GB", link=link)
        except PlanInfeasibleError as err:
            print(f"{link}: {err}")
            continue
        print(tuned.summary())
        if link == "nvlink2":
            os.makedirs("out", exist_ok=True)
            path = os.path.join("out", "resnet50_timeline.png")
            tuned.result.plot(path, budget_bytes=tuned.budget_bytes)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
