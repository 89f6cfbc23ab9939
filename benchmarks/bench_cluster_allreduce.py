"""Allreduce across virtual nodes whose links, not the two CPUs, are the bottleneck.

Run by ``make bench`` (or ``python benchmarks/bench_cluster_allreduce.py
[--quick] [--layouts 2x2,2x4]``); needs root, ``ip`` and ``tc`` (otherwise
it says why and writes nothing). For each layout (nodes x ranks per node) it
creates one rehearsal cluster (:mod:`ddl_tf.cluster`: a network namespace per
node, htb-shaped links in both directions, MTU 1500) and runs
``cluster_allreduce_worker.py`` under mpirun inside it, changing the link
rate in place (:meth:`~ddl_tf.cluster.Cluster.set_link`) between jobs:

1. *ladder*: at 1 Gbit/s, 500, 250, 125 and 62.5 Mbit/s, the TCP payload
   rate of the link (:func:`~ddl_tf.cluster.probe.link_throughput`) and a
   16 MiB float32 allreduce (hierarchical and MPI_Allreduce). Where halving
   the rate doubles the time (>= 1.85x, :func:`~ddl_tf.cluster.probe.
   halving_ratios`), the link is the bottleneck; the fastest such rate
   (:func:`~ddl_tf.cluster.probe.link_bound_rate`) is the layout's
   *link-bound rate*;
2. *steps*, at that rate: the hierarchical allreduce with each step
   algorithm per level at 16 MiB; the fastest becomes the layout's ``steps``;
3. *main*, at that rate: MPI_Allreduce (``flat``), ``ring``,
   ``hierarchical``, ``asa`` and ``auto`` at every size, float32 and fp16 on
   the wire, interleaved per size (``auto`` with the policy of an earlier
   run, ``--previous-policy``, so it is judged on data it was not learned
   from); this run's rows become the layout's ``auto`` table
   (``benchmarks/policy_fit.py``);
4. *cpu*, at 1 Gbit/s: the same algorithms at 16 and 64 MiB, to show where
   this machine's CPUs take over.

Every timed configuration is also run once untimed while each node's link
counters are read (:mod:`ddl_tf.cluster.counters`): the bytes that crossed
each node's link are reported next to the algorithm's expected bytes
(:mod:`ddl_tf.cluster.traffic`) and the minimum ``2 (N-1)/N W``.

Results: ``benchmarks/results/cluster_allreduce.json`` (rows with their
bound ``2 (N-1)/N * W * 8 / B``, ratios, link bytes, the ladder, targets per
layout, load averages), ``cluster_allreduce.png`` and
``cluster_auto_policy.json`` (built-in policy plus the learned layout tables
and steps; ``DDL_AUTO_POLICY`` / ``ddlrun --auto-policy`` read it).
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

from benchmarks.cluster_allreduce_report import (  # noqa: E402
    annotate,
    best_steps,
    evaluate,
    ladder_summary,
    markdown,
    plot,
)
from benchmarks.machine import machine_info, wait_for_quiet  # noqa: E402
from benchmarks.policy_fit import fit_tables  # noqa: E402
from ddl_tf.cluster import Cluster, ClusterSpec, parse_rate, unavailable_reason  # noqa: E402
from ddl_tf.cluster.bounds import framing_overhead  # noqa: E402
from ddl_tf.cluster.probe import LINK_BOUND_RATIO, link_throughput  # noqa: E402
from ddl_tf.core.algorithms.selection import DEFAULT_POLICY, layout_key  # noqa: E402

RESULTS = HERE / "results"
LADDER = ["1gbit", "500mbit", "250mbit", "125mbit", "62500kbit"]
LADDER_BYTES = 16 << 20
LADDER_ALGOS = ["hierarchical", "flat"]  # float32; hierarchical also fp16 (it must stay link-bound)
CPU_LINK = "1gbit"
SIZES = [64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [1 << 20, 16 << 20]
CPU_SIZES = [16 << 20, 64 << 20]
ALGOS = ["flat", "ring", "hierarchical", "asa"]
COMPRESSIONS = ["none", "fp16"]
LAYOUTS = {"2x2": (2, 2), "4x1": (4, 1), "2x4": (2, 4)}
MAIN_BUDGET_SECONDS = 420  # per layout; the worker skips sizes that would overrun
CPU_BUDGET_SECONDS = 90


def run_phase(cluster: Cluster, rpn: int, plan: dict, env: dict, timeout: float) -> dict:
    """One MPI job of ``cluster_allreduce_worker.py`` with ``plan``; its JSON output."""
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_path.write_text(json.dumps(plan))
        program = [sys.executable, str(HERE / "cluster_allreduce_worker.py"), str(plan_path)]
        result = cluster.mpirun(
            [*program, str(out)], ranks_per_node=rpn, timeout=timeout, env=env, capture=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"cluster benchmark phase failed with exit code {result.returncode}")
        return json.loads(out.read_text())


def cases(sizes, algorithms, compressions=COMPRESSIONS) -> list[dict]:
    return [
        {"bytes": b, "compression": c, "algorithms": list(algorithms)}
        for b in sizes
        for c in compressions
    ]


def run_ladder(cluster: Cluster, rpn: int, env: dict) -> list[dict]:
    """TCP payload rate and a 16 MiB allreduce at every rate of :data:`LADDER`."""
    points = []
    for link in LADDER:
        cluster.set_link(link)
        bps = parse_rate(link)
        tcp = link_throughput(cluster, 0, 1, nbytes=bps // 8, timeout=60)  # ~1 s per probe
        plan = {"min_rounds": 3, "account": True}
        plan["cases"] = cases([LADDER_BYTES], LADDER_ALGOS, ["none"])
        plan["cases"] += cases([LADDER_BYTES], ["hierarchical"], ["fp16"])
        result = run_phase(cluster, rpn, plan, env, timeout=300)
        annotate(result["rows"], cluster.spec.nodes, rpn, bps)
        points.append(
            {"link": link, "link_bps": bps, "tcp_payload_Gbps": tcp, "rows": result["rows"]}
        )
        seconds = {
            f"{r['algorithm']}/{r['compression']}": round(r["seconds"], 3) for r in result["rows"]
        }
        print(f"   ladder {link}: TCP {tcp} Gbit/s, 16 MiB {seconds} s", flush=True)
    return points


def run_layout(label: str, sizes: list[int], previous: dict, quick: bool) -> tuple[dict, dict]:
    nodes, rpn = LAYOUTS[label]
    key = layout_key((nodes, rpn))
    started = time.monotonic()
    load_before = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(ClusterSpec(nodes=nodes, link=CPU_LINK)) as cluster,
    ):
        print(f"== {label}: {cluster.spec.prefix}", flush=True)
        quiet = {"ladder": wait_for_quiet()}
        ladder = run_ladder(cluster, rpn, env)
        scaling = ladder_summary(ladder)
        link_bps = scaling["link_bound_bps"] or ladder[-1]["link_bps"]
        link = next(p["link"] for p in ladder if p["link_bps"] == link_bps)
        print(f"   link-bound rate: {link} ({scaling['hierarchical']})", flush=True)
        cluster.set_link(link)
        # 1. steps of the hierarchical allreduce, at the link-bound rate
        inner = ["flat", "ring"] if rpn > 1 else ["flat"]
        variants = [f"hierarchical[{i}/{w}]" for i in inner for w in ("flat", "ring")]
        plan = {"budget_seconds": 120, "min_rounds": 3}
        plan["cases"] = cases([16 << 20], variants, ["none"])
        steps_result = run_phase(cluster, rpn, plan, env, timeout=400)
        steps, totals = best_steps(steps_result["rows"])
        print(f"   learned steps {steps} from {totals}", flush=True)
        policy_path = Path(tmp) / "policy.json"
        policy = {**previous, "steps": {**previous.get("steps", {}), key: steps}}
        policy_path.write_text(json.dumps(policy))
        env["DDL_AUTO_POLICY"] = str(policy_path)
        # 2. every algorithm and auto, float32 and fp16, interleaved per size
        budget = MAIN_BUDGET_SECONDS / (3 if quick else 1)
        quiet["main"] = wait_for_quiet()
        plan = {"budget_seconds": budget, "min_rounds": 3, "account": True}
        main = run_phase(cluster, rpn, {**plan, "cases": cases(sizes, [*ALGOS, "auto"])}, env, 1500)
        annotate(main["rows"], nodes, rpn, link_bps)
        # 3. the same at 1 Gbit/s, where the CPUs take over
        cluster.set_link(CPU_LINK)
        quiet["cpu"] = wait_for_quiet()
        cpu_sizes = [s for s in CPU_SIZES if s in sizes] or sizes[-1:]
        plan = {"budget_seconds": CPU_BUDGET_SECONDS, "min_rounds": 3, "account": True}
        cpu = run_phase(cluster, rpn, {**plan, "cases": cases(cpu_sizes, ALGOS)}, env, 600)
        annotate(cpu["rows"], nodes, rpn, parse_rate(CPU_LINK))
    tables = fit_tables([main["rows"]], {key: "none", key + "/custom_op": "fp16"})
    layout = {
        "layout": label,
        "nodes": nodes,
        "ranks_per_node": rpn,
        "hosts": main["hosts"],
        "topology": main["topology"],
        "link": link,
        "link_bps": link_bps,
        "ladder": ladder,
        "rate_scaling": scaling,
        "load_average_before": [round(x, 2) for x in load_before],
        "other_jobs_before_each_phase": quiet,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started, 1),
        "steps": {"learned": steps, "seconds": totals, "rows": steps_result["rows"]},
        "rows": main["rows"],
        "skipped": main["skipped"],
        "cpu_link": CPU_LINK,
        "cpu_rows": cpu["rows"],
        "cpu_skipped": cpu["skipped"],
        "learned_tables": tables,
        "targets": evaluate(main["rows"], cpu["rows"]),
    }
    print(json.dumps(layout["targets"]), flush=True)
    return layout, {**tables, "steps": {key: steps}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 sizes, 2x2 only (smoke run)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="e.g. 2x2,2x4")
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
        layout, learned = run_layout(label, sizes, previous, args.quick)
        layout["auto_policy_evaluated"] = source
        layouts.append(layout)
        policy["steps"].update(learned.pop("steps"))
        policy.update(learned)
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
        "command": "python benchmarks/bench_cluster_allreduce.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "cluster": {
            "link": "per layout: the link-bound rate from the ladder (rows), and "
            f"{CPU_LINK} (cpu_rows); per node, each direction, htb on eth0 and the switch port",
            "mtu": 1500,
            "latency": "none added",
            "mpi": "Open MPI, btl self,sm,tcp; see ddl_tf.cluster.mpi.mca_arguments",
        },
        "bound": (
            "T >= 2 (N-1)/N * W * 8 / B: N nodes, W bytes on the wire (float32: 4 per element, "
            "fp16: 2), B the link rate per direction; every node must send and receive "
            "2 (N-1)/N * W over its one link. TCP/IP/Ethernet framing at MTU 1500 alone costs "
            f"{framing_overhead(1500):.3f}x."
        ),
        "link_bound_test": (
            f"a rate is link-bound when the same 16 MiB allreduce takes >= {LINK_BOUND_RATIO}x "
            "as long at half the rate, and so does every slower rate of the ladder"
        ),
        "link_bytes": (
            "per row, 'link': each node's eth0 counters over one untimed allreduce of that "
            "configuration (list index = node); payload = bytes - 66 per packet. "
            "'expected_link_bytes' from ddl_tf.cluster.traffic (model in 'traffic_model'), "
            "'minimum_link_bytes' = 2 (N-1)/N W"
        ),
        "method": (
            "interleaved rounds per size and wire format (median of rounds of the per-call mean, "
            "slowest rank; allreduce_worker.measure); fp16 rows include the float32<->float16 "
            "conversions. auto runs with the policy of an earlier run (auto_policy_evaluated)."
        ),
        "auto_policy_evaluated": source,
        "layouts": layouts,
        "learned_policy": policy,
    }
    from tflms.utils.files import write_json  # here: importing tflms still imports TensorFlow

    write_json(out, report)
    write_json(out.with_name("cluster_auto_policy.json"), policy)
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    print(f"wrote {out}, its .png and cluster_auto_policy.json in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
