"""The docs' tables of ``real_anchors.json``: the simulator against real-GPU measurements.

Each function turns the file into Markdown; see :mod:`results_tables` for the
directive that calls it and what happens to missing keys. Imported by ``tables_tflms``.
"""

from __future__ import annotations

from results_tables import Results, fmt_bytes, markdown_table, table

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

TERMS = ("driver", "cuda_context", "tensorflow_reserve", "tensors", "workspace", "allocator")


def _real(verdict: dict) -> str:
    """The source's boundary: largest size that fit / first that did not."""
    return f"{verdict.get('real_largest_fit')} / {verdict.get('real_first_no_fit')}"


def _predicted(verdict: dict) -> str:
    """A model's boundary and how many of the sweep's steps it is off."""
    return (
        f"{verdict.get('predicted_largest_fit')} / {verdict.get('predicted_first_no_fit')} "
        f"({verdict.get('steps_off')})"
    )


def _yes(value) -> str:
    return "fits" if value is True else "does not fit" if value is False else "missing"


@table("anchor_boundaries", "real_anchors.json")
def anchor_boundaries(r: Results) -> str:
    """Per anchor: the real boundary, the predicted one (realistic and tensors only)."""
    header = [
        "anchor (variant)",
        "real: largest fit / first no fit",
        "realistic model: largest fit / first no fit (steps off)",
        "tensors only (steps off)",
        "real / realistic peak at the real first no-fit",
    ]
    rows = []
    anchors = r.get("anchors")
    for name in anchors if isinstance(anchors, dict) else []:
        variants = r.get(f"anchors.{name}.variants")
        for variant in variants if isinstance(variants, dict) else []:
            base = f"anchors.{name}.variants.{variant}"
            real = r.get(f"{base}.realistic")
            tensors = r.get(f"{base}.tensors")
            gap = r.get(f"{base}.gap", record=False)
            anchor = r.get(f"anchors.{name}.anchor_variant") == variant
            label = f"{name} ({variant}{', the anchor' if anchor else ''})"
            ratio = gap.get("real_over_realistic_at_least") if isinstance(gap, dict) else None
            rows.append(
                [
                    label,
                    _real(real),
                    _predicted(real),
                    f"{tensors.get('predicted_largest_fit')} ({tensors.get('steps_off')})",
                    f">= {ratio}" if ratio is not None else "n/a",
                ]
            )
    return markdown_table(header, rows)


@table("anchor_terms", "real_anchors.json")
def anchor_terms(r: Results, anchor: str = "paper-unet", variant: str = "tf1") -> str:
    """The realistic peak of one anchor's sweep, term by term, and the verdict."""
    header = ["size", *TERMS, "realistic peak", "verdict", "tensors only", "Grappler"]
    rows = []
    sweep = r.get(["anchors", anchor, "variants", variant, "rows"])
    for row in sweep if isinstance(sweep, list) else []:
        terms = row.get("terms", {})
        grappler = row.get("grappler_peak_with_variables_bytes")
        rows.append(
            [
                row.get("size"),
                *(fmt_bytes(terms.get(t)) for t in TERMS),
                fmt_bytes(row.get("realistic_peak_bytes")),
                _yes(row.get("fits_realistic")),
                fmt_bytes(row.get("tensors_peak_bytes")),
                fmt_bytes(grappler) if grappler is not None else "",
            ]
        )
    return markdown_table(header, rows, "r" + "r" * len(TERMS) + "rlrr")


@table("anchors_left_out", "real_anchors.json")
def anchors_left_out(r: Results) -> str:
    """The published data points not rebuilt, and why."""
    left = r.get("left_out")
    rows = [[name, why] for name, why in (left.items() if isinstance(left, dict) else [])]
    return markdown_table(["source", "why it is left out"], rows)


@table("anchor_lms", "real_anchors.json")
def anchor_lms(r: Results) -> str:
    """The paper's model with the auto-tuned plan, by the realistic model and by Grappler."""
    header = [
        "edge",
        "link",
        "fits (realistic)",
        "realistic peak",
        "tensors term",
        "Grappler (tensors, same plan)",
        "Grappler vs ours",
        "overhead",
    ]
    rows = []
    links = r.get("anchors.paper-unet.with_lms")
    for link in links if isinstance(links, dict) else []:
        for row in links[link]:
            terms = row.get("terms", {})
            diff = row.get("grappler_vs_tensors")
            overhead = row.get("overhead")
            fits = _yes(row.get("fits"))
            if row.get("lms_needed") is False:
                fits = "fits without LMS"
            rows.append(
                [
                    row.get("size"),
                    link,
                    fits,
                    fmt_bytes(row.get("realistic_peak_bytes", row.get("best_peak_bytes"))),
                    fmt_bytes(terms.get("tensors")),
                    fmt_bytes(row.get("grappler_peak_with_variables_bytes"))
                    if "grappler_peak_with_variables_bytes" in row
                    else "",
                    f"{diff:+.1%}" if isinstance(diff, int | float) else "",
                    f"{overhead:+.1%}" if isinstance(overhead, int | float) else "",
                ]
            )
    return markdown_table(header, rows, "rllrrrrr")


