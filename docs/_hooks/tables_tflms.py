"""The docs' tables of tflms results: capacity, simulator fidelity, defaults, rewrite speed, demo.

Each function turns one results file into Markdown; see :mod:`results_tables`
for the directive that calls it and what happens to missing keys.
"""

from __future__ import annotations

import dataclasses

import tables_anchors  # noqa: F401 - registers the real-GPU anchor tables
import tables_capacity  # registers the transformer capacity table; recompute_only cells
from results_tables import (
    MISSING,
    Results,
    fmt_bytes,
    fmt_pct,
    fmt_ratio,
    fmt_seconds,
    markdown_table,
    table,
)

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

GIB = 1 << 30


def _options(options) -> str:
    if not isinstance(options, dict):
        return "missing"
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"


# --------------------------------------------------------------------------- capacity


@table("capacity", "capacity.json")
def capacity(r: Results) -> str:
    """Largest batch / cube without and with LMS on the realistic V100-16GB, both simulators."""
    header = [
        "model (unit)",
        "without LMS (tensors only)",
        "with LMS: best plan",
        "PCIe3 (overhead)",
        "NVLink2 (overhead)",
        "ratio",
        "Grappler: without / with LMS (ratio)",
        "first 2x-oversubscribed size: PCIe3 / NVLink2 overhead",
        "recompute only, no copies (ratio, overhead)",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        model = models[name]
        cells = []
        for link in ("pcie3", "nvlink2"):
            size = r.get(f"models.{name}.with_lms.{link}.ours")
            overhead = r.get(f"models.{name}.with_lms.{link}.at_ours.{link}.overhead")
            cells.append(f"{size} ({fmt_pct(overhead)})")
        agrees = r.get(f"models.{name}.with_lms.best.grappler_fits")
        best = (
            f"{r.get(f'models.{name}.with_lms.best.size')} "
            f"({r.get(f'models.{name}.with_lms.best.plan')})"
            + ("" if agrees is True else "; Grappler: does not fit")
        )
        over = model.get("oversubscribed_2x", {})
        fits = [
            r.get(f"models.{name}.oversubscribed_2x.{link}.fits") for link in ("pcie3", "nvlink2")
        ]
        if any(fits):
            at_2x = " / ".join(
                fmt_pct(over[link].get("overhead")) if over[link].get("fits") else "does not fit"
                for link in ("pcie3", "nvlink2")
            )
        else:
            at_2x = "no plan fits"
        rows.append(
            [
                f"{model.get('description', name)} ({model.get('unit', 'size')})",
                f"{r.get(f'models.{name}.without_lms.ours')} "
                f"({r.get(f'models.{name}.without_lms.tensors_only')})",
                best,
                *cells,
                f"{fmt_ratio(r.get(f'summary.{name}.ratio_ours'))}x ({r.get(f'summary.{name}.ratio_is')})",
                f"{r.get(f'models.{name}.without_lms.grappler')} / "
                f"{r.get(f'models.{name}.with_lms.grappler.size')} "
                f"({fmt_ratio(r.get(f'summary.{name}.ratio_grappler'))}x)",
                f"{over.get('size', MISSING)}: {at_2x}",
                tables_capacity.recompute_only(r, f"models.{name}.recompute_only", "size"),
            ]
        )
    return markdown_table(header, rows)


@table("capacity_plans", "capacity.json")
def capacity_plans(r: Results) -> str:
    """The peak of every plan tried at the largest size with LMS: the best one decides."""
    plans = r.get("plans_tried")
    names = list(plans) if isinstance(plans, dict) else []
    header = ["model", "size", *names]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        peaks = r.get(f"models.{name}.with_lms.best.peaks_of_every_plan")
        winner = r.get(f"models.{name}.with_lms.best.plan")
        cells = [
            (fmt_bytes(peaks.get(k)) + (" (best)" if k == winner else ""))
            if isinstance(peaks, dict)
            else "missing"
            for k in names
        ]
        rows.append([name, r.get(f"models.{name}.with_lms.best.size"), *cells])
    return markdown_table(header, rows)


@table("capacity_tuned_grappler", "capacity.json")
def capacity_tuned_grappler(r: Results) -> str:
    """Plans tuned with the defaults (10% margin) against the device, by us and by Grappler."""
    header = [
        "model",
        "size",
        "tuned plan's peak (ours)",
        "Grappler's (same terms)",
        "fits: ours / Grappler",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        for row in r.get(f"models.{name}.tuned_in_grappler") or []:
            if not row.get("feasible"):
                rows.append([name, row["size"], "no plan fits with the margin", "", ""])
                continue
            rows.append(
                [
                    name,
                    row["size"],
                    fmt_bytes(row["peak_bytes"]),
                    f"{fmt_bytes(row['grappler_peak_bytes'])} ({fmt_pct(row['grappler_over_ours'], '+.1%')})",
                    f"{_yes(row['within_budget_ours'])} / {_yes(row['within_budget_grappler'])}",
                ]
            )
    return markdown_table(header, rows)


def _yes(value) -> str:
    return {True: "yes", False: "no"}.get(value, "missing") if value is not MISSING else "missing"


@table("fidelity", "simulator_fidelity.json")
def fidelity(r: Results) -> str:
    """tflms.simulate's device peak against Grappler's, per model and plan."""
    header = [
        "model",
        "batch",
        "plan",
        "swaps / recomputed / order edges",
        "Grappler peak",
        "ours, Grappler's conventions",
        "difference",
        "ours on Grappler's schedule",
        "ours, TensorFlow's conventions",
        "tensors sized differently",
    ]
    rows = []
    for i, _ in enumerate(r.get("rows") or []):
        cell = lambda key, i=i: r.get(f"rows.{i}.{key}")  # noqa: E731
        grappler = cell("grappler_peak_bytes")
        schedule = cell("ours_on_grappler_schedule_bytes")
        rows.append(
            [
                cell("model"),
                cell("batch"),
                cell("plan"),
                f"{cell('swaps')} / {cell('recomputes')} / {cell('order_edges')}",
                fmt_bytes(grappler),
                fmt_bytes(cell("ours_bytes")),
                fmt_pct(cell("relative_error"), "+.1%"),
                f"{fmt_bytes(schedule)} ({_diff(schedule, grappler)})",
                fmt_bytes(cell("ours_tensorflow_bytes")),
                cell("size_mismatches"),
            ]
        )
    summary = (
        f"Largest difference from Grappler: {fmt_pct(r.get('max_abs_relative_error'), '.1%')} "
        f"(tolerance {fmt_pct(r.get('tolerance'), '.0%')}; within: "
        f"{_yes(r.get('within_tolerance'))}). Device {r.get('device')}, link {r.get('link')}."
    )
    return markdown_table(header, rows, "llllrrrrrr") + "\n\n" + summary


@table("cpu_judge", "simulator_fidelity.json")
def cpu_judge(r: Results) -> str:
    """Measured CPU allocator peaks against tflms.simulate, per model."""
    header = [
        "model",
        "batch",
        "measured peak (median, range over processes)",
        "FirstReady, exact",
        "FirstReady, BFC",
        "measured order, exact",
        "measured order, BFC",
    ]
    rows = []
    for i, _ in enumerate(r.get("cpu_judge.rows") or []):
        cell = lambda key, i=i: r.get(f"cpu_judge.rows.{i}.{key}")  # noqa: E731
        peaks = cell("measured_peaks_bytes")
        spread = (
            f"{fmt_bytes(min(peaks))} - {fmt_bytes(max(peaks))}"
            if isinstance(peaks, list) and peaks
            else "missing"
        )
        rows.append(
            [
                cell("description"),
                cell("batch"),
                f"{fmt_bytes(cell('measured_peak_bytes'))} ({spread})",
                *(
                    fmt_pct(cell(f"{kind}_error"), "+.1%")
                    for kind in ("first_ready_exact", "first_ready_bfc", "replayed_exact")
                ),
                fmt_pct(cell("replayed_bfc_error"), "+.1%"),
            ]
        )
    summary = (
        "Differences are simulated / measured - 1 (the measured-order columns: the worst of "
        "the processes, each against its own profiled run). Largest measured-order "
        f"difference (exact): {fmt_pct(r.get('cpu_judge.max_abs_replayed_exact_error'), '.1%')} "
        f"(tolerance {fmt_pct(r.get('cpu_judge.tolerance'), '.0%')}; within: "
        f"{_yes(r.get('cpu_judge.within_tolerance'))})."
    )
    return markdown_table(header, rows, "lrrrrrr") + "\n\n" + summary


@table("loops", "loops.json")
def loops(r: Results) -> str:
    """Recurrent models: measured CPU allocator peaks against three simulated peaks, and autotune."""
    header = [
        "model",
        "measured peak (range over runs)",
        "lists empty (before)",
        "with the lists",
        "+ iterations in flight (prediction)",
        "autotune at 80%: peak, lists swapped, overhead",
    ]
    rows = []
    models = r.get("rows")
    for name in models if isinstance(models, dict) else []:
        cell = lambda key, name=name: r.get(f"rows.{name}.{key}")  # noqa: E731
        peaks = cell("measured_peaks")
        spread = (
            f"{fmt_bytes(min(peaks))} - {fmt_bytes(max(peaks))}"
            if isinstance(peaks, list) and peaks
            else "missing"
        )
        simulated = [
            f"{fmt_bytes(cell(key))} ({fmt_ratio(cell(f'{key}_ratio'))}x)"
            for key in ("blind", "lists", "lists_in_flight")
        ]
        if cell("autotune.fits") is True:
            tuned = (
                f"{fmt_bytes(cell('autotune.peak_bytes'))}, {cell('autotune.loop_list_swaps')} of "
                f"{cell('autotune.swaps')} swaps, {fmt_pct(cell('autotune.overhead'), '+.1%')}"
            )
        else:
            tuned = "does not fit"
        rows.append([name, spread, *simulated, tuned])
    note = (
        "Ratios are simulated / the highest measured peak. Autotune figures are simulated on "
        "the V100-16GB preset over PCIe3, budget 80% of the prediction, no safety margin."
    )
    return markdown_table(header, rows, "lrrrrl") + "\n\n" + note


def _diff(value, reference) -> str:
    if (
        not isinstance(value, int | float)
        or not isinstance(reference, int | float)
        or not reference
    ):
        return "missing"
    return f"{(value - reference) / reference:+.1%}"


@table("defaults_sweep", "defaults_sweep.json")
def defaults_sweep(r: Results) -> str:
    """The swap defaults before and after the sweep, and whether LMSConfig uses them today."""
    from tflms.config import LMSConfig

    today = {f.name: f.default for f in dataclasses.fields(LMSConfig)}
    header = [
        "options",
        "mean saving",
        "worst saving",
        "worst overhead, NVLink2",
        "worst overhead, PCIe3",
        "LMSConfig's defaults today",
    ]
    rows = []
    for key, label in (("current_defaults", "before the sweep"), ("recommended", "recommended")):
        config = r.get(f"{key}.config")
        is_today = isinstance(config, dict) and all(today.get(k) == v for k, v in config.items())
        rows.append(
            [
                f"{label}: {_options(config)}",
                fmt_pct(r.get(f"{key}.mean_saving"), ".1%"),
                fmt_pct(r.get(f"{key}.worst_saving"), ".1%"),
                fmt_pct(r.get(f"{key}.worst_overhead_nvlink2"), "+.1%"),
                fmt_pct(r.get(f"{key}.worst_overhead_pcie3"), "+.0%"),
                "yes" if is_today else "no",
            ]
        )
    workloads = r.get("workloads")
    names = ", ".join(workloads) if isinstance(workloads, dict) else "missing"
    rows_count = len(r.get("rows") or [])
    return (
        markdown_table(header, rows)
        + f"\n\n{rows_count} option sets on {names}; criterion: {r.get('criterion')}."
    )


# --------------------------------------------------------------------------- speed


@table("rewrite_speed", "tflms_rewrite.json")
def rewrite_speed(r: Results) -> str:
    """Analysis, plan, apply and validate times on TF1 training graphs of residual blocks."""
    header = [
        "training graph",
        "ops",
        "swaps",
        "analysis",
        "plan",
        "apply",
        "total",
        "ops/s",
        "validate",
    ]
    rows = []
    for i, _ in enumerate(r.get("rewrite") or []):
        get = lambda key, i=i: r.get(f"rewrite.{i}.{key}")  # noqa: E731
        rows.append(
            [
                f"{get('blocks')} residual blocks",
                get("ops"),
                get("swaps"),
                fmt_seconds(get("analysis_s")),
                fmt_seconds(get("plan_s")),
                fmt_seconds(get("apply_s")),
                fmt_seconds(get("analysis_plan_apply_s")),
                f"{get('ops_per_s'):,}" if isinstance(get("ops_per_s"), int) else get("ops_per_s"),
                fmt_seconds(get("validate_s")),
            ]
        )
    scaling = r.get("scaling_ratio_time_4n_over_n")
    targets = r.get("targets")
    lines = [markdown_table(header, rows, "lrrrrrrrr")]
    if isinstance(scaling, dict):
        lines.append(
            "Time for 4x the ops: "
            + ", ".join(f"{k}: {v}x" for k, v in scaling.items())
            + f" (target <= {targets.get('ratio_4n_n') if isinstance(targets, dict) else 'missing'}x;"
            f" ops/s target >= {targets.get('ops_per_s') if isinstance(targets, dict) else 'missing'})."
        )
    return "\n\n".join(lines)


@table("autotune_speed", "tflms_rewrite.json")
def autotune_speed(r: Results) -> str:
    """Time to a budgeted plan of GPT-2 small: as tflms runs it, and every plan from scratch."""
    header = [
        "training step",
        "ops",
        "plan, fixed options",
        "budget",
        "plans tried",
        "budgeted plan",
        "every plan from scratch",
        "same plan and peak",
        "target",
    ]
    same = r.get("autotune.same_result")
    rows = [
        [
            r.get("autotune.model"),
            r.get("autotune.ops"),
            fmt_seconds(r.get("autotune.fixed_plan_s")),
            r.get("autotune.budget"),
            r.get("autotune.plans_simulated"),
            fmt_seconds(r.get("autotune.autotune_s")),
            fmt_seconds(r.get("autotune.reference_s")),
            "yes" if same is True else "no" if same is False else "missing",
            f"<= {fmt_seconds(r.get('autotune.target_s'))}",
        ]
    ]
    return (
        markdown_table(header, rows, "lrrlrrrll")
        + f"\n\nPredicted peak {fmt_bytes(r.get('autotune.peak_before_bytes'))} -> "
        f"{fmt_bytes(r.get('autotune.peak_bytes'))}. {r.get('autotune.note')}"
    )


@table("cpu_overhead", "tflms_rewrite.json")
def cpu_overhead(r: Results) -> str:
    """Step time of a Keras CNN with and without LMSCallback on this CPU."""
    header = [
        "model",
        "swaps",
        "bytes swapped",
        "step without LMS",
        "step with LMS",
        "difference",
        "target",
    ]
    rows = [
        [
            r.get("cpu_overhead.model"),
            r.get("cpu_overhead.swaps"),
            fmt_bytes(r.get("cpu_overhead.bytes_swapped")),
            f"{r.get('cpu_overhead.plain_step_ms')} ms",
            f"{r.get('cpu_overhead.lms_step_ms')} ms",
            f"{r.get('cpu_overhead.overhead_pct'):+}%",
            f"<= {r.get('cpu_overhead.target_pct')}%",
        ]
    ]
    return (
        markdown_table(header, rows) + f"\n\n{r.get('cpu_overhead.rounds')} interleaved rounds of "
        f"{r.get('cpu_overhead.steps_per_round')} steps, medians. {r.get('cpu_overhead.note')}"
    )


@table("resnet50_equivalence", "resnet50_equivalence.json")
def resnet50_equivalence(r: Results) -> str:
    """Whether ResNet-50 trains bitwise identically with LMS, per option set and optimizer."""
    header = [
        "options",
        "optimizer",
        "swaps",
        "swapped each way",
        "weights bitwise identical",
        "largest weight difference",
        "mean loss without / with LMS",
    ]
    rows = []
    configs = r.get("configs")
    for config_name, optimizers in configs.items() if isinstance(configs, dict) else []:
        for optimizer in optimizers:
            base = ["configs", config_name, optimizer]
            get = lambda key, base=base: r.get([*base, key])  # noqa: E731
            plain, lms = get("losses_plain"), get("losses_lms")
            rows.append(
                [
                    f"{config_name} ({_options(get('options'))})",
                    optimizer,
                    get("swaps"),
                    fmt_bytes(get("bytes_swapped")),
                    _yes(get("weights_bitwise_identical")),
                    f"{get('max_abs_weight_difference'):.3g}"
                    if isinstance(get("max_abs_weight_difference"), float)
                    else "missing",
                    f"{_last(plain)} / {_last(lms)}",
                ]
            )
    return markdown_table(header, rows) + f"\n\nSetup: {r.get('setup')}."


def _last(values) -> str:
    return f"{values[-1]:.4f}" if isinstance(values, list) and values else "missing"


# --------------------------------------------------------------------------- demo


@table("demo_epochs", "demo_summary.json")
def demo_epochs(r: Results) -> str:
    """Loss, validation Dice per class and throughput per epoch of the demo run."""
    header = [
        "epoch",
        "loss",
        "Dice per class",
        "volumes/s per rank",
        "allreduce share of the epoch",
    ]
    rows = []
    for i, _ in enumerate(r.get("history") or []):
        get = lambda key, i=i: r.get(f"history.{i}.{key}")  # noqa: E731
        seconds, allreduce = get("seconds"), get("allreduce_seconds")
        share = allreduce / seconds if isinstance(seconds, float) and seconds else MISSING
        dice = get("dice")
        rows.append(
            [
                get("epoch"),
                f"{get('loss'):.4f}",
                " ".join(f"{d:.3f}" for d in dice) if isinstance(dice, list) else "missing",
                f"{get('volumes_per_second'):.2f}",
                fmt_pct(share, ".1%"),
            ]
        )
    return markdown_table(header, rows, "rrlrr") + (
        f"\n\nThroughput after the first epoch "
        f"{r.get('performance.volumes_per_second_per_rank'):.2f} volumes/s per rank, "
        f"communication share {fmt_pct(r.get('performance.communication_share'), '.1%')}; "
        f"{r.get('ranks')} ranks, {r.get('train_seconds')} s of training; "
        f"weights identical on all ranks: {_yes(r.get('weights_identical'))}."
    )


@table("demo_memory", "demo_summary.json")
def demo_memory(r: Results) -> str:
    """Simulated GPU peaks of the demo's step and of the seed paper's sizes."""
    header = [
        "U-Net step",
        "batch",
        "peak without LMS",
        "peak with LMS",
        "swaps",
        "predicted overhead",
    ]
    rows = []
    demo = r.get("memory.demo")
    if isinstance(demo, dict):
        rows.append(
            [
                f"the demo's, {demo.get('size')}^3",
                demo.get("batch"),
                fmt_bytes(demo.get("peak_without_lms_bytes")),
                fmt_bytes(demo.get("peak_with_lms_bytes")),
                f"{r.get('lms.swaps')} (as trained)",
                fmt_pct(demo.get("overhead"), "+.1%"),
            ]
        )
    for i, row in enumerate(r.get("memory.seed_sizes") or []):
        if row.get("fits_with_lms") is False:
            with_lms = f"no plan fits (best {fmt_bytes(row.get('best_peak_with_lms_bytes'))})"
        elif row.get("lms_needed") is False:
            with_lms = "LMS not needed"
        else:
            with_lms = fmt_bytes(r.get(f"memory.seed_sizes.{i}.peak_with_lms_bytes"))
        rows.append(
            [
                f"{row.get('model', 'U-Net')}, depth {row.get('depth')}, "
                f"{row.get('base_filters')} base filters, {row.get('size')}^3",
                row.get("batch"),
                fmt_bytes(row.get("peak_without_lms_bytes")),
                with_lms,
                row.get("swaps", "-"),
                fmt_pct(row.get("overhead"), "+.1%"),
            ]
        )
    simulators = {
        row.get("simulator")
        for row in [demo, *(r.get("memory.seed_sizes") or [])]
        if isinstance(row, dict)
    }
    note = (
        f"**Simulated** (no GPU was used) on a {r.get('memory.device')} over {r.get('memory.link')}, "
        f"budget {r.get('memory.budget')}, by {'; '.join(sorted(s for s in simulators if s)) or 'missing'}."
        if r.get("memory.simulated") is True
        else "*These peaks are not marked as simulated in the file.*"
    )
    return markdown_table(header, rows, "lrrrrrr") + "\n\n" + note


# --------------------------------------------------------------------------- recomputation


_REMAT_FAMILIES = {
    "gpt": "GPT-style decoder, 4 blocks",
    "cnn": "Conv + BatchNorm + ReLU, 6 blocks",
    "mlp": "residual MLP, 8 blocks",
    "tcn": "dilated Conv1D (TCN), 6 blocks",
}
_REMAT_LABELS = {
    "rematscope": "RematScope per block",
    "tflms_cheap": "tflms cheap ops",
    "tflms_segments1": "tflms segments, every cut",
    "tflms_segments2": "tflms segments, every 2nd cut",
    "tflms_segments4": "tflms segments, every 4th cut",
}


@table("remat", "remat.json")
def remat(r: Results) -> str:
    """tflms recomputation beside per-block RematScope: measured peak, CPU time, bitwise."""
    variants = [v for v in r.get("variants") or {} if v != "plain"]
    header = ["model", "plain", *(_REMAT_LABELS.get(v, v) for v in variants)]
    rows = []
    families = r.get("families")
    for family in families if isinstance(families, dict) else []:
        cells = [
            _REMAT_FAMILIES.get(family, family),
            f"{r.get(f'families.{family}.variants.plain.peak_mib')} MiB, worst step "
            f"{r.get(f'families.{family}.variants.plain.worst_step_peak_mib')} MiB",
        ]
        for variant in variants:
            base = f"families.{family}.variants.{variant}"
            exact = "bitwise" if r.get(f"{base}.bitwise_with_plain") is True else "**not bitwise**"
            cells.append(
                f"{r.get(f'{base}.peak_mib')} MiB ({fmt_pct(r.get(f'{base}.peak_vs_plain'), '.0%')}"
                f" of plain), worst step {r.get(f'{base}.worst_step_peak_mib')} MiB, "
                f"CPU {fmt_ratio(r.get(f'{base}.cpu_vs_plain'))}x, "
                f"+{r.get(f'{base}.dense_ops_rerun')} dense ops, {exact}"
            )
        rows.append(cells)
    repeats = (
        {f: families[f].get("repeats") for f in families} if isinstance(families, dict) else {}
    )
    counts = ", ".join(
        f"{f.upper()} {n if isinstance(n, int) else r.get('repeats')}" for f, n in repeats.items()
    )
    paired = ", ".join(
        f"{f.upper()} {r.get(f'families.{f}.paired.processes')} processes x "
        f"{r.get(f'families.{f}.paired.rounds_per_process')} rounds"
        for f in repeats
    )
    note = (
        f"Measured by TensorFlow's CPU allocator (oneDNN), the median of fresh processes per "
        f"cell ({counts}), each family's run interleaved; the worst step is the highest peak of "
        "any measured step (3 per process: TensorFlow orders ready ops differently from step to "
        "step, and a budget must hold for each); CPU is the step's process CPU time over "
        "plain training's, timed side by side: every variant built in one process, one step "
        "of each per round in an order rotated from round to round, the median of the "
        f"per-round ratios ({paired}); dense ops are the matmuls and convolutions the runtime "
        "runs per step "
        "beyond plain training's, counted in its optimized graph. Nothing simulated."
    )
    return markdown_table(header, rows, "l" + "r" * (len(header) - 1)) + "\n\n" + note


@table("remat_pairs", "remat.json")
def remat_pairs(r: Results) -> str:
    """Each family's tflms figure against RematScope's: peak, paired CPU and wall, extra ops."""
    header = [
        "model",
        "tflms setting",
        "peak, tflms / RematScope",
        "CPU, tflms / RematScope (90% interval)",
        "wall, tflms / RematScope",
        "ops tflms runs beyond RematScope's",
    ]
    rows = []
    families = r.get("families")
    for family in families if isinstance(families, dict) else []:
        best = f"families.{family}.best_segments"
        scope = f"families.{family}.variants.rematscope"
        low, high = (r.get(f"{best}.paired.cpu_vs_rematscope_90.{i}") for i in (0, 1))
        mine = r.get(f"{best}.ops_beyond_plain")
        theirs = r.get(f"{scope}.ops_beyond_plain")
        extra = (
            ", ".join(
                f"{op} +{n - theirs.get(op, 0)}" for op, n in mine.items() if n > theirs.get(op, 0)
            )
            or "none"
            if isinstance(mine, dict) and isinstance(theirs, dict)
            else "?"
        )
        rows.append(
            [
                _REMAT_FAMILIES.get(family, family),
                _REMAT_LABELS.get(r.get(f"{best}.setting"), r.get(f"{best}.setting")),
                f"{r.get(f'{best}.peak_mib')} / {r.get(f'{scope}.peak_mib')} MiB",
                f"{fmt_ratio(r.get(f'{best}.paired.cpu_vs_rematscope'), 3)} "
                f"({fmt_ratio(low, 3)}-{fmt_ratio(high, 3)}), under it in "
                f"{r.get(f'{best}.paired.rounds_under_rematscope')} rounds",
                fmt_ratio(r.get(f"{best}.paired.wall_vs_rematscope"), 3),
                extra,
            ]
        )
    note = (
        "Per-round ratios of steps timed side by side in one process (the table above), their "
        "median and a bootstrap 90% interval of it; ops are counted by type in the runtime's "
        "optimized step, each row's count beyond plain training's, and listed where tflms's "
        "exceeds RematScope's (resource reads, Identity and Const left out: they compute "
        "nothing). Nothing simulated."
    )
    return markdown_table(header, rows, "llrrrl") + "\n\n" + note
