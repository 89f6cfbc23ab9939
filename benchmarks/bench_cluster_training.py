"""Keras data-parallel training across virtual nodes: flat vs hierarchical, float32 vs fp16.

Run by ``make bench`` (or ``python benchmarks/bench_cluster_training.py
[--quick]``); needs root, ``ip`` and ``tc`` (otherwise it says why and writes
nothing). One rehearsal cluster of 2 nodes x 2 ranks with 1 Gbit/s links
(:mod:`ddl_tf.cluster`) runs ``cluster_training_worker.py`` under mpirun
for each variant: ``DDL_ALLREDUCE_ALGO`` flat (MPI_Allreduce) or
hierarchical, ``DDL_COMPRESSION`` none or fp16. Variants run in rounds, the
order reversed every other round, and each variant's figures are the median
over rounds, so load from other jobs on a shared machine falls on all of
them alike. The hierarchical allreduce uses the step algorithms learned by
``bench_cluster_allreduce.py`` (``cluster_auto_policy.json``) when present.

Writes ``benchmarks/results/cluster_training.json``: per variant the step
time, the share of it spent in ddl_tf's allreduce, images per second, and
whether the weights ended bitwise identical on all ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from ddl_tf.cluster import Cluster, ClusterSpec, unavailable_reason  # noqa: E402

RESULTS = HERE / "results"
VARIANTS = [("flat", "none"), ("hierarchical", "none"), ("flat", "fp16"), ("hierarchical", "fp16")]
NODES, RANKS_PER_NODE, LINK = 2, 2, "1gbit"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 10 steps")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS / "cluster_training.json"))
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"bench_cluster_training: skipped: {reason}.", flush=True)
        return 0
    rounds, steps, warmup = (1, 10, 3) if args.quick else (args.rounds, args.steps, 5)
    policy = RESULTS / "cluster_auto_policy.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    if policy.exists():
        env["DDL_AUTO_POLICY"] = str(policy)
    started = time.time()
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {f"{a}/{c}": [] for a, c in VARIANTS}
    spec = ClusterSpec(nodes=NODES, link=LINK)
    with tempfile.TemporaryDirectory() as tmp, Cluster(spec) as cluster:
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for algo, compression in order:
                out = Path(tmp) / f"{algo}-{compression}-{r}.json"
                job_env = {**env, "DDL_ALLREDUCE_ALGO": algo, "DDL_COMPRESSION": compression}
                program = [sys.executable, str(HERE / "cluster_training_worker.py"), str(out)]
                result = cluster.mpirun(
                    program + [str(steps), str(warmup)],
                    ranks_per_node=RANKS_PER_NODE,
                    timeout=600,
                    env=job_env,
                    capture=False,
                )
                if result.returncode != 0:
                    raise RuntimeError(f"training {algo}/{compression} failed: {result.returncode}")
                row = json.loads(out.read_text())
                runs[f"{algo}/{compression}"].append(row)
                print(
                    f"  round {r} {algo:>12} {compression:>4}: step {row['step_seconds'] * 1e3:7.1f} ms,"
                    f" comm {row['comm_share']:.0%}, {row['images_per_second']:6.1f} img/s,"
                    f" identical {row['weights_identical_on_all_ranks']}",
                    flush=True,
                )
    variants = []
    for key, rows in runs.items():
        algo, compression = key.split("/")

        def median(field, rows=rows):
            values = sorted(r[field] for r in rows)
            return (
                values[len(values) // 2]
                if len(values) % 2
                else sum(values[len(values) // 2 - 1 : len(values) // 2 + 1]) / 2
            )

        variants.append(
            {
                "algorithm": algo,
                "compression": compression,
                "step_seconds": median("step_seconds"),
                "comm_share": median("comm_share"),
                "images_per_second": median("images_per_second"),
                "weights_identical_on_all_ranks": all(
                    r["weights_identical_on_all_ranks"] for r in rows
                ),
                "rounds": rows,
            }
        )
    by = {(v["algorithm"], v["compression"]): v for v in variants}
    first = runs[f"{VARIANTS[0][0]}/{VARIANTS[0][1]}"][0]
    from tflms.utils.cpu import cpu_state  # here: importing tflms imports TensorFlow

    report = {
        "benchmark": "cluster_training",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu": cpu_state(),
        "seconds": round(time.time() - started, 1),
        "cluster": f"{NODES} nodes x {RANKS_PER_NODE} ranks, {LINK} links (htb), MTU 1500",
        "model": f"Keras CNN, {first['parameters']} parameters ({first['gradient_bytes_fp32'] / 1e6:.1f} MB of float32 gradients per step), batch 32 per rank, SGD momentum",
        "method": f"{rounds} round(s) of {steps} steps per variant after {warmup} warm-up steps, order reversed every other round; per round the median step of each rank, the slowest rank; reported: median over rounds. comm_share = time inside ddl_tf's allreduce / step time.",
        "auto_policy": env.get("DDL_AUTO_POLICY"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "variants": variants,
        "ratios": {
            "flat_over_hierarchical_fp32": round(
                by[("flat", "none")]["step_seconds"] / by[("hierarchical", "none")]["step_seconds"],
                3,
            ),
            "flat_over_hierarchical_fp16": round(
                by[("flat", "fp16")]["step_seconds"] / by[("hierarchical", "fp16")]["step_seconds"],
                3,
            ),
            "fp32_over_fp16_hierarchical": round(
                by[("hierarchical", "none")]["step_seconds"]
                / by[("hierarchical", "fp16")]["step_seconds"],
                3,
            ),
            "fp32_over_fp16_flat": round(
                by[("flat", "none")]["step_seconds"] / by[("flat", "fp16")]["step_seconds"], 3
            ),
        },
    }
    out = Path(args.out)
    from tflms.utils.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(out, report)
    for v in variants:
        print(
            f"| {v['algorithm']} | {v['compression']} | {v['step_seconds'] * 1e3:.0f} ms | "
            f"{v['comm_share']:.0%} | {v['images_per_second']:.1f} | {v['weights_identical_on_all_ranks']} |"
        )
    print(json.dumps(report["ratios"]))
    print(f"wrote {out} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
