"""The docs' tables of the rehearsal-cluster allreduce benchmark (``cluster_allreduce.json``).

The file is written by ``benchmarks/bench_cluster_allreduce.py``: per layout
(nodes x ranks per node) a rate ladder (the same 16 MiB allreduce at 1 Gbit/s
down to 62.5 Mbit/s, to find where the links and not the CPUs limit it), the
rows at that link-bound rate, the rows at 1 Gbit/s (``cpu_rows``), the bytes
that crossed each node's link and the targets. Imported by ``tables_ddl``.
"""

from __future__ import annotations

from results_tables import (
    MISSING,
    Results,
    fmt_ratio,
    fmt_seconds,
    fmt_size,
    markdown_table,
    table,
)

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

ORDER = ["flat", "ring", "asa", "hierarchical", "auto"]
WIRE = {"none": "float32", "fp16": "fp16"}
RATE_NAMES = {"62500kbit": "62.5mbit"}
BYTES_FROM = 1 << 20  # the byte check starts here (smaller: barriers and headers show)


def _layout(r: Results, name: str) -> tuple[int | None, dict]:
    layouts = r.get("layouts")
    for i, layout in enumerate(layouts if isinstance(layouts, list) else []):
        if layout.get("layout") == name:
            return i, layout
    r.missing.append(f"layouts[layout={name}]")
    return None, {}


def _rate(link) -> str:
    return RATE_NAMES.get(link, link) if isinstance(link, str) else "missing"


def _ordered(names) -> list[str]:
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def _load(values) -> str:
    return f"{values[0]:.2f}" if isinstance(values, list) and values else "missing"


@table("cluster_layouts", "cluster_allreduce*.json")
def cluster_layouts(r: Results) -> str:
    """Per layout: ranks, what ddl_tf saw, the link-bound rate found, steps, load, time."""
    header = [
        "layout",
        "ranks",
        "ddl_tf sees",
        "link-bound rate (from the ladder)",
        "learned hierarchical steps",
        "CPU busy with other jobs before each phase (ladder, main, 1 Gbit/s), waited",
        "minutes",
    ]
    body = []
    for i, layout in enumerate(r.get("layouts") or []):
        steps = r.get(f"layouts.{i}.steps.learned")
        phases = r.get(f"layouts.{i}.other_jobs_before_each_phase")
        loads = (
            ", ".join(
                f"{phases[p]['cpu_busy']:.0%}" if p in phases else "missing"
                for p in ("ladder", "main", "cpu")
            )
            + f" (load {_load(phases.get('main', {}).get('load_average'))}), "
            + f"{sum(v.get('waited_seconds', 0) for v in phases.values()):.0f} s"
            if isinstance(phases, dict)
            else "missing"
        )
        found = r.get(f"layouts.{i}.rate_scaling.link_bound_bps")
        seconds = r.get(f"layouts.{i}.seconds")
        body.append(
            [
                layout.get("layout"),
                r.get(f"layouts.{i}.nodes") * r.get(f"layouts.{i}.ranks_per_node"),
                str(layout.get("topology", "missing")).splitlines()[0],
                _rate(r.get(f"layouts.{i}.link"))
                + ("" if found else " (none passed; the slowest rate used)"),
                ", ".join(f"{k} {v}" for k, v in steps.items())
                if isinstance(steps, dict)
                else "missing",
                loads,
                f"{seconds / 60:.1f}" if isinstance(seconds, int | float) else "missing",
            ]
        )
    return markdown_table(header, body) + (
        f"\n\nLinks: {r.get('cluster.link')}; MTU {r.get('cluster.mtu')}; latency "
        f"{r.get('cluster.latency')}. Link-bound test: {r.get('link_bound_test')}. "
        f"Command: `{r.get('command')}`."
    )


