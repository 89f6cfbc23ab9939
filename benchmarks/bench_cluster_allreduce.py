"""Allreduce across virtual nodes with a shaped 1 Gbit/s link: algorithms vs the bandwidth bound.

Run by ``make bench`` (or ``python benchmarks/bench_cluster_allreduce.py
[--quick] [--layouts 2x2,4x1]``); needs root, ``ip`` and ``tc`` (otherwise it
says why and writes nothing). For each layout (nodes x ranks per node) it
creates a rehearsal cluster (:mod:`ddl_tf.cluster`: one network namespace per
node, links shaped with htb to 1 Gbit/s each direction, MTU 1500), measures
the links' TCP payload rate, then runs ``cluster_allreduce_worker.py`` (which
reuses ``allreduce_worker.py``'s interleaved timing) under mpirun inside the
cluster, in two phases:

1. *steps*: the hierarchical allreduce with each step algorithm per level
   (``hierarchical[node/world]``, flat or ring), at 16 and 64 MiB; the fastest
   becomes the layout's learned ``steps``;
2. *main*: MPI_Allreduce (``flat``), ``ring``, ``hierarchical`` (with the
   learned steps), ``asa`` and ``auto`` at every size, float32 and fp16 on the
   wire, interleaved per size. ``auto`` runs with the policy learned by an
   *earlier* run (``--previous-policy``, by default the
   ``cluster_auto_policy.json`` already in results/; the built-in policy if
   there is none), so the "auto is never more than 5 % slower than the best"
   target is judged on measurements the policy was not learned from. This
   run's rows become the layout's new ``auto`` table (``multi_node@NxL``;
   fp16 in ``multi_node@NxL/custom_op``, keyed by wire bytes), learned by
   :func:`ddl_tf.core.policy_fit.fit_tables`: the fastest algorithm per size,
   except that a challenger must beat the incumbent by 10 % and flat wins
   ties; the general ``multi_node`` tables minimise the worst-case regret
   over the layouts measured.

Results: ``benchmarks/results/cluster_allreduce.json`` (every row with its
bandwidth lower bound ``2 (N-1)/N * wire bytes * 8 / 1 Gbit/s`` and the ratio
to it, the targets per layout, load averages), ``cluster_allreduce.png`` and
``cluster_auto_policy.json`` (the built-in policy plus the learned layout
tables and steps; point ``DDL_AUTO_POLICY`` / ``ddlrun --auto-policy`` at it).
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

from benchmarks.machine import machine_info  # noqa: E402
from ddl_tf.cluster import Cluster, ClusterSpec, allreduce_lower_bound, unavailable_reason  # noqa: E402
from ddl_tf.cluster.bounds import framing_overhead  # noqa: E402
from ddl_tf.cluster.probe import link_throughput  # noqa: E402
from ddl_tf.core.policy_fit import fit_tables  # noqa: E402
from ddl_tf.core.selection import DEFAULT_POLICY, layout_key  # noqa: E402

RESULTS = HERE / "results"
LINK = "1gbit"
LINK_BPS = 10**9
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [64 << 10, 1 << 20, 16 << 20]
ALGOS = ["flat", "ring", "hierarchical", "asa"]
COMPRESSIONS = ["none", "fp16"]
STEP_SIZES = [16 << 20, 64 << 20]
# (nodes, ranks per node, largest size): 256 MiB only where the whole run stays near 10 minutes
LAYOUTS = {"2x2": (2, 2, 256 << 20), "4x1": (4, 1, 64 << 20), "2x4": (2, 4, 64 << 20)}
LAYOUT_BUDGET_SECONDS = 330  # per layout, all phases; the worker skips what would overrun
TOLERANCE = 0.05
LABELS = {
    "flat": "MPI_Allreduce",
    "ring": "ring",
    "hierarchical": "hierarchical",
    "asa": "asa",
    "auto": "auto",
}


def run_phase(cluster: Cluster, rpn: int, plan: dict, env: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_path.write_text(json.dumps(plan))
        program = [
            sys.executable,
            str(HERE / "cluster_allreduce_worker.py"),
            str(plan_path),
            str(out),
        ]
        result = cluster.mpirun(
            program, ranks_per_node=rpn, timeout=timeout, env=env, capture=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"cluster benchmark phase failed with exit code {result.returncode}")
        return json.loads(out.read_text())


def wire_bound(row: dict, nodes: int) -> float:
    return allreduce_lower_bound(row["wire_bytes"], nodes=nodes, link_bps=LINK_BPS)


def annotate(rows: list[dict], nodes: int) -> None:
    for row in rows:
        row["bound_seconds"] = wire_bound(row, nodes)
        row["ratio_to_bound"] = round(row["seconds"] / row["bound_seconds"], 3)
        fp32 = allreduce_lower_bound(row["bytes"], nodes=nodes, link_bps=LINK_BPS)
        row["ratio_to_fp32_bound"] = round(row["seconds"] / fp32, 3)


def best_steps(rows: list[dict]) -> tuple[dict, dict]:
    totals: dict[str, float] = {}
    for row in rows:
        totals[row["algorithm"]] = totals.get(row["algorithm"], 0.0) + row["seconds"]
    best = min(totals, key=totals.get)
    inner, top = best[len("hierarchical[") : -1].split("/")
    return {"node": inner, "world": top}, {k: round(v, 4) for k, v in totals.items()}


def evaluate(main_rows: list[dict]) -> dict:
    t = {(r["bytes"], r["algorithm"], r["compression"]): r for r in main_rows}
    big = sorted({b for b, a, c in t if b >= 16 << 20 and a == "hierarchical"})
    hier = {b: t[(b, "hierarchical", "none")]["ratio_to_bound"] for b in big}
    vs_ring = {
        b: round(t[(b, "ring", "none")]["seconds"] / t[(b, "hierarchical", "none")]["seconds"], 3)
        for b in big
    }
    fp16 = {}
    for b in big:
        if (b, "hierarchical", "fp16") not in t:
            continue  # skipped for time
        best32 = min(t[(b, a, "none")]["seconds"] for a in ALGOS if (b, a, "none") in t)
        best16 = min(t[(b, a, "fp16")]["seconds"] for a in ALGOS if (b, a, "fp16") in t)
        fp16[b] = {
            "hierarchical": round(
                t[(b, "hierarchical", "none")]["seconds"]
                / t[(b, "hierarchical", "fp16")]["seconds"],
                3,
            ),
            "best": round(best32 / best16, 3),
        }
    auto = {}
    for (b, a, c), row in sorted(t.items()):
        if a != "auto":
            continue
        others = {x: t[(b, x, c)]["seconds"] for x in ALGOS if (b, x, c) in t}
        best = min(others, key=others.get)
        auto[f"{c}/{b}"] = {
            "best": best,
            "auto_chose": row["chosen"],
            "ratio": round(row["seconds"] / others[best], 3),
            "ratio_to_its_choice_measured_alone": round(row["seconds"] / others[row["chosen"]], 3)
            if row["chosen"] in others
            else None,
        }
    return {
        "hierarchical_ratio_to_bound_ge_16MiB": {str(b): v for b, v in hier.items()},
        "hierarchical_within_1.15x_of_bound": bool(hier) and all(v <= 1.15 for v in hier.values()),
        "ring_over_hierarchical_ge_16MiB": {str(b): v for b, v in vs_ring.items()},
        "hierarchical_1.5x_faster_than_ring": bool(vs_ring)
        and all(v >= 1.5 for v in vs_ring.values()),
        "fp32_over_fp16_ge_16MiB": {str(b): v for b, v in fp16.items()},
        "fp16_1.8x_faster": bool(fp16) and all(v["best"] >= 1.8 for v in fp16.values()),
        "auto_over_best": auto,
        "auto_within_5pct_of_best": bool(auto)
        and all(v["ratio"] <= 1 + TOLERANCE for v in auto.values()),
    }


def run_layout(label: str, sizes: list[int], previous: dict) -> tuple[dict, dict]:
    nodes, rpn, top = LAYOUTS[label]
    sizes = [s for s in sizes if s <= top]
    key = layout_key((nodes, rpn))
    started = time.monotonic()
    load_before = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(ClusterSpec(nodes=nodes, link=LINK)) as cluster,
    ):
        probe = link_throughput(cluster, 0, 1, nbytes=32 << 20, timeout=60)
        print(f"== {label}: link payload rate {probe} Gbit/s", flush=True)
        # 1. steps of the hierarchical allreduce
        inner = ["flat", "ring"] if rpn > 1 else ["flat"]
        variants = [f"hierarchical[{i}/{w}]" for i in inner for w in ("flat", "ring")]
        step_sizes = [s for s in STEP_SIZES if s in sizes] or sizes[-1:]
        plan = {
            "budget_seconds": 90,
            "min_rounds": 3,
            "cases": [
                {"bytes": b, "compression": "none", "algorithms": variants} for b in step_sizes
            ],
        }
        steps_result = run_phase(cluster, rpn, plan, env, timeout=300)
        steps, totals = best_steps(steps_result["rows"])
        print(f"   learned steps {steps} from {totals}", flush=True)
        # auto: the earlier run's tables; hierarchical (also when auto picks it): this run's steps
        policy_path = Path(tmp) / "policy.json"
        policy = {**previous, "steps": {**previous.get("steps", {}), key: steps}}
        policy_path.write_text(json.dumps(policy))
        env["DDL_AUTO_POLICY"] = str(policy_path)
        # 2. every algorithm and auto, fp32 and fp16, interleaved per size
        spent = time.monotonic() - started
        plan = {
            "budget_seconds": LAYOUT_BUDGET_SECONDS - spent,
            "min_rounds": 3,
            "cases": [
                {"bytes": b, "compression": c, "algorithms": [*ALGOS, "auto"]}
                for b in sizes
                for c in COMPRESSIONS
            ],
        }
        main = run_phase(cluster, rpn, plan, env, timeout=900)
        annotate(main["rows"], nodes)
        tables = fit_tables([main["rows"]], {key: "none", key + "/custom_op": "fp16"})
    layout = {
        "layout": label,
        "nodes": nodes,
        "ranks_per_node": rpn,
        "hosts": main["hosts"],
        "topology": main["topology"],
        "link_payload_Gbps": {k: round(v, 3) for k, v in probe.items()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started, 1),
        "steps": {
            "learned": steps,
            "seconds_summed_over_sizes": totals,
            "rows": steps_result["rows"],
        },
        "rows": main["rows"],
        "skipped": main["skipped"],
        "auto_policy_evaluated": previous.get("_source", "built-in"),
        "learned_tables": tables,
        "targets": evaluate(main["rows"]),
    }
    print(json.dumps(layout["targets"]), flush=True)
    return layout, {**tables, "steps": {key: steps}}


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def _time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def topology_table(report: dict) -> str:
    out = [
        "| layout | ranks | ddl_tf sees | learned hierarchical steps | link TCP payload, each way | load avg before -> after | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout in report["layouts"]:
        first = layout["topology"].splitlines()[0]
        steps = layout["steps"]["learned"]
        probe = ", ".join(f"{k} {v:.2f}" for k, v in layout["link_payload_Gbps"].items())
        out.append(
            f"| {layout['nodes']} nodes x {layout['ranks_per_node']} | {layout['nodes'] * layout['ranks_per_node']} "
            f"| {first} | node {steps['node']}, world {steps['world']} | {probe} Gbit/s "
            f"| {layout['load_average_before'][0]} -> {layout['load_average_after'][0]} | {layout['seconds'] / 60:.1f} |"
        )
    return "\n".join(out)


def targets_table(report: dict) -> str:
    out = [
        "| layout | hierarchical / bound (>= 16 MiB) | ring / hierarchical | fp32 / fp16 (best vs best) | auto / best, worst size |",
        "|---|---|---|---|---|",
    ]
    for layout in report["layouts"]:
        t = layout["targets"]
        hier = ", ".join(
            f"{_size(int(b))}: {v:.2f}"
            for b, v in t["hierarchical_ratio_to_bound_ge_16MiB"].items()
        )
        ring = ", ".join(
            f"{_size(int(b))}: {v:.2f}" for b, v in t["ring_over_hierarchical_ge_16MiB"].items()
        )
        fp16 = ", ".join(
            f"{_size(int(b))}: {v['best']:.2f}" for b, v in t["fp32_over_fp16_ge_16MiB"].items()
        )
        worst = max(t["auto_over_best"].items(), key=lambda kv: kv[1]["ratio"])
        comp, size = worst[0].split("/")
        out.append(
            f"| {layout['layout']} | {hier} | {ring} | {fp16} | {worst[1]['ratio']:.2f} "
            f"({_size(int(size))} {'fp16' if comp == 'fp16' else 'float32'}) |"
        )
    return "\n".join(out)


def markdown(report: dict) -> str:
    out = [topology_table(report), "", targets_table(report)]
    for layout in report["layouts"]:
        for compression in COMPRESSIONS:
            rows = [r for r in layout["rows"] if r["compression"] == compression]
            if not rows:
                continue
            auto = {r["bytes"]: r for r in rows if r["algorithm"] == "auto"}
            out.append(
                f"\n{layout['layout']} ({layout['nodes']} nodes x {layout['ranks_per_node']} ranks), "
                f"{'float32' if compression == 'none' else 'fp16 on the wire'}: time (ratio to bound)\n"
            )
            out.append(
                "| size | bound | " + " | ".join(LABELS[a] for a in ALGOS) + " | auto (chose) |"
            )
            out.append("|---" * (len(ALGOS) + 3) + "|")
            cell = {(r["bytes"], r["algorithm"]): r for r in rows}
            for b in sorted({r["bytes"] for r in rows}):
                bound = next(r["bound_seconds"] for r in rows if r["bytes"] == b)
                parts = [
                    f"{_time(cell[(b, a)]['seconds'])} ({cell[(b, a)]['ratio_to_bound']:.2f})"
                    if (b, a) in cell
                    else ""
                    for a in ALGOS
                ]
                a = auto.get(b)
                parts.append(
                    f"{_time(a['seconds'])} ({a['ratio_to_bound']:.2f}, {a['chosen']})" if a else ""
                )
                out.append(f"| {_size(b)} | {_time(bound)} | " + " | ".join(parts) + " |")
        out.append(f"\ntargets {layout['layout']}: {json.dumps(layout['targets'])}")
    return "\n".join(out)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = report["layouts"]
    fig, axes = plt.subplots(2, len(layouts), figsize=(5 * len(layouts), 8), squeeze=False)
    colors = {"flat": "C0", "ring": "C1", "hierarchical": "C2", "asa": "C3", "auto": "k"}
    for col, layout in enumerate(layouts):
        top, bottom = axes[0][col], axes[1][col]
        for compression, style in (("none", "-"), ("fp16", "--")):
            rows = [r for r in layout["rows"] if r["compression"] == compression]
            for algo in ALGOS + ["auto"]:
                pts = sorted((r["bytes"], r) for r in rows if r["algorithm"] == algo)
                if not pts:
                    continue
                xs = [b / 2**20 for b, _ in pts]
                name = f"{LABELS[algo]}{' fp16' if compression == 'fp16' else ''}"
                top.plot(
                    xs,
                    [r["seconds"] for _, r in pts],
                    style,
                    marker=".",
                    color=colors[algo],
                    label=name,
                )
                bottom.plot(
                    xs,
                    [r["ratio_to_fp32_bound"] for _, r in pts],
                    style,
                    marker=".",
                    color=colors[algo],
                )
            if compression == "none":
                xs = sorted({r["bytes"] for r in rows})
                top.plot(
                    [b / 2**20 for b in xs],
                    [
                        allreduce_lower_bound(b, nodes=layout["nodes"], link_bps=LINK_BPS)
                        for b in xs
                    ],
                    ":",
                    color="grey",
                    label="bound (float32)",
                )
        top.set(
            xscale="log", yscale="log", title=f"{layout['layout']} at 1 Gbit/s", ylabel="seconds"
        )
        bottom.set(
            xscale="log",
            yscale="log",
            xlabel="buffer size (MiB of float32)",
            ylabel="time / float32 bandwidth bound",
        )
        bottom.axhline(1.15, color="grey", lw=0.8, ls=":")
        bottom.axhline(1.0, color="grey", lw=0.8)
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("Allreduce across virtual nodes, 1 Gbit/s links (fp16 dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes, 2x2 only (smoke run)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="e.g. 2x2,4x1")
    parser.add_argument("--out", default=str(RESULTS / "cluster_allreduce.json"))
    parser.add_argument("--markdown", action="store_true", help="print tables of --out and exit")
    parser.add_argument(
        "--previous-policy",
        default=str(RESULTS / "cluster_auto_policy.json"),
        help="policy learned by an earlier run, which 'auto' runs with (built-in if missing)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.markdown:
        print(markdown(json.loads(out.read_text())))
        return 0
    reason = unavailable_reason()
    if reason is not None:
        print(f"bench_cluster_allreduce: skipped: {reason}.", flush=True)
        return 0
    started = time.time()
    labels = ["2x2"] if args.quick else args.layouts.split(",")
    sizes = QUICK_SIZES if args.quick else SIZES
    previous_path = Path(args.previous_policy)
    if previous_path.exists():
        previous = json.loads(previous_path.read_text())
        source = f"{previous_path} (modified {time.ctime(previous_path.stat().st_mtime)})"
    else:
        previous, source = DEFAULT_POLICY.to_json(), "built-in (no earlier run)"
    print(f"auto runs with the policy from {source}", flush=True)
    policy = DEFAULT_POLICY.to_json()
    policy["steps"] = {}
    layouts = []
    for label in labels:
        layout, learned = run_layout(label, sizes, previous)
        layout["auto_policy_evaluated"] = source
        layouts.append(layout)
        policy["steps"].update(learned.pop("steps"))
        policy.update(learned)
    # layouts that were not measured: least worst-case regret over the measured ones
    policy.update(
        fit_tables(
            [layout["rows"] for layout in layouts],
            {"multi_node": "none", "multi_node/custom_op": "fp16"},
        )
    )
    report = {
        "benchmark": "cluster_allreduce",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "machine": machine_info(),
        "cluster": {
            "link": f"{LINK} per node, each direction (htb on the node's eth0 and its switch port)",
            "mtu": 1500,
            "latency": "none added (this kernel has no netem)",
            "mpi": "Open MPI, btl self,sm,tcp; see ddl_tf.cluster.mpi.mca_arguments",
        },
        "bound": (
            "T >= 2 (N-1)/N * W * 8 / B: N nodes, W bytes on the wire (float32: 4 per element, "
            "fp16: 2), B = 1e9 bit/s per direction; every node must send and receive "
            "2 (N-1)/N * W over its one link. TCP/IP/Ethernet framing at MTU 1500 alone costs "
            f"{framing_overhead(1500):.3f}x."
        ),
        "method": (
            "per layout: phase 'steps' picks the hierarchical step algorithms; phase 'main' "
            "times flat (MPI_Allreduce), ring, hierarchical, asa and auto per size and wire "
            "format, interleaved in rounds (median of rounds of the per-call mean, slowest "
            "rank; allreduce_worker.measure). auto runs with the policy of an earlier run "
            "(auto_policy_evaluated); the fastest algorithm per size of this run is the new "
            "learned policy. fp16 rows include the float32<->float16 conversions."
        ),
        "auto_policy_evaluated": source,
        "layouts": layouts,
        "learned_policy": policy,
    }
    from tflms.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(out, report)
    write_json(out.with_name("cluster_auto_policy.json"), policy)
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    print(f"wrote {out}, its .png and cluster_auto_policy.json in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
