"""Numbers and pictures of ``bench_cluster_allreduce.py``: bounds, link bytes, targets, tables, plot.

Pure functions over the worker's rows (dicts with ``bytes``, ``wire_bytes``,
``algorithm``, ``chosen``, ``compression``, ``seconds`` and, when counted,
``link``: each node's link counters over one allreduce, by node).
"""

from __future__ import annotations

from pathlib import Path

from ddl_tf.cluster.bounds import allreduce_lower_bound
from ddl_tf.cluster.probe import halving_ratios, link_bound_rate
from ddl_tf.cluster.traffic import (
    MODELS,
    allgather_link_bytes,
    expected_link_bytes,
    minimum_link_bytes,
)

__all__ = ["annotate", "best_steps", "evaluate", "ladder_summary", "markdown", "plot"]

ALGOS = ["flat", "ring", "hierarchical", "asa"]
LABELS = {"flat": "MPI_Allreduce", "ring": "ring", "hierarchical": "hierarchical", "asa": "asa"}
BYTES_TOLERANCE = 0.05
BYTES_FROM = 1 << 20  # smaller messages: barriers and headers are a visible share
SCHEDULES = ("ring", "recursive_doubling", "bruck")


def _link_ratios(row: dict, expected: float) -> list[float]:
    link = row["link"]
    return [v / expected for key in ("tx_payload", "rx_payload") for v in link[key]]


def annotate(rows: list[dict], nodes: int, rpn: int, link_bps: float) -> None:
    """Add the bound, ratios and (for counted rows) expected and measured link bytes."""
    for row in rows:
        row["link_bps"] = link_bps
        row["bound_seconds"] = allreduce_lower_bound(
            row["wire_bytes"], nodes=nodes, link_bps=link_bps
        )
        row["ratio_to_bound"] = round(row["seconds"] / row["bound_seconds"], 3)
        fp32 = allreduce_lower_bound(row["bytes"], nodes=nodes, link_bps=link_bps)
        row["ratio_to_fp32_bound"] = round(row["seconds"] / fp32, 3)
        if "link" not in row:
            continue
        algorithm = row["chosen"]
        wire = row["wire_bytes"]
        expected = expected_link_bytes(algorithm, wire, nodes=nodes, ranks_per_node=rpn)
        row["traffic_model"] = MODELS["hierarchical" if "[" in algorithm else algorithm]
        row["expected_link_bytes"] = expected
        row["minimum_link_bytes"] = minimum_link_bytes(wire, nodes=nodes)
        ratios = _link_ratios(row, expected)
        row["link_over_expected"] = [round(min(ratios), 4), round(max(ratios), 4)]
        row["link_over_minimum"] = round(max(ratios) * expected / row["minimum_link_bytes"], 4)
        if algorithm == "asa":  # which Allgatherv schedule did Open MPI run?
            alltoall = rpn * (nodes - 1) / nodes * wire
            row["asa_if_allgather_is"] = {
                s: alltoall
                + allgather_link_bytes(wire, nodes=nodes, ranks_per_node=rpn, schedule=s)
                for s in SCHEDULES
                if s != "recursive_doubling" or (nodes * rpn) & (nodes * rpn - 1) == 0
            }
            row["asa_allgather_matches"] = [
                s
                for s, total in row["asa_if_allgather_is"].items()
                if all(abs(r - 1) <= BYTES_TOLERANCE for r in _link_ratios(row, total))
            ]


def best_steps(rows: list[dict]) -> tuple[dict, dict]:
    """The fastest ``hierarchical[<node>/<world>]`` variant (summed over sizes) and all sums."""
    totals: dict[str, float] = {}
    for row in rows:
        totals[row["algorithm"]] = totals.get(row["algorithm"], 0.0) + row["seconds"]
    best = min(totals, key=totals.get)
    inner, top = best[len("hierarchical[") : -1].split("/")
    return {"node": inner, "world": top}, {k: round(v, 4) for k, v in totals.items()}


