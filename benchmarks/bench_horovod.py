"""ddl_tf against Horovod 0.28.1, side by side: same run, same ranks, alternating jobs.

Run by ``make bench`` after ``benchmarks/peers/horovod/build.sh`` (which
builds Horovod against this project's TensorFlow in
``benchmarks/peers/.venv-horovod``; without it this script says so and
writes nothing). ``python benchmarks/bench_horovod.py [--quick]
[--scenarios one_host,cluster]``.

Scenarios, each 2 ranks:

* ``one_host``: ``mpirun -np 2`` on this machine (shared memory between the ranks);
* ``cluster``: a rehearsal cluster (:mod:`ddl_tf.cluster`) of 2 nodes x 1
  rank with links shaped to :data:`CLUSTER_LINK` (needs root; skipped with
  the reason otherwise).

In each, every rank is one process of the peer's Python
(``horovod_allreduce_worker.py``, ``horovod_training_worker.py``): eager and
in-graph allreduce of 4 KiB to 256 MiB, float32 and float16 (with a bare
``MPI_Allreduce`` of the float32 bytes as the floor), and a training step
with ``DistributedGradientTape`` for MobileNetV2 (``keras.applications``,
``weights=None``) and for an MLP whose gradients dominate the step. Each
job runs one library (Horovod's background thread, polling MPI every
millisecond, slows everything else in its process: measured by
``--same-process``, which puts both in one process as the first version of
this benchmark did); jobs alternate Horovod, ddl_tf, ddl_tf, Horovod, ...
and a figure is the median over a library's jobs. Writes
``benchmarks/results/horovod_side_by_side.json``: rows, ddl_tf / Horovod
time ratios, and the targets (ddl_tf <= 1.0x Horovod's time for allreduce
>= 1 MiB and for the training step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info, wait_for_quiet  # noqa: E402
from ddl_tf.cluster import Cluster, ClusterSpec, unavailable_reason  # noqa: E402
from ddl_tf.cluster.mpi import job_environment  # noqa: E402

RESULTS = HERE / "results"
PEER = HERE / "peers" / ".venv-horovod"
PEER_PYTHON, PEER_MPIRUN = PEER / "bin" / "python", PEER / "bin" / "mpirun"
CLUSTER_LINK = "1gbit"
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [64 << 10, 1 << 20, 16 << 20]
DTYPES = ["float32", "float16"]
MODELS = {"mobilenet_v2": 16, "mlp": 8}  # model: batch per rank
TARGET_FROM = 1 << 20


def peer_missing() -> str | None:
    """Why the Horovod peer cannot run, or None."""
    if not PEER_PYTHON.exists() or not (PEER / ".horovod-peer-stamp").exists():
        return f"the Horovod peer is not built (run benchmarks/peers/horovod/build.sh; {PEER})"
    return None


def job_env() -> dict:
    env = job_environment(
        {**os.environ, "PYTHONPATH": f"{REPO}:{HERE}", "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    env["PATH"] = f"{PEER / 'bin'}:{env.get('PATH', '')}"
    return env


def run_job(launch, worker: str, plan: dict, timeout: float) -> dict:
    """Run ``worker`` with ``plan`` through ``launch(argv, timeout) -> returncode``; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_path.write_text(json.dumps(plan))
        program = [str(PEER_PYTHON), str(HERE / worker), str(plan_path), str(out)]
        code = launch(program, timeout)
        if code != 0 or not out.exists():
            raise RuntimeError(f"{worker} failed with exit code {code}")
        return json.loads(out.read_text())


def one_host_launcher(program: list[str], timeout: float) -> int:
    cmd = [str(PEER_MPIRUN), "-np", "2", "--bind-to", "none", "--map-by", "slot", *program]
    return subprocess.run(cmd, env=job_env(), timeout=timeout, check=False).returncode


def cluster_launcher(cluster: Cluster):
    def launch(program: list[str], timeout: float) -> int:
        cmd = cluster.mpirun_command(program, ranks_per_node=1, mpirun=str(PEER_MPIRUN))
        proc = cluster.popen(0, cmd, env=job_env())
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise

    return launch


def ratios(rows: list[dict]) -> list[dict]:
    """ddl_tf time / Horovod time per size, dtype and mode (< 1: ddl_tf faster)."""
    by = {(r["bytes"], r["dtype"], r["mode"], r["library"]): r["seconds"] for r in rows}
    out = []
    for (b, d, m, lib), seconds in sorted(by.items()):
        if lib == "ddl_tf" and (b, d, m, "horovod") in by:
            out.append(
                {
                    "bytes": b,
                    "dtype": d,
                    "mode": m,
                    "ddl_over_horovod": round(seconds / by[(b, d, m, "horovod")], 3),
                }
            )
    return out


