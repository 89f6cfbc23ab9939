"""The docs' table of ``capacity_transformers.json``: BERT and GPT-2 with and without LMS.

See :mod:`results_tables` for the directive that calls it and what happens to
missing keys. Imported by ``tables_tflms``.
"""

from __future__ import annotations

from results_tables import Results, fmt_bytes, fmt_pct, fmt_ratio, markdown_table, table

__all__: list[str] = []  # everything here is registered in results_tables.TABLES


def _overheads(r: Results, path: str) -> str:
    cells = []
    for link in ("pcie3", "nvlink2"):
        tuned = r.get(f"{path}.tuned.{link}")
        if not isinstance(tuned, dict):
            cells.append("missing")
        elif tuned.get("fits"):
            cells.append(fmt_pct(tuned.get("overhead")))
        else:
            cells.append("needs a smaller batch")
    return " / ".join(cells)


def _cap(r: Results, path: str) -> str:
    cap = r.get(f"{path}.cap")
    if not isinstance(cap, dict):
        return "missing"
    op = str(cap.get("peak_op", "")).rsplit("/", 2)
    return f"`{'/'.join(op[-2:])}` ({cap.get('peak_op_type')}), {fmt_bytes(cap.get('peak_bytes'))}"


@table("capacity_transformers", "capacity_transformers.json")
def capacity_transformers(r: Results) -> str:
    """Largest batch without LMS, with LMS, with LMS and the split rewrite; what caps it."""
    header = [
        "model",
        "without LMS",
        "with LMS (ratio)",
        "PCIe3 / NVLink2 overhead",
        "capped at the next batch by",
        "with LMS + split (ratio)",
        "PCIe3 / NVLink2 overhead",
        "capped at the next batch by",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        lms, split = f"models.{name}.with_lms", f"models.{name}.with_lms_split"
        rows.append(
            [
                r.get(f"models.{name}.description"),
                r.get(f"models.{name}.without_lms.batch"),
                f"{r.get(f'{lms}.batch')} ({fmt_ratio(r.get(f'{lms}.ratio'))}x)",
                _overheads(r, lms),
                _cap(r, lms),
                f"{r.get(f'{split}.batch')} ({fmt_ratio(r.get(f'{split}.ratio'))}x)",
                _overheads(r, split),
                _cap(r, split),
            ]
        )
    return markdown_table(header, rows)
