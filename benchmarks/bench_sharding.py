"""ZeRO-1/2 sharding (``DistributedOptimizer(sharding=...)``) against replicated training: bytes and step time.

Run by ``make bench`` (or ``python benchmarks/bench_sharding.py [--quick]``).
One ``mpirun`` per rank count (2, then 4) runs ``sharding_worker.py``: a
21M-parameter MLP (20 Dense layers of 1024, AdamW, batch 16 per rank),
replicated, ZeRO-1 and ZeRO-2 interleaved round by round in the same job
(this machine is noisy: only ratios within one job are compared).

Writes ``benchmarks/results/sharding.json``: per rank count and variant the
optimizer-state bytes on each rank (by its variables, and the bytes that
building the optimizer added to TensorFlow's CPU allocator), the most bytes
a step allocates above what each rank held before it, the median over
rounds of the slowest rank's median step, each sharded variant's step time
over the replicated one, and whether the weights ended bitwise equal to the
replicated run's. Measured on this machine's CPUs (ranks share two cores and
talk through shared memory), not simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info, wait_for_quiet  # noqa: E402
from ddl_tf.cluster.mpi import job_environment  # noqa: E402
from tflms.utils.cpu import measurement_env  # noqa: E402

OUT = HERE / "results" / "sharding.json"


def run(ranks: int, rounds: int, folder: Path) -> dict:
    out = folder / f"ranks{ranks}.json"
    command = [
        str(Path(sys.executable).with_name("mpirun")),
        "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
        sys.executable, str(HERE / "sharding_worker.py"), "--out", str(out),
        "--rounds", str(rounds),
    ]  # fmt: skip
    # the allocator's statistics need oneDNN's or the BFC allocator: the same on every CPU
    env = measurement_env(job_environment(os.environ))
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(command, check=True, env=env, timeout=1800, capture_output=True)
    row = json.loads(out.read_text())
    steps = {name: median(times) for name, times in row["step_seconds_per_round"].items()}
    row["median_step_seconds"] = {name: round(t, 4) for name, t in steps.items()}
    row["step_time_over_replicated"] = {
        name: round(steps[name] / steps["None"], 3) for name in ("optimizer", "gradients")
    }
    row["state_bytes_share_of_replicated"] = {
        name: round(
            max(row["state_bytes_per_rank"][name]) / row["state_bytes_per_rank"]["None"][0], 3
        )
        for name in ("optimizer", "gradients")
    }
    peaks = row["step_peak_bytes_above_resting_per_rank"]
    row["step_peak_over_replicated"] = {
        name: round(max(peaks[name]) / max(peaks["None"]), 3) for name in ("optimizer", "gradients")
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, 3 rounds")
    args = parser.parse_args()
    quiet = wait_for_quiet()
    with tempfile.TemporaryDirectory() as tmp:
        counts = (2,) if args.quick else (2, 4)
        rows = {str(n): run(n, 3 if args.quick else 7, Path(tmp)) for n in counts}
    result = {
        "measured": True,
        "what": "ZeRO-1/2 sharding vs replicated DistributedOptimizer(AdamW), 21M-parameter MLP",
        "machine": machine_info(**quiet),
        "by_ranks": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = OUT.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=1))
    tmp_out.replace(OUT)
    print(
        json.dumps(
            {
                n: [r["step_time_over_replicated"], r["state_bytes_share_of_replicated"]]
                for n, r in rows.items()
            }
        )
    )  # noqa: T201


if __name__ == "__main__":
    main()