def targets(allreduce: dict, training: dict) -> dict:
    big = [r for r in allreduce["ratios"] if r["bytes"] >= TARGET_FROM]
    worse = [r for r in big if r["ddl_over_horovod"] > 1.0]
    steps = {
        m: round(t["step_seconds"]["ddl_tf"] / t["step_seconds"]["horovod"], 3)
        for m, t in training.items()
    }
    return {
        "allreduce_ge_1MiB_ddl_over_horovod_max": max(
            (r["ddl_over_horovod"] for r in big), default=None
        ),
        "allreduce_ge_1MiB_met": bool(big) and not worse,
        "allreduce_ge_1MiB_where_slower": worse,
        "training_step_ddl_over_horovod": steps,
        "training_step_met": bool(steps) and all(v <= 1.0 for v in steps.values()),
        "weights_identical_across_ranks": {
            m: t["weights_identical_across_ranks"] for m, t in training.items()
        },
    }


def alternating(jobs: int) -> list[str]:
    """Job order: Horovod, ddl_tf, ddl_tf, Horovod, ... (drift hits both libraries alike)."""
    pair = ("horovod", "ddl_tf")
    return [pair[(i + i // 2) % 2] for i in range(2 * jobs)]


def merge_allreduce(results: list[dict]) -> dict:
    """One allreduce result from alternating jobs: per row, the median over jobs."""
    by: dict[tuple, list[dict]] = {}
    for result in results:
        for row in result["rows"]:
            key = (row["bytes"], row["dtype"], row["library"], row["mode"], result["library"])
            by.setdefault(key, []).append(row)
    rows = []
    for (nbytes, dtype, library, mode, job), found in sorted(by.items()):
        if library == "mpi":  # the floor, measured in both libraries' jobs
            library = f"mpi_in_{job}_jobs"
        rows.append(
            {
                "bytes": nbytes,
                "dtype": dtype,
                "library": library,
                "mode": mode,
                "seconds": statistics.median(r["seconds"] for r in found),
                "jobs": [r["seconds"] for r in found],
                "correct": None
                if found[0]["correct"] is None
                else all(r["correct"] for r in found),
            }
        )
    skipped = {(s["bytes"], s["dtype"]): s for r in results for s in r["skipped"]}
    return {
        "ranks": results[0]["ranks"],
        "horovod": next((r["horovod"] for r in results if r.get("horovod")), None),
        "jobs": [r["library"] for r in results],
        "rows": rows,
        "skipped": list(skipped.values()),
        "seconds": round(sum(r["seconds"] for r in results), 1),
    }


def merge_training(results: list[dict]) -> dict:
    """One training result from alternating jobs: medians over each library's jobs."""
    merged = {k: v for k, v in results[0].items() if k not in ("step_seconds", "round_seconds")}
    steps: dict[str, list[float]] = {}
    for r in results:
        for variant, seconds in r["step_seconds"].items():
            name = variant if variant != "local" else f"local_in_{r['library']}_jobs"
            steps.setdefault(name, []).append(seconds)
    merged["step_seconds"] = {k: statistics.median(v) for k, v in steps.items()}
    merged["step_seconds"]["local"] = statistics.median(
        [s for k, v in steps.items() if k.startswith("local_in_") for s in v]
    )
    merged["job_step_seconds"] = steps
    merged["weights_identical_across_ranks"] = {
        r["library"]: r["weights_identical_across_ranks"][r["library"]] for r in results
    }
    return merged


def run_scenario(
    name: str, launch, quick: bool, budget: float, max_wait: float, same_process: bool = False
) -> dict:
    started = time.monotonic()
    load_before = os.getloadavg()
    jobs = ["both"] if same_process else alternating(1 if quick else 2)
    plan = {
        "sizes": QUICK_SIZES if quick else SIZES,
        "dtypes": DTYPES,
        "budget_seconds": (120 if quick else budget) / len(jobs),
    }
    print(f"== {name}: allreduce ({', '.join(jobs)})", flush=True)
    quiet = {"allreduce": wait_for_quiet(max_wait=max_wait)}
    results = []
    for library in jobs:
        result = run_job(launch, "horovod_allreduce_worker.py", {**plan, "library": library}, 1800)
        results.append({**result, "library": library})
    allreduce = results[0] if same_process else merge_allreduce(results)
    allreduce["ratios"] = ratios(allreduce["rows"])
    training = {}
    for model, batch in MODELS.items():
        print(f"== {name}: training step, {model}", flush=True)
        quiet[model] = wait_for_quiet(max_wait=max_wait)
        plan = {
            "model": model,
            "batch": batch,
            "rounds": 3 if quick else 5,
            "steps": 3 if quick else 5,
            "warmup": 2,
        }
        results = []
        for library in jobs:
            result = run_job(
                launch, "horovod_training_worker.py", {**plan, "library": library}, 1800
            )
            results.append({**result, "library": library})
        training[model] = results[0] if same_process else merge_training(results)
    result = {
        "scenario": name,
        "load_average_before": [round(x, 2) for x in load_before],
        "other_jobs_before_each_phase": quiet,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started, 1),
        "allreduce": allreduce,
        "training": training,
        "targets": targets(allreduce, training),
    }
    print(json.dumps(result["targets"]), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes, 3 rounds (smoke run)")
    parser.add_argument("--scenarios", default="one_host,cluster")
    parser.add_argument("--out", default=str(RESULTS / "horovod_side_by_side.json"))
    parser.add_argument(
        "--budget", type=float, default=800.0, help="seconds for the allreduce sizes per scenario"
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=180.0,
        help="seconds to wait (at most) for other jobs to leave the CPUs before each phase",
    )
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="both libraries in one process (the first method; shows Horovod's background "
        "thread slowing everything else in its process)",
    )
    args = parser.parse_args(argv)
    missing = peer_missing()
    if missing is not None:
        print(f"bench_horovod: skipped: {missing}.", flush=True)
        return 0
    started = time.time()
    scenarios: list[dict] = []
    skipped: dict[str, str] = {}
    names = args.scenarios.split(",")
    for name in names:
        if name == "one_host":
            scenarios.append(
                run_scenario(
                    name,
                    one_host_launcher,
                    args.quick,
                    args.budget,
                    args.max_wait,
                    args.same_process,
                )
            )
        elif name == "cluster":
            reason = unavailable_reason()
            if reason is not None:
                skipped[name] = reason
                continue
            with Cluster(ClusterSpec(nodes=2, link=CLUSTER_LINK)) as cluster:
                result = run_scenario(
                    name,
                    cluster_launcher(cluster),
                    args.quick,
                    args.budget,
                    args.max_wait,
                    args.same_process,
                )
            result["cluster"] = {"nodes": 2, "ranks_per_node": 1, "link": CLUSTER_LINK}
            scenarios.append(result)
        else:
            parser.error(f"unknown scenario {name!r}; use one_host and/or cluster")
        # after every scenario, so that a later failure keeps what was measured
        write_report(Path(args.out), argv, started, scenarios, skipped, names, args.same_process)
    print(f"wrote {args.out} in {time.time() - started:.0f} s")
    return 0


def write_report(
    out: Path, argv, started: float, scenarios, skipped, names, same_process: bool = False
) -> None:
    """Write the JSON report of the scenarios measured so far (``incomplete`` lists the rest)."""
    done = {s["scenario"] for s in scenarios} | set(skipped)
    report = {
        "benchmark": "horovod_side_by_side",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "command": "python benchmarks/bench_horovod.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "peer": (PEER / ".horovod-peer-stamp").read_text().strip(),
        "method": (
            "every rank is one process with Horovod 0.28.1 (MPI CPU operations, defaults) and "
            "ddl_tf (defaults) on the same MPI; per configuration the variants are timed in "
            "interleaved rounds (median over rounds of the mean per call or step, slowest rank)"
            if same_process
            else "one library per job (Horovod 0.28.1 with MPI CPU operations and its defaults, "
            "or ddl_tf with its defaults), jobs alternating Horovod, ddl_tf, ddl_tf, Horovod on "
            "the same ranks; in a job the calls (or the distributed and the local step) are "
            "timed in interleaved rounds (median over rounds of the mean per call or step, "
            "slowest rank); a figure is the median over the library's jobs; mpi rows: a bare "
            "in-place MPI_Allreduce of the same float32 bytes in each library's jobs"
        ),
        "scenarios": scenarios,
        "skipped": skipped,
        "incomplete": [n for n in names if n not in done],
    }
    from tflms.utils.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(out, report)


if __name__ == "__main__":
    sys.exit(main())
