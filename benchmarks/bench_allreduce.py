"""Allreduce benchmark: ddl_tf's algorithms vs plain mpi4py MPI_Allreduce, 1 KiB .. 256 MiB.

Run by ``make bench`` (or ``python benchmarks/bench_allreduce.py [--quick]``;
``--adasum`` times only ``op=Adasum`` next to ``op=Average``, see :func:`adasum_cost`).
It starts ``benchmarks/allreduce_worker.py`` under the virtual environment's
mpirun for three layouts of this machine:

* 2 ranks, one node;
* 4 ranks, one node;
* 4 ranks as 2 pseudo-nodes of 2 (``DDL_PSEUDO_NODES=2``), which makes
  ``hierarchical`` a real two-level reduce-scatter / allreduce / allgather
  (all ranks still share memory, so this measures its overhead, not a gain).

and writes ``benchmarks/results/allreduce.json`` atomically: every row
(time, algorithm and bus bandwidth; bus bandwidth = bytes / time * 2 (P-1) / P
as in nccl-tests), the machine's load average around each layout (other jobs
on a shared machine distort timings), the two targets evaluated per layout,
and ``auto_policy.json``: the ``auto`` tables learned from the rows by
``benchmarks/policy_fit.py`` (per size the fastest algorithm in the worst
case over the layouts, except that a challenger must beat the incumbent by
10 % and flat wins ties), in the format ``DDL_AUTO_POLICY``
reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info  # noqa: E402
from benchmarks.policy_fit import fit_tables  # noqa: E402
from ddl_tf.launch.command import find_mpirun  # noqa: E402

SIZES = [
    1 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
]
QUICK_SIZES = [1 << 10, 8 << 10, 1 << 20, 4 << 20]
ALGOS = "mpi4py,flat,ring,asa,hierarchical,auto,engine,engine-unchecked"
LAYOUTS = [
    ("2 ranks, 1 node", 2, {}, ALGOS),
    ("4 ranks, 1 node", 4, {}, ALGOS),
    ("4 ranks, 2 pseudo-nodes", 4, {"DDL_PSEUDO_NODES": "2"}, "mpi4py,flat,hierarchical,auto"),
]
TOLERANCE = 0.05  # "no slower" allows 5 % for run-to-run noise
ADASUM_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
ADASUM_LAYOUTS = [
    ("2 ranks, 1 node", 2, {}),
    ("4 ranks, 1 node", 4, {}),
    (
        "4 ranks, 2 pseudo-nodes, hierarchical",
        4,
        {"DDL_PSEUDO_NODES": "2", **{"DDL_ALLREDUCE_ALGO": "hierarchical"}},
    ),
]


def run_layout(np_: int, env: dict, algos: str, sizes: list[int], compressions: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [find_mpirun(), "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += [
            sys.executable,
            str(HERE / "allreduce_worker.py"),
            str(out),
            algos,
            ",".join(map(str, sizes)),
            compressions,
        ]
        child_env = {**os.environ, **env, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, env=child_env, check=True, timeout=1800)
        return json.loads(out.read_text())


def evaluate(rows: list[dict]) -> dict:
    """The issue's targets for one layout, on float32, from the target-phase A/B rows."""
    plain = {(r["bytes"], r["algorithm"]): r["seconds"] for r in rows if r.get("phase") == "target"}
    large = sorted(b for b, a in plain if a == "mpi4py" and b >= 1 << 20)
    ratios = {b: plain[(b, "auto")] / plain[(b, "mpi4py")] for b in large}
    latency = plain.get((8 << 10, "auto"), 0) / plain.get((8 << 10, "mpi4py"), 1)
    return {
        "auto_vs_mpi_ge_1MiB": {str(b): round(r, 3) for b, r in ratios.items()},
        "auto_no_slower_ge_1MiB": all(r <= 1 + TOLERANCE for r in ratios.values()),
        "auto_8KiB_latency_ratio": round(latency, 3),
        "auto_8KiB_within_1.2x": latency <= 1.2,
    }


def derive_policy(layouts: list[dict]) -> dict:
    """``auto`` tables from the measurements, by the product's one rule set.

    ``benchmarks/policy_fit.py`` (the rules the cluster benchmark
    uses too): per wire size, an algorithm's cost is its worst ratio to the
    fastest over the layouts of a situation (2 and 4 ranks on one node; the
    pseudo-node layout for ``multi_node``), a challenger must beat the
    incumbent by 10 %, and flat wins ties. ``single_node/custom_op`` is
    learned from the bf16 rows.
    """
    tables = {}
    for nodes, situations in (
        (1, {"single_node": "none", "single_node/custom_op": "bf16"}),
        (2, {"multi_node": "none"}),
    ):
        rows = [[r for r in layout["rows"] if r["nodes"] == nodes] for layout in layouts]
        tables.update(fit_tables(rows, situations))
    return tables


