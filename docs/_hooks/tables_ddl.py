"""The docs' tables of ddl_tf results: allreduce on one host, across virtual nodes, training.

Each function turns one results file into Markdown; see :mod:`results_tables`
for the directive that calls it and what happens to missing keys.
"""

from __future__ import annotations

import tables_cluster  # noqa: F401 - registers the rehearsal-cluster tables
import tables_horovod  # noqa: F401 - registers the Horovod side-by-side tables
from results_tables import (
    MISSING,
    Results,
    fmt_bytes,
    fmt_pct,
    fmt_ratio,
    fmt_seconds,
    fmt_size,
    markdown_table,
    table,
)

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

ORDER = ["mpi4py", "flat", "ring", "asa", "hierarchical", "auto", "engine", "engine-unchecked"]
WIRE = {"none": "float32", "fp16": "fp16", "bf16": "bf16"}
# ddl_tf commit bc2b1c5 (2026-11-22 00:43 UTC): float16 sums accumulate in float32.
FP16_KERNEL_CHANGE = "2026-11-22T00:43:25"


def _layout(r: Results, key: str, value: str) -> tuple[int | None, dict]:
    """The index and entry of ``layouts`` whose ``key`` is ``value``; records a miss."""
    layouts = r.get("layouts")
    for i, layout in enumerate(layouts if isinstance(layouts, list) else []):
        if layout.get(key) == value:
            return i, layout
    r.missing.append(f"layouts[{key}={value}]")
    return None, {}


def _ordered(names) -> list[str]:
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def _busbw(row: dict) -> str:
    value = row.get("busbw_GBps")
    return f" ({value:.2f})" if isinstance(value, float) else ""


# --------------------------------------------------------------------------- one host


@table("allreduce_sizes", "allreduce.json")
def allreduce_sizes(r: Results, layout: str, compression: str = "none") -> str:
    """Median time per algorithm and message size on one layout, bus bandwidth in GB/s."""
    i, _ = _layout(r, "layout", layout)
    if i is None:
        return f"*No layout {layout!r} in `{r.name}`.*"
    rows = [
        row
        for row in r.get(f"layouts.{i}.rows") or []
        if row.get("phase") is None and row.get("compression") == compression
    ]
    algorithms = _ordered(row["algorithm"] for row in rows)
    cells = {(row["bytes"], row["algorithm"]): row for row in rows}
    body = []
    for size in sorted({row["bytes"] for row in rows}):
        line = [fmt_size(size)]
        for algo in algorithms:
            row = cells.get((size, algo))
            line.append(fmt_seconds(row["seconds"]) + _busbw(row) if row else "-")
        body.append(line)
    return markdown_table(["size", *algorithms], body, "l" + "r" * len(algorithms))


@table("allreduce_compression", "allreduce.json")
def allreduce_compression(r: Results) -> str:
    """``auto`` with float32, fp16 and bf16 on the wire (conversions included), per layout."""
    header, columns = ["size"], []
    for i, layout in enumerate(r.get("layouts") or []):
        kinds = {
            row.get("compression")
            for row in layout.get("rows", [])
            if row.get("algorithm") == "auto"
        }
        for kind in ("none", "fp16", "bf16"):
            if kind in kinds:
                header.append(f"{layout.get('layout')}: {WIRE[kind]}")
                columns.append((i, kind))
    cells, sizes = {}, set()
    for i, kind in columns:
        for row in r.get(f"layouts.{i}.rows") or []:
            if (
                row.get("phase") is None
                and row.get("algorithm") == "auto"
                and row.get("compression") == kind
            ):
                cells[(row["bytes"], i, kind)] = row["seconds"]
                sizes.add(row["bytes"])
    body = [
        [fmt_size(size), *(fmt_seconds(cells.get((size, i, kind), MISSING)) for i, kind in columns)]
        for size in sorted(sizes)
    ]
    text = markdown_table(header, body, "l" + "r" * len(columns))
    created = r.get("created")
    if isinstance(created, str) and created < FP16_KERNEL_CHANGE:
        text += (
            f"\n\nThese fp16 rows were measured on {created}, before float16 sums moved to "
            "ddl_tf's float32-accumulating operation (commit bc2b1c5); rerun "
            "`python benchmarks/bench_allreduce.py` for current figures."
        )
    return text


