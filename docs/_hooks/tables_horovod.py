"""The docs' tables of ddl_tf against Horovod 0.28.1 (``horovod_side_by_side.json``).

The file is written by ``benchmarks/bench_horovod.py``: per scenario (2 ranks
on one host; 2 rehearsal-cluster nodes) the allreduce rows of both libraries,
eager and in a ``tf.function``, and the training step with each library's
``DistributedGradientTape``. Imported by ``tables_ddl``.
"""

from __future__ import annotations

from results_tables import Results, fmt_ratio, fmt_seconds, fmt_size, markdown_table, table

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

MODES = ("eager", "graph")


def _scenario(r: Results, name: str) -> tuple[int | None, dict]:
    scenarios = r.get("scenarios")
    for i, scenario in enumerate(scenarios if isinstance(scenarios, list) else []):
        if scenario.get("scenario") == name:
            return i, scenario
    r.missing.append(f"scenarios[scenario={name}]")
    return None, {}


def _where(scenario: dict) -> str:
    cluster = scenario.get("cluster")
    if isinstance(cluster, dict):
        return (
            f"{cluster.get('nodes')} rehearsal nodes x {cluster.get('ranks_per_node')} rank, "
            f"links {cluster.get('link')}"
        )
    return "2 ranks on one host (shared memory)"


@table("horovod_allreduce", "horovod_side_by_side.json")
def horovod_allreduce(r: Results, scenario: str, dtype: str = "float32") -> str:
    """Allreduce time per size of both libraries, eager and in-graph, and ddl_tf / Horovod."""
    i, found = _scenario(r, scenario)
    if i is None:
        return f"*No scenario {scenario!r} in `{r.name}`.*"
    rows = [row for row in r.get(f"scenarios.{i}.allreduce.rows") or [] if row["dtype"] == dtype]
    cells = {(row["bytes"], row["library"], row["mode"]): row for row in rows}
    body = []
    for size in sorted({row["bytes"] for row in rows}):
        line = [fmt_size(size)]
        for mode in MODES:
            hvd, ddl = cells.get((size, "horovod", mode)), cells.get((size, "ddl_tf", mode))
            if hvd is None or ddl is None:
                line += ["-", "-", "-"]
                continue
            line += [
                fmt_seconds(hvd["seconds"]),
                fmt_seconds(ddl["seconds"]),
                f"**{ddl['seconds'] / hvd['seconds']:.2f}**",
            ]
        floors = [cells.get((size, f"mpi_in_{lib}_jobs", "eager")) for lib in ("horovod", "ddl_tf")]
        if any(floors):
            line.append(" / ".join(fmt_seconds(f["seconds"]) if f else "-" for f in floors))
        body.append(line)
    wrong = [
        f"{fmt_size(x['bytes'])} {x['library']}/{x['mode']}" for x in rows if x["correct"] is False
    ]
    skipped = [
        fmt_size(s["bytes"])
        for s in r.get(f"scenarios.{i}.allreduce.skipped") or []
        if s["dtype"] == dtype
    ]
    header = [
        "size",
        "Horovod eager",
        "ddl_tf eager",
        "ddl_tf / Horovod",
        "Horovod tf.function",
        "ddl_tf tf.function",
        "ddl_tf / Horovod",
    ]
    if any(len(line) == len(header) + 1 for line in body):
        header.append("bare MPI_Allreduce in Horovod / ddl_tf jobs")
        body = [line + ["-"] * (len(header) - len(line)) for line in body]
    note = f"\n\n{_where(found)}, {dtype}; every result checked against the exact sum: " + (
        "all equal" if not wrong else "NOT equal: " + ", ".join(wrong)
    )
    if skipped:
        note += f"; skipped (time budget): {', '.join(skipped)}"
    return markdown_table(header, body, "l" + "r" * (len(header) - 1)) + note + "."


