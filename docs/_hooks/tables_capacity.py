"""The docs' table of ``capacity_transformers.json``: BERT and GPT-2 with and without LMS.

See :mod:`results_tables` for the directive that calls it and what happens to
missing keys. Imported by ``tables_tflms``.
"""

from __future__ import annotations

from results_tables import Results, fmt_bytes, fmt_pct, fmt_ratio, markdown_table, table

__all__ = ["recompute_only"]  # the tables here are registered in results_tables.TABLES


def _links(r: Results, path: str) -> str:
    """Per link, the largest batch the auto-tuner finds a plan for: ``batch (ratio, +overhead)``."""
    cells = []
    for link in ("pcie3", "nvlink2"):
        run = r.get(f"{path}.links.{link}")
        if not isinstance(run, dict):
            cells.append("missing")
        elif not run.get("batch"):
            cells.append("no plan")
        else:
            cells.append(
                f"{run['batch']} ({fmt_ratio(run.get('ratio'))}x, {fmt_pct(run.get('overhead'))})"
            )
    return " / ".join(cells)


def _cap(r: Results, path: str) -> str:
    cap = r.get(f"{path}.cap")
    if not isinstance(cap, dict):
        return "missing"
    op = str(cap.get("peak_op", "")).rsplit("/", 2)
    return f"`{'/'.join(op[-2:])}` ({cap.get('peak_op_type')}), {fmt_bytes(cap.get('peak_bytes'))}"


def recompute_only(r: Results, path: str, size: str) -> str:
    """``size (ratio, +overhead, plan)`` of a recompute-only entry of the capacity benches."""
    return (
        f"{r.get(f'{path}.{size}')} ({fmt_ratio(r.get(f'{path}.ratio'))}x, "
        f"{fmt_pct(r.get(f'{path}.overhead'))}; {r.get(f'{path}.{_PLAN[size]}')})"
    )


_PLAN = {"batch": "best_plan", "size": "plan"}


@table("capacity_transformers", "capacity_transformers.json")
def capacity_transformers(r: Results) -> str:
    """Largest batch without LMS and, per link, with LMS and with the split rewrite; the bounds."""
    header = [
        "model",
        "without LMS",
        "with LMS: PCIe3 / NVLink2 (ratio, overhead)",
        "three fixed plans, instantaneous copies (ratio)",
        "capped one batch further by",
        "with LMS + split: PCIe3 / NVLink2",
        "three fixed plans, instantaneous copies",
        "capped one batch further by",
        "recompute only, no copies (ratio, overhead)",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        lms, split = f"models.{name}.with_lms", f"models.{name}.with_lms_split"
        rows.append(
            [
                r.get(f"models.{name}.description"),
                r.get(f"models.{name}.without_lms.batch"),
                _links(r, lms),
                f"{r.get(f'{lms}.batch')} ({fmt_ratio(r.get(f'{lms}.ratio'))}x)",
                _cap(r, lms),
                _links(r, split),
                f"{r.get(f'{split}.batch')} ({fmt_ratio(r.get(f'{split}.ratio'))}x)",
                _cap(r, split),
                recompute_only(r, f"models.{name}.recompute_only", "batch"),
            ]
        )
    return markdown_table(header, rows)


_PLACEMENTS = (
    ("plain", "all on the device"),
    ("offload", "AdamW state on the host"),
    ("stream", "weights streamed too"),
    ("stream_swap", "+ activation swaps"),
    ("stream_tuned", "+ autotune's plan"),
)


LINKS = ("pcie3", "nvlink2")


def _largest(r: Results, path: str) -> str:
    tuned = "stream_tuned" in path or "zero2_tuned" in path
    if tuned and path.endswith("A100-80GB"):
        return "not run"  # the auto-tuner's search ran for the V100 only
    if tuned and not isinstance(r.get(path, record=False), dict):
        return "not run"  # bench_model_state.py --placements stream_tuned --models ...
    batch = r.get(f"{path}.largest_batch")
    tried = r.get(f"{path}.batch_tried", record=False)
    if batch == 0 and isinstance(tried, int):  # one batch tried (the goal's): the best peaks
        best = " / ".join(fmt_bytes(r.get(f"{path}.best_peak_bytes.{link}")) for link in LINKS)
        return f"not at {tried} (best plans {best})"
    if batch == 0:
        return "does not fit"
    if r.get(f"{path}.capped", record=False) is True:
        batch = f">= {batch}"  # the largest batch tried
    ratios = []
    for link in LINKS:
        cell = r.get(f"{path}.{link}", record=False)
        if isinstance(cell, dict) and cell.get("fits") is False:
            ratios.append("no plan")  # the auto-tuner found none over this link
        else:
            ratios.append(fmt_ratio(r.get(f"{path}.{link}.step_over_compute")) + "x")
    return f"{batch} ({' / '.join(ratios)})"


@table("model_state", "model_state.json")
def model_state(r: Results) -> str:
    """GPT-2 small to XL: the largest batch per placement of the model state, per GPU."""
    header = [
        "model",
        "GPU",
        *(f"{label}" for _, label in _PLACEMENTS),
        "ZeRO-1, 8 ranks (derived)",
        "ZeRO-2, 8 ranks, + autotune's plan",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        for gpu in ("V100-16GB", "A100-80GB"):
            params = r.get(f"models.{name}.parameters")
            shown = "XL" if name == "xl" else name
            label = f"GPT-2 {shown} ({params / 1e6:.0f}M)" if isinstance(params, int) else name
            zero = r.get(f"models.{name}.plain.{gpu}.zero1_per_rank.largest_batch_per_rank")
            rows.append(
                [
                    label,
                    gpu,
                    *(_largest(r, f"models.{name}.{key}.{gpu}") for key, _ in _PLACEMENTS),
                    "does not fit" if zero == 0 else zero,
                    _largest(r, f"models.{name}.zero2_tuned.{gpu}"),
                ]
            )
    return markdown_table(header, rows)


@table("offload", "offload.json")
def offload(r: Results) -> str:
    """GPT-2 with AdamW's state on the host: device and host peaks, step time over plain."""
    header = [
        "model",
        "batch",
        "device peak, plain -> offloaded",
        "host peak (offloaded, PCIe3)",
        "step time over plain, PCIe3 / NVLink2",
    ]
    rows = []
    models = r.get("models")
    for name in models if isinstance(models, dict) else []:
        path = f"models.{name}"
        params = r.get(f"{path}.parameters")
        ratios = " / ".join(
            fmt_ratio(r.get(f"{path}.step_time_over_plain.{link}")) + "x"
            for link in ("pcie3", "nvlink2")
        )
        rows.append(
            [
                f"GPT-2 {name} ({params / 1e6:.0f}M)" if isinstance(params, int) else name,
                r.get(f"{path}.batch"),
                f"{fmt_bytes(r.get(f'{path}.plain.pcie3.device_peak_bytes'))} -> "
                f"{fmt_bytes(r.get(f'{path}.offload.pcie3.device_peak_bytes'))}",
                fmt_bytes(r.get(f"{path}.offload.pcie3.host_peak_bytes")),
                ratios,
            ]
        )
    return markdown_table(header, rows)