@table("allreduce_targets", "allreduce.json")
def allreduce_targets(r: Results) -> str:
    """``auto`` over ``mpi4py`` alone (interleaved A/B) per size and layout, and the verdicts."""
    layouts = r.get("layouts") or []
    sizes = sorted(
        {
            int(size)
            for layout in layouts
            for size in (layout.get("targets", {}).get("auto_vs_mpi_ge_1MiB") or {})
        }
    )
    header = ["auto / mpi4py", *(layout.get("layout") for layout in layouts)]
    body = [
        [
            "8 KiB",
            *(
                fmt_ratio(r.get(f"layouts.{i}.targets.auto_8KiB_latency_ratio"), 3)
                for i in range(len(layouts))
            ),
        ]
    ]
    for size in sizes:
        body.append(
            [
                fmt_size(size),
                *(
                    fmt_ratio(r.get(["layouts", i, "targets", "auto_vs_mpi_ge_1MiB", str(size)]), 3)
                    for i in range(len(layouts))
                ),
            ]
        )
    met = lambda key: " / ".join(  # noqa: E731
        {True: "met", False: "not met"}.get(r.get(["layouts", i, "targets", key]), "missing")
        for i in range(len(layouts))
    )
    return markdown_table(header, body, "l" + "r" * len(layouts)) + (
        f"\n\n`auto` no slower than MPI_Allreduce (5% allowed) at >= 1 MiB: {met('auto_no_slower_ge_1MiB')}; "
        f"8 KiB latency within 1.2x: {met('auto_8KiB_within_1.2x')} (layouts in the order of the columns)."
    )


@table("adasum_cost", "adasum.json")
def adasum_cost(r: Results) -> str:
    """``engine.allreduce`` time with Average and with Adasum per size and layout, and the ratio."""
    layouts = r.get("layouts") or []
    header = ["size"]
    for layout in layouts:
        header += [f"{layout.get('layout')}: Average", "Adasum", "ratio"]
    sizes = sorted({row["bytes"] for layout in layouts for row in layout.get("rows") or []})
    body = []
    for size in sizes:
        line = [fmt_size(size)]
        for i, layout in enumerate(layouts):
            cells = {
                row["algorithm"]: row["seconds"]
                for row in layout.get("rows") or []
                if row["bytes"] == size
            }
            line += [
                fmt_seconds(cells.get("average", MISSING)),
                fmt_seconds(cells.get("adasum", MISSING)),
                fmt_ratio(r.get(["layouts", i, "adasum_over_average", str(size)]), 2),
            ]
        body.append(line)
    return markdown_table(header, body, "l" + "r" * (len(header) - 1))


@table("adasum_load", "adasum.json")
def adasum_load(r: Results) -> str:
    """Load average (1, 5, 15 minutes) before and after each layout of the Adasum run."""
    return allreduce_load(r)


@table("allreduce_load", "allreduce.json")
def allreduce_load(r: Results) -> str:
    """Load average (1, 5, 15 minutes) before and after each layout's run."""
    body = [
        [
            layout.get("layout"),
            _load(layout.get("load_average_before")),
            _load(layout.get("load_average_after")),
        ]
        for layout in r.get("layouts") or []
    ]
    return markdown_table(["layout", "load average before", "after"], body)


def _load(values) -> str:
    return " ".join(f"{v:.2f}" for v in values) if isinstance(values, list) else "missing"


# --------------------------------------------------------------------------- virtual nodes


@table("policy", "cluster_allreduce*.json", "*auto_policy.json", "allreduce.json")
def policy(r: Results) -> str:
    """The algorithm per size range that a benchmark learned for ``auto``, per table."""
    for key in ("learned_policy", "derived_auto_policy"):
        if key in r.data:
            policy = r.get(key)
            break
    else:
        policy = r.data
    if not isinstance(policy, dict):
        return "missing"
    body = []
    for key, value in policy.items():
        if key == "steps":
            continue
        ranges, low = [], None
        for limit, algo in value:  # [upper bound inclusive (None: no bound), algorithm]
            if limit is None:
                span = "all sizes" if low is None else f"over {fmt_size(low)}"
            else:
                span = (
                    f"up to {fmt_size(limit)}"
                    if low is None
                    else f"over {fmt_size(low)} to {fmt_size(limit)}"
                )
            ranges.append(f"{span}: {algo}")
            low = limit
        steps = policy.get("steps", {}).get(key.split("/")[0])
        body.append(
            [
                f"`{key}`",
                "; ".join(ranges),
                ", ".join(f"{k} {v}" for k, v in steps.items()) if steps else "",
            ]
        )
    return markdown_table(
        ["table", "algorithm by message size (wire bytes)", "hierarchical steps"], body
    )