def _overhead(row: dict | None) -> str:
    """An auto-tuned plan's overhead, or why there is none."""
    if row is None:
        return ""
    if row.get("fits") is False:
        return "no plan fits"
    if row.get("lms_needed") is False:
        return "no LMS needed"
    overhead = row.get("overhead")
    return f"{overhead:+.1%}" if isinstance(overhead, int | float) else "missing"


def _by_size(rows) -> dict:
    return {row.get("size"): row for row in rows} if isinstance(rows, list) else {}


@table("anchor_overhead_curve", "real_anchors.json")
def anchor_overhead_curve(r: Results) -> str:
    """The paper's NVLink2 overhead curve next to the sourced and the calibrated model's."""
    sourced = r.get("anchors.paper-unet.with_lms")
    fitted = r.get("calibration.paper_unet_with_lms.with_lms")
    real = r.get("anchors.paper-unet.real_overhead_nvlink2")
    factor = r.get("calibration.paper_unet_with_lms.tensor_factor")
    columns = []
    for label, runs in (("sourced model", sourced), (f"calibrated (x{factor})", fitted)):
        for link in ("nvlink2", "pcie3"):
            rows = runs.get(link) if isinstance(runs, dict) else None
            columns.append((f"{label}, {link}", _by_size(rows)))
    sizes = sorted({size for _, rows in columns for size in rows if isinstance(size, int)})
    header = ["edge", "paper (real), nvlink2", *(label for label, _ in columns)]
    body = []
    for size in sizes:
        paper = real.get(str(size)) if isinstance(real, dict) else None
        body.append(
            [
                size,
                f"{paper:+.0%}" if isinstance(paper, int | float) else "",
                *(_overhead(rows.get(size)) for _, rows in columns),
            ]
        )
    return markdown_table(header, body, "r" + "r" * (len(header) - 1))


@table("anchor_link_ratio", "real_anchors.json")
def anchor_link_ratio(r: Results) -> str:
    """PCIe3 step time over NVLink2 step time: the paper's against both models'."""
    real = r.get("anchors.paper-unet.real_link_ratio")
    sourced = _by_size(r.get("anchors.paper-unet.link_ratios"))
    fitted = _by_size(r.get("calibration.paper_unet_with_lms.link_ratios"))
    sizes = sorted({s for s in (*sourced, *fitted) if isinstance(s, int)})
    body = []
    for size in sizes:
        paper = None
        if isinstance(real, dict) and real.get("size") == size:
            paper = real.get("pcie3_over_nvlink2")
        body.append(
            [
                size,
                f"{paper:.2f}" if paper is not None else "",
                f"{sourced[size]['pcie3_over_nvlink2']:.2f}" if size in sourced else "",
                f"{fitted[size]['pcie3_over_nvlink2']:.2f}" if size in fitted else "",
            ]
        )
    header = ["edge", "paper (real)", "sourced model", "calibrated model"]
    return markdown_table(header, body, "rrrr")


@table("anchor_calibration", "real_anchors.json")
def anchor_calibration(r: Results) -> str:
    """The tensor factor fitted to each anchor in turn, and every anchor judged with it."""
    header = [
        "factor fitted to",
        "factor (interval that reproduces it)",
        "anchor judged",
        "real: largest fit / first no fit",
        "calibrated: largest fit / first no fit (steps off)",
    ]
    body = []
    fits = r.get("calibration.fits")
    for name in fits if isinstance(fits, dict) else []:
        interval = fits[name].get("interval", {})
        judged = fits[name].get("judged", {})
        for other, result in judged.items():
            v = result.get("verdict", {})
            body.append(
                [
                    name,
                    f"{interval.get('fitted')} ({interval.get('low_exclusive')}, "
                    f"{interval.get('high')}]",
                    f"{other} ({'held out' if result.get('held_out') else 'fitted'})",
                    _real(v),
                    _predicted(v),
                ]
            )
    return markdown_table(header, body)


@table("anchor_trigger_sweep", "real_anchors.json")
def anchor_trigger_sweep(r: Results) -> str:
    """Level-based swap-in triggers (TFLMS v1's ``lb``) at one size: peak and overhead per link."""
    rows = r.get("anchors.paper-unet.trigger_sweep.rows")
    links = list(rows) if isinstance(rows, dict) else []
    by_link = {link: {row.get("swapin_ahead"): row for row in rows[link]} for link in links}
    aheads = sorted({a for link in links for a in by_link[link] if isinstance(a, int)})
    header = ["swapin_ahead (levels)"]
    for link in links:
        header += [f"{link}: realistic peak", f"{link}: overhead"]
    if len(links) == 2:
        header.append(f"{links[1]} / {links[0]} step")
    body = []
    for ahead in aheads:
        line: list = [ahead]
        steps = []
        for link in links:
            row = by_link[link].get(ahead, {})
            overhead = row.get("overhead")
            fits = "" if row.get("fits") else " (does not fit)"
            line += [
                fmt_bytes(row.get("realistic_peak_bytes")) + fits,
                f"{overhead:+.1%}" if isinstance(overhead, int | float) else "missing",
            ]
            steps.append(1 + overhead if isinstance(overhead, int | float) else None)
        if len(links) == 2:
            line.append(f"{steps[1] / steps[0]:.2f}" if None not in steps else "")
        body.append(line)
    return markdown_table(header, body, "r" * len(header))