@table("cluster_ladder", "cluster_allreduce*.json")
def cluster_ladder(r: Results, layout: str) -> str:
    """The rate ladder of one layout: TCP payload, 16 MiB allreduce times, x at half the rate."""
    i, _ = _layout(r, layout)
    if i is None:
        return f"*No layout {layout!r} in `{r.name}`.*"
    scaling = r.get(f"layouts.{i}.rate_scaling")
    names = ["hierarchical", "hierarchical/fp16", "flat"]
    half = {
        n: {row["rate_bps"]: row["ratio"] for row in scaling.get(n, [])}
        if isinstance(scaling, dict)
        else {}
        for n in [*names, "tcp"]
    }
    body = []
    for point in r.get(f"layouts.{i}.ladder") or []:
        bps = point.get("link_bps")
        tcp = point.get("tcp_payload_Gbps") or {}
        cells = {
            (row["algorithm"] if row["compression"] == "none" else f"{row['algorithm']}/fp16"): row
            for row in point.get("rows", [])
        }
        line = [
            _rate(point.get("link")),
            ", ".join(f"{v * 1e3:.0f}" for v in tcp.values()) or "missing",
            fmt_ratio(half["tcp"].get(bps), 2) if bps in half["tcp"] else "-",
        ]
        for name in names:
            row = cells.get(name)
            if row is None:
                line += ["-", "-"]
                continue
            ratio = half[name].get(bps)
            line += [
                f"{fmt_seconds(row['seconds'])} ({fmt_ratio(row.get('ratio_to_bound', MISSING))})",
                fmt_ratio(ratio) if ratio is not None else "-",
            ]
        body.append(line)
    header = [
        "link rate",
        "TCP payload, both directions at once (Mbit/s)",
        "TCP x at half",
        "hierarchical 16 MiB (/ bound)",
        "x at half",
        "hierarchical fp16 (/ fp16 bound)",
        "x at half",
        "MPI_Allreduce (/ bound)",
        "x at half",
    ]
    return markdown_table(header, body, "lrrrrrrrr")


def _rows(r: Results, i: int, which: str) -> list[dict]:
    return r.get(f"layouts.{i}.{which}") or []


@table("cluster_sizes", "cluster_allreduce*.json")
def cluster_sizes(r: Results, layout: str, compression: str = "none", rows: str = "rows") -> str:
    """Time per algorithm and size on one layout (``rows``: link-bound; ``cpu_rows``: 1 Gbit/s)."""
    i, _ = _layout(r, layout)
    if i is None:
        return f"*No layout {layout!r} in `{r.name}`.*"
    picked = [row for row in _rows(r, i, rows) if row.get("compression") == compression]
    algorithms = _ordered(row["algorithm"] for row in picked)
    cells = {(row["bytes"], row["algorithm"]): row for row in picked}
    body = []
    for size in sorted({row["bytes"] for row in picked}):
        bound = next(row.get("bound_seconds") for row in picked if row["bytes"] == size)
        line = [fmt_size(size), fmt_seconds(bound)]
        for algo in algorithms:
            row = cells.get((size, algo))
            if not row:
                line.append("-")
                continue
            chose = f", {row['chosen']}" if algo == "auto" else ""
            line.append(
                f"{fmt_seconds(row['seconds'])} ({fmt_ratio(row.get('ratio_to_bound', MISSING))}{chose})"
            )
        body.append(line)
    names = [
        "MPI_Allreduce (flat)" if a == "flat" else "auto (/ bound, chose)" if a == "auto" else a
        for a in algorithms
    ]
    link = picked[0].get("link_bps") if picked else None
    note = f"\n\nAt {link / 1e6:g} Mbit/s per node and direction, {WIRE.get(compression)} on the wire; cells: time (time / bound)."
    skipped = [
        s
        for s in r.get(f"layouts.{i}.{'skipped' if rows == 'rows' else 'cpu_skipped'}") or []
        if s.get("compression") == compression
    ]
    if skipped:
        note += " Skipped (predicted to overrun the time budget): " + ", ".join(
            f"{fmt_size(s['bytes'])} (~{s['predicted_s']:.0f} s)" for s in skipped
        )
    return markdown_table(["size", "bound", *names], body, "lr" + "r" * len(algorithms)) + note