def table(rows: list[dict], compression: str = "none") -> str:
    algos = [a for a in ALGOS.split(",") if any(r["algorithm"] == a for r in rows)]
    sizes = sorted({r["bytes"] for r in rows})
    cell = {
        (r["bytes"], r["algorithm"]): r
        for r in rows
        if r["compression"] == compression and not r.get("phase")
    }
    lines = ["| size | " + " | ".join(algos) + " |", "|---" * (len(algos) + 1) + "|"]
    for b in sizes:
        parts = []
        for a in algos:
            r = cell.get((b, a))
            parts.append("" if r is None else f"{_time(r['seconds'])} ({r['busbw_GBps']:.2f})")
        lines.append(f"| {_size(b)} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def _time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def _layout_record(label, ranks, env, result, load_before, **figures) -> dict:
    """One layout's entry of a results file: where it ran, how loaded, its figures and rows."""
    return {
        "layout": label,
        "ranks": ranks,
        "env": env,
        "topology": result["topology"],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **figures,
        "rows": result["rows"],
    }


def adasum_cost() -> int:
    """``engine.allreduce`` with ``op=Adasum`` next to ``op=Average``: ``results/adasum.json``.

    Both through the full engine call that ``hvd.allreduce`` runs, float32, on
    2 and 4 ranks of this machine and on 4 ranks as 2 pseudo-nodes with the
    hierarchical allreduce (Average: the hierarchical algorithm; Adasum: the
    node average, then Adasum across the 2 nodes). A few sizes only, to keep
    the run short (about a minute).
    """
    started = time.time()
    layouts = []
    for label, np_, env in ADASUM_LAYOUTS:
        print(f"== {label}", flush=True)
        load_before = os.getloadavg()
        result = run_layout(np_, env, "average,adasum", ADASUM_SIZES, "none")
        rows = result["rows"]
        seconds = {(r["bytes"], r["algorithm"]): r["seconds"] for r in rows}
        ratios = {
            str(b): round(seconds[(b, "adasum")] / seconds[(b, "average")], 3) for b in ADASUM_SIZES
        }
        layouts.append(
            _layout_record(label, np_, env, result, load_before, adasum_over_average=ratios)
        )
        print(json.dumps(layouts[-1]["adasum_over_average"]), flush=True)
    report = {
        "benchmark": "adasum",
        "command": "python benchmarks/bench_allreduce.py --adasum",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "machine": machine_info(mpirun=find_mpirun()),
        "method": (
            "float32, one tensor per call; engine.allreduce(op=Average) and "
            "engine.allreduce(op=Adasum) run interleaved in rounds of back-to-back calls; "
            "time = median over rounds of the per-call mean on the slowest rank."
        ),
        "layouts": layouts,
    }
    from tflms.utils.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(RESULTS / "adasum.json", report)
    print(f"wrote {RESULTS / 'adasum.json'} in {time.time() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 sizes, for a smoke run")
    parser.add_argument(
        "--adasum",
        action="store_true",
        help="only Adasum next to Average (engine.allreduce), 4 sizes: results/adasum.json",
    )
    parser.add_argument("--out", default=str(RESULTS / "allreduce.json"))
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the tables of an existing --out file and exit",
    )
    args = parser.parse_args(argv)
    if args.adasum:
        return adasum_cost()
    if args.markdown:
        report = json.loads(Path(args.out).read_text())
        for layout in report["layouts"]:
            for compression in ("none", "fp16", "bf16"):
                if any(r["compression"] == compression for r in layout["rows"]):
                    print(f"\n{layout['layout']}, compression {compression}:\n")
                    print(table(layout["rows"], compression))
            print(f"\ntargets: {json.dumps(layout['targets'])}")
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    started = time.time()
    layouts = []
    for label, np_, env, algos in LAYOUTS:
        print(f"== {label}", flush=True)
        load_before = os.getloadavg()
        compressions = "none,fp16,bf16" if "pseudo" not in label else "none"
        result = run_layout(np_, env, algos, sizes, compressions)
        layouts.append(
            _layout_record(label, np_, env, result, load_before, targets=evaluate(result["rows"]))
        )
        print(table(result["rows"]), flush=True)
        print(json.dumps(layouts[-1]["targets"]), flush=True)
    policy = derive_policy(layouts)
    report = {
        "benchmark": "allreduce",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "machine": machine_info(mpirun=find_mpirun()),
        "method": (
            "float32 buffers; per size and compression the algorithms run interleaved in "
            "rounds of back-to-back calls; time = median over rounds of the per-call mean on "
            "the slowest rank; busbw = bytes/time*2(P-1)/P. Compressed rows include the "
            "float32<->half conversions. 'auto' = engine.choose(...).allreduce; 'engine' = "
            "engine.allreduce (descriptor check + fusion copy); 'engine-unchecked' = the same "
            f"with DDL_CHECK_COLLECTIVES=0. Targets allow {TOLERANCE:.0%} noise for 'no slower'."
        ),
        "layouts": layouts,
        "derived_auto_policy": policy,
    }
    from tflms.utils.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(Path(args.out), report)
    write_json(Path(args.out).with_name("auto_policy.json"), policy)
    print(f"wrote {args.out} and auto_policy.json in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