def ladder_summary(ladder: list[dict]) -> dict:
    """Halving ratios per algorithm/wire format and of the TCP probe; the link-bound rate.

    The link-bound rate is the fastest from which on halving the rate doubles
    the time of the hierarchical allreduce in every wire format measured.
    """
    out: dict = {}
    keys = sorted({(r["algorithm"], r["compression"]) for p in ladder for r in p["rows"]})
    for algo, comp in keys:
        name = algo if comp == "none" else f"{algo}/{comp}"
        times = {
            p["link_bps"]: r["seconds"]
            for p in ladder
            for r in p["rows"]
            if (r["algorithm"], r["compression"]) == (algo, comp)
        }
        out[name] = [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
            for row in halving_ratios(times)
        ]
        out[name + "_link_bound_bps"] = link_bound_rate(times)
    tcp = {p["link_bps"]: 1 / min(p["tcp_payload_Gbps"].values()) for p in ladder}
    out["tcp"] = [
        {"rate_bps": r["rate_bps"], "ratio": round(r["ratio"], 3), "link_bound": r["link_bound"]}
        for r in halving_ratios(tcp)
    ]
    bound = [v for k, v in out.items() if k.startswith("hierarchical") and k.endswith("_bps")]
    out["link_bound_bps"] = None if None in bound or not bound else min(bound)
    return out


def _table(rows: list[dict]) -> dict:
    return {(r["bytes"], r["algorithm"], r["compression"]): r for r in rows}


def _speedups(t: dict, sizes: list[int]) -> dict:
    out = {}
    for b in sizes:
        if (b, "hierarchical", "fp16") not in t or (b, "hierarchical", "none") not in t:
            continue
        best32 = min(t[(b, a, "none")]["seconds"] for a in ALGOS if (b, a, "none") in t)
        best16 = min(t[(b, a, "fp16")]["seconds"] for a in ALGOS if (b, a, "fp16") in t)
        hier = t[(b, "hierarchical", "none")]["seconds"] / t[(b, "hierarchical", "fp16")]["seconds"]
        out[str(b)] = {"hierarchical": round(hier, 3), "best": round(best32 / best16, 3)}
    return out