@table("cluster_bytes", "cluster_allreduce*.json")
def cluster_bytes(r: Results, layout: str) -> str:
    """Bytes that crossed each node's link per allreduce: measured, expected, minimum."""
    i, _ = _layout(r, layout)
    if i is None:
        return f"*No layout {layout!r} in `{r.name}`.*"
    body = []
    rows = [
        row
        for row in _rows(r, i, "rows")
        if "link" in row and row["bytes"] >= BYTES_FROM and row["algorithm"] != "auto"
    ]
    for row in sorted(
        rows, key=lambda x: (x["bytes"], x["compression"], ORDER.index(x["algorithm"]))
    ):
        link = row["link"]
        payload = link["tx_payload"] + link["rx_payload"]
        low, high = row.get("link_over_expected", [MISSING, MISSING])
        matches = row.get("asa_allgather_matches")
        body.append(
            [
                fmt_size(row["bytes"]),
                WIRE.get(row["compression"], row["compression"]),
                row["algorithm"],
                f"{min(payload) / 2**20:.3f} to {max(payload) / 2**20:.3f}",
                f"{row.get('expected_link_bytes', 0) / 2**20:.3f}",
                f"{row.get('minimum_link_bytes', 0) / 2**20:.3f}",
                f"{fmt_ratio(low, 4)} to {fmt_ratio(high, 4)}",
                fmt_ratio(row.get("link_over_minimum"), 3),
                ", ".join(matches) if matches else "",
            ]
        )
    header = [
        "size",
        "wire",
        "algorithm",
        "measured per node, sent and received (MiB)",
        "expected (MiB)",
        "minimum 2(N-1)/N W (MiB)",
        "measured / expected",
        "measured / minimum",
        "asa: Allgatherv schedules that fit within 5%",
    ]
    return markdown_table(header, body, "llrrrrrrl") + (f"\n\nCounting: {r.get('link_bytes')}.")


@table("cluster_targets", "cluster_allreduce*.json")
def cluster_targets(r: Results) -> str:
    """The targets per layout at its link-bound rate, and the same figures at 1 Gbit/s."""
    header = [
        "layout",
        "rate",
        "hierarchical / bound (>= 16 MiB)",
        "float32 / fp16, hierarchical",
        "float32 / fp16, best vs best",
        "link bytes, worst |measured / expected - 1| (>= 1 MiB)",
        "at 1 Gbit/s: hierarchical / bound",
        "at 1 Gbit/s: float32 / fp16 (hierarchical)",
    ]
    body = []
    for i, layout in enumerate(r.get("layouts") or []):
        t = r.get(f"layouts.{i}.targets")
        if not isinstance(t, dict):
            body.append([layout.get("layout"), "missing"] + ["missing"] * 6)
            continue
        fp16 = t.get("fp32_over_fp16_ge_16MiB", {})
        cpu = t.get("at_1gbit", {})
        body.append(
            [
                layout.get("layout"),
                _rate(layout.get("link")),
                _per_size(t.get("hierarchical_ratio_to_bound_ge_16MiB")),
                _per_size({k: v["hierarchical"] for k, v in fp16.items()}),
                _per_size({k: v["best"] for k, v in fp16.items()}),
                ", ".join(
                    f"{k} {v:.1%}"
                    for k, v in t.get(
                        "link_bytes_worst_deviation_from_expected_ge_1MiB", {}
                    ).items()
                ),
                _per_size(cpu.get("hierarchical_ratio_to_bound")),
                _per_size({k: v["hierarchical"] for k, v in cpu.get("fp32_over_fp16", {}).items()}),
            ]
        )
    layouts = r.get("layouts") or []
    verdicts = []
    for key, label in (
        ("hierarchical_within_1.15x_of_bound", "hierarchical within 1.15x of the bound"),
        ("fp16_1.8x_faster", "fp16 1.8x faster than float32"),
    ):
        per_layout = ", ".join(
            f"{layout.get('layout')} "
            + {True: "met", False: "not met"}.get(r.get(["layouts", i, "targets", key]), "missing")
            for i, layout in enumerate(layouts)
        )
        verdicts.append(f"{label}: {per_layout}")
    for i, layout in enumerate(layouts):
        within = r.get(f"layouts.{i}.targets.link_bytes_within_5pct")
        if isinstance(within, dict):
            bad = [k for k, v in within.items() if not v]
            verdicts.append(
                f"{layout.get('layout')} link bytes within 5% of expected: "
                + ("all algorithms" if not bad else "all but " + ", ".join(bad))
            )
    return markdown_table(header, body) + "\n\nTargets: " + "; ".join(verdicts) + "."


def _per_size(values) -> str:
    if not isinstance(values, dict) or not values:
        return "missing"
    return ", ".join(f"{fmt_size(int(size))}: {fmt_ratio(v)}" for size, v in values.items())