@table("cluster_training", "cluster_training.json")
def cluster_training(r: Results) -> str:
    """Keras training across virtual nodes: step time and allreduce share per variant."""
    header = [
        "allreduce",
        "wire",
        "step",
        "share in allreduce",
        "images/s (all ranks)",
        "weights identical on all ranks",
    ]
    body = []
    for i, _ in enumerate(r.get("variants") or []):
        get = lambda key, i=i: r.get(f"variants.{i}.{key}")  # noqa: E731
        body.append(
            [
                get("algorithm"),
                WIRE.get(get("compression"), get("compression")),
                fmt_seconds(get("step_seconds")),
                fmt_pct(get("comm_share"), ".0%"),
                f"{get('images_per_second'):.0f}",
                {True: "yes", False: "no"}.get(get("weights_identical_on_all_ranks"), "missing"),
            ]
        )
    ratios = r.get("ratios")
    text = (
        ", ".join(f"{k} {v}" for k, v in ratios.items()) if isinstance(ratios, dict) else "missing"
    )
    return markdown_table(header, body) + (
        f"\n\nModel: {r.get('model')}. Cluster: {r.get('cluster')}. Method: {r.get('method')} Ratios: {text}."
    )


@table("elastic_cost", "elastic.json")
def elastic_cost(r: Results) -> str:
    """Step time of elastic jobs against the same fixed job, side by side (2 ranks, one host)."""
    configs = (
        ("fixed", "fixed job, default transports"),
        ("fixed_tcp", "fixed job, ob1 + tcp,self"),
        ("elastic_commit_1", "elastic, commit every batch"),
        ("elastic_commit_10", "elastic, commit every 10 batches"),
    )
    header = ["model", *(label for _, label in configs)]
    rows = []
    models = r.get("cost")
    for model in models if isinstance(models, dict) else []:
        cells = []
        for key, _ in configs:
            step = r.get(f"cost.{model}.{key}.step_ms")
            ratio = r.get(f"cost.{model}.{key}.vs_fixed")
            cells.append(f"{step} ms ({fmt_ratio(ratio)}x)")
        rows.append(
            [
                {"mlp": "MLP (Horovod benchmark)", "mobilenet": "MobileNetV2 64x64"}.get(
                    model, model
                ),
                *cells,
            ]
        )
    note = (
        "Median step time of epochs 2-3 on rank 0, measured on this machine (CPU, 2 ranks on "
        "one host); ratios against the fixed job with default transports, from runs "
        "interleaved in the same minutes."
    )
    return markdown_table(header, rows, "lrrrr") + "\n\n" + note


SHARDED = ("optimizer", "gradients")
"""The sharded variants of sharding.json, beside replicated (``None``)."""


@table("sharding", "sharding.json")
def sharding(r: Results) -> str:
    """ZeRO-1/2 against replicated training on 2 and 4 ranks: state, step time, step peak, bits."""
    header = [
        "ranks",
        "optimizer state per rank, replicated / sharded",
        "step time over replicated, ZeRO-1 / ZeRO-2",
        "a step's peak above resting memory, replicated / ZeRO-1 / ZeRO-2 (largest rank)",
        "weights bitwise equal to replicated, ZeRO-1 / ZeRO-2",
    ]
    rows = []
    counts = r.get("by_ranks")
    for n in sorted(counts if isinstance(counts, dict) else {}, key=int):
        row = f"by_ranks.{n}"
        state = [
            fmt_bytes(r.get(f"{row}.state_bytes_per_rank.{v}.0")) for v in ("None", "optimizer")
        ]
        times = [fmt_ratio(r.get(f"{row}.step_time_over_replicated.{v}"), 3) for v in SHARDED]
        peaks = r.get(f"{row}.step_peak_bytes_above_resting_per_rank")
        peak = [
            fmt_bytes(max(peaks[v])) if isinstance(peaks, dict) and v in peaks else "missing"
            for v in ("None", *SHARDED)
        ]
        bits = [
            {True: "yes", False: "no"}.get(r.get(f"{row}.weights_bitwise_equal.{v}"), "missing")
            for v in SHARDED
        ]
        rows.append([n, " / ".join(state), " / ".join(times), " / ".join(peak), " / ".join(bits)])
    return markdown_table(header, rows, "rllll")