def evaluate(main_rows: list[dict], cpu_rows: list[dict]) -> dict:
    """The issue's targets on the link-bound rows, and the same figures at 1 Gbit/s."""
    t = _table(main_rows)
    big = sorted({b for b, a, c in t if b >= 16 << 20 and a == "hierarchical" and c == "none"})
    hier = {str(b): t[(b, "hierarchical", "none")]["ratio_to_bound"] for b in big}
    fp16 = _speedups(t, big)
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
        }
    worst: dict[str, float] = {}
    for row in main_rows + cpu_rows:
        if "link_over_expected" in row and row["bytes"] >= BYTES_FROM:
            low, high = row["link_over_expected"]
            name = row["chosen"]
            worst[name] = max(worst.get(name, 0.0), abs(low - 1), abs(high - 1))
    c = _table(cpu_rows)
    cpu_big = sorted({b for b, a, _ in c if a == "hierarchical"})
    return {
        "hierarchical_ratio_to_bound_ge_16MiB": hier,
        "hierarchical_within_1.15x_of_bound": bool(hier) and all(v <= 1.15 for v in hier.values()),
        "fp32_over_fp16_ge_16MiB": fp16,
        "fp16_1.8x_faster": bool(fp16) and all(v["best"] >= 1.8 for v in fp16.values()),
        "fp16_1.8x_faster_hierarchical": bool(fp16)
        and all(v["hierarchical"] >= 1.8 for v in fp16.values()),
        "link_bytes_worst_deviation_from_expected_ge_1MiB": {
            k: round(v, 4) for k, v in worst.items()
        },
        "link_bytes_within_5pct": {k: v <= BYTES_TOLERANCE for k, v in worst.items()},
        "auto_over_best": auto,
        "at_1gbit": {
            "hierarchical_ratio_to_bound": {
                str(b): c[(b, "hierarchical", "none")]["ratio_to_bound"]
                for b in cpu_big
                if (b, "hierarchical", "none") in c
            },
            "fp32_over_fp16": _speedups(c, cpu_big),
        },
    }


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def _time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def markdown(report: dict) -> str:
    """Tables for a quick look (the docs build makes its own from the JSON)."""
    out = []
    for layout in report["layouts"]:
        scaling = layout["rate_scaling"]
        out.append(f"\n## {layout['layout']}: link-bound rate {layout['link']}\n")
        out.append(
            "| rate | TCP payload Gbit/s | hierarchical 16 MiB | x at half | flat 16 MiB | x at half |"
        )
        out.append("|---|---|---|---|---|---|")
        ratios = {
            a: {r["rate_bps"]: r["ratio"] for r in scaling.get(a, [])}
            for a in ("hierarchical", "flat")
        }
        for point in layout["ladder"]:
            secs = {
                r["algorithm"]: r["seconds"] for r in point["rows"] if r["compression"] == "none"
            }
            tcp = ", ".join(f"{v:.3f}" for v in point["tcp_payload_Gbps"].values())
            cells = [
                f"{_time(secs[a])} | {ratios[a].get(point['link_bps'], float('nan')):.2f}"
                for a in ("hierarchical", "flat")
            ]
            out.append(f"| {point['link']} | {tcp} | " + " | ".join(cells) + " |")
        for name, rows in (
            ("link-bound", layout["rows"]),
            (layout["cpu_link"], layout["cpu_rows"]),
        ):
            out.append(
                f"\n{layout['layout']} at {name}: time (ratio to bound) [link bytes / expected]\n"
            )
            out.append("| size | wire | " + " | ".join(LABELS[a] for a in ALGOS) + " | auto |")
            out.append("|---" * (len(ALGOS) + 3) + "|")
            cell = _table(rows)
            for b, comp in sorted({(r["bytes"], r["compression"]) for r in rows}):
                parts = []
                for a in [*ALGOS, "auto"]:
                    r = cell.get((b, a, comp))
                    if r is None:
                        parts.append("")
                        continue
                    bytes_ = (
                        f" [{r['link_over_expected'][1]:.3f}]" if "link_over_expected" in r else ""
                    )
                    parts.append(f"{_time(r['seconds'])} ({r['ratio_to_bound']:.2f}){bytes_}")
                out.append(f"| {_size(b)} | {comp} | " + " | ".join(parts) + " |")
        out.append(f"\ntargets {layout['layout']}: {layout['targets']}")
    return "\n".join(out)


def plot(report: dict, path: Path) -> None:
    """Time and ratio to the bound per size, per layout, at the link-bound rate (fp16 dashed)."""
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
            for algo in [*ALGOS, "auto"]:
                pts = sorted((r["bytes"], r) for r in rows if r["algorithm"] == algo)
                if not pts:
                    continue
                xs = [b / 2**20 for b, _ in pts]
                label = f"{LABELS.get(algo, algo)}{' fp16' if compression == 'fp16' else ''}"
                top.plot(
                    xs,
                    [r["seconds"] for _, r in pts],
                    style,
                    marker=".",
                    color=colors[algo],
                    label=label,
                )
                bottom.plot(
                    xs,
                    [r["ratio_to_fp32_bound"] for _, r in pts],
                    style,
                    marker=".",
                    color=colors[algo],
                )
        xs = sorted({r["bytes"] for r in layout["rows"]})
        bounds = [
            allreduce_lower_bound(b, nodes=layout["nodes"], link_bps=layout["link_bps"]) for b in xs
        ]
        top.plot([b / 2**20 for b in xs], bounds, ":", color="grey", label="bound (float32)")
        top.set(
            xscale="log",
            yscale="log",
            title=f"{layout['layout']} at {layout['link']}",
            ylabel="seconds",
        )
        bottom.set(
            xscale="log", yscale="log", xlabel="MiB of float32", ylabel="time / float32 bound"
        )
        for y, style in ((1.15, ":"), (1.0, "-")):
            bottom.axhline(y, color="grey", lw=0.8, ls=style)
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("Allreduce across virtual nodes at link-bound rates (fp16 dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