@table("horovod_training", "horovod_side_by_side.json")
def horovod_training(r: Results) -> str:
    """Training step with each library's DistributedGradientTape, per scenario and model."""
    body = []
    for i, scenario in enumerate(r.get("scenarios") or []):
        for model, t in (r.get(f"scenarios.{i}.training") or {}).items():
            steps = t.get("step_seconds", {})
            hvd, ddl, local = steps.get("horovod"), steps.get("ddl_tf"), steps.get("local")
            identical = t.get("weights_identical_across_ranks", {})
            body.append(
                [
                    _where(scenario),
                    model,
                    f"{t.get('parameters', 0) / 1e6:.1f} M ({t.get('gradient_bytes', 0) / 2**20:.0f} MiB)",
                    t.get("batch_per_rank"),
                    fmt_seconds(local)
                    + (
                        f" ({fmt_seconds(steps['local_in_horovod_jobs'])} / "
                        f"{fmt_seconds(steps['local_in_ddl_tf_jobs'])})"
                        if "local_in_horovod_jobs" in steps and "local_in_ddl_tf_jobs" in steps
                        else ""
                    ),
                    fmt_seconds(hvd),
                    fmt_seconds(ddl),
                    f"**{fmt_ratio(ddl / hvd if hvd else None)}**",
                    f"{fmt_ratio(_over(hvd, steps.get('local_in_horovod_jobs', local)))} / "
                    f"{fmt_ratio(_over(ddl, steps.get('local_in_ddl_tf_jobs', local)))}",
                    ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in identical.items()),
                ]
            )
    header = [
        "where",
        "model",
        "parameters (float32 gradients)",
        "batch per rank",
        "local step, no communication (in Horovod / ddl_tf jobs)",
        "Horovod step",
        "ddl_tf step",
        "ddl_tf / Horovod",
        "communication overhead over the local step of the same jobs: Horovod / ddl_tf",
        "weights identical on all ranks",
    ]
    return markdown_table(header, body, "llrrrrrrrl")


def _over(step: float | None, local: float | None) -> float | None:
    """The step's time over the local step's, as a fraction (each from the same jobs)."""
    return (step - local) / local if step is not None and local else None


@table("horovod_targets", "horovod_side_by_side.json")
def horovod_targets(r: Results) -> str:
    """The targets per scenario: allreduce >= 1 MiB and training step, ddl_tf <= 1.0x Horovod."""
    body = []
    for i, scenario in enumerate(r.get("scenarios") or []):
        t = r.get(f"scenarios.{i}.targets") or {}
        slower = t.get("allreduce_ge_1MiB_where_slower") or []
        ratios = r.get(f"scenarios.{i}.allreduce.ratios") or []
        big = [x for x in ratios if x["bytes"] >= 1 << 20]
        best = min((x["ddl_over_horovod"] for x in big), default=None)
        per_dtype = {
            dtype: [x["ddl_over_horovod"] for x in big if x["dtype"] == dtype]
            for dtype in ("float32", "float16")
        }
        phases = scenario.get("other_jobs_before_each_phase", {})
        busy = ", ".join(f"{k} {v.get('cpu_busy', 0):.0%}" for k, v in phases.items())
        body.append(
            [
                _where(scenario),
                f"{fmt_ratio(best)} to {fmt_ratio(t.get('allreduce_ge_1MiB_ddl_over_horovod_max'))}",
                "; ".join(
                    f"{dtype} {fmt_ratio(min(v))} to {fmt_ratio(max(v))}"
                    for dtype, v in per_dtype.items()
                    if v
                ),
                f"{len(slower)} of {len(big)}",
                "met" if t.get("allreduce_ge_1MiB_met") else "not met",
                ", ".join(
                    f"{k} {v:.2f}"
                    for k, v in (t.get("training_step_ddl_over_horovod") or {}).items()
                ),
                "met" if t.get("training_step_met") else "not met",
                busy,
            ]
        )
    header = [
        "where",
        "allreduce >= 1 MiB: ddl_tf / Horovod, best to worst",
        "per dtype",
        "configurations where ddl_tf is slower",
        "allreduce target",
        "training step: ddl_tf / Horovod",
        "training target",
        "CPU busy with other jobs before each phase",
    ]
    return (
        markdown_table(header, body)
        + f"\n\nCommand: `{r.get('command')}`; peer: `{r.get('peer')}`. Method: {r.get('method')}."
    )
