"""The docs' tables of ``real_anchors.json``: the simulator against real-GPU measurements.

Each function turns the file into Markdown; see :mod:`results_tables` for the
directive that calls it and what happens to missing keys. Imported by ``tables_tflms``.
"""

from __future__ import annotations

from results_tables import Results, fmt_bytes, markdown_table, table

__all__: list[str] = []  # everything here is registered in results_tables.TABLES

TERMS = ("driver", "cuda_context", "tensorflow_reserve", "tensors", "workspace", "allocator")


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
                    f"{real.get('real_largest_fit')} / {real.get('real_first_no_fit')}",
                    f"{real.get('predicted_largest_fit')} / {real.get('predicted_first_no_fit')} "
                    f"({real.get('steps_off')})",
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
            rows.append(
                [
                    row.get("size"),
                    link,
                    _yes(row.get("fits")),
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
