"""Transformer capacity with and without LMS on the realistic V100-16GB (simulated; issue 31).

BERT-base (sequence 512, masked-LM loss over its 30522-word vocabulary) and
GPT-2 small (sequence 1024, causal-LM loss over 50257 words), the zoo's
published configurations (:mod:`tflms.zoo.language`), as ``tflms.analyze``
traces their Keras training step (AdamW). For each, the largest batch that
fits a V100-16GB as ``tflms.simulate`` models it by default (``accounting=
"realistic"``, TensorFlow 2.x terms):

* ``without_lms``: the plain step's ``device_peak_bytes`` <= the device;
* ``with_lms``: the best of every plan of ``bench_capacity.PLANS`` with
  instantaneous copies fits (the criterion of ``bench_capacity``);
* ``with_lms_split``: the same after the split rewrite
  (``LMSConfig(max_op_bytes=...)``, :mod:`tflms.plan.splits`), which cuts
  the vocabulary loss into row chunks so that no op holds its logits and
  its gradient on the device at once, and draws each dropout mask in its
  layer rather than all as the step starts;
* ``recompute_only``: the best plan that copies nothing (``swap=False``:
  cheap-op groups, or segments every 1, 2 or 4 cuts,
  ``bench_capacity.RECOMPUTE_ONLY``), with its predicted compute overhead.

The headline of each LMS variant is per link: the largest batch for which
``tflms.autotune`` over PCIe3 and over NVLink2 (no safety margin) finds a plan
that fits, with that plan's predicted step-time overhead (``links``). The
batch at which one of the three fixed plans fits with instantaneous copies is
reported second (the auto-tuner, searching more plans, can pass it); one batch
further, the best plan's peak op and the largest buffers live there say what
caps it. Each analysis of a published-size model takes tens of seconds and
each search by the auto-tuner minutes, so the searches start from a previous
run's figures (the per-link one from the fixed plans' batch) and step by the
peaks they see (:func:`largest`).

Every figure is simulated on a virtual V100-16GB; none was measured on a GPU.
Capuchin (Peng et al., ASPLOS 2020) reports a 7x larger BERT batch than
TensorFlow's on a real GPU under its own setup; it is quoted side by side as a
published anchor, not reproduced. Writes
``benchmarks/results/capacity_transformers.json``.

Run: ``.venv/bin/python benchmarks/bench_capacity_transformers.py [--models gpt2,bert]
[--variants plain,lms,split,recompute]`` (a partial run keeps the other entries of the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tflms  # noqa: E402
from benchmarks.bench_capacity import (  # noqa: E402
    PLANS,
    RECOMPUTE_ONLY,
    TUNED,
    best_recompute_only,
)
from benchmarks.common import RESULTS, provenance, setup_logging, write_result  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.apply.split import finish_view, split_graph  # noqa: E402
from tflms.cost.hardware import get_device  # noqa: E402
from tflms.errors import PlanInfeasibleError  # noqa: E402
from tflms.plan.splits import ALIGN, plan_deferrals, plan_splits  # noqa: E402

DEVICE = "V100-16GB"
BUDGET = get_device(DEVICE).memory_bytes
LINKS = ("pcie3", "nvlink2")
SPLIT_BYTES = 256 << 20
"""``LMSConfig.max_op_bytes`` of the split variant: no row chunk of the loss above 256 MiB."""
TARGET_RATIO = 5.0
CAPUCHIN = {
    "bert_batch_ratio": 7.0,
    "source": "Capuchin (Peng et al., ASPLOS 2020): BERT's maximum batch 7x TensorFlow's, "
    "measured on a real GPU under its own setup (not reproduced here)",
}
MODELS = {
    "bert": {
        "build": zoo.bert,
        "description": "BERT-base (12 blocks, width 768, 12 heads), sequence 512, masked-LM "
        "loss over 30522 words at every position, AdamW",
        "start": {"plain": 13, "lms": 68, "split": 60},
    },
    "gpt2": {
        "build": zoo.gpt2,
        "description": "GPT-2 small (12 blocks, width 768, 12 heads, untied head), sequence "
        "1024, causal-LM loss over 50257 words, AdamW",
        "start": {"plain": 4, "lms": 19, "split": 35},
    },
}


class Model:
    """One model of the zoo, analysed at the batches the search asks for."""

    def __init__(self, name: str):
        self.name = name
        self.keras = MODELS[name]["build"]()
        self._views: dict[int, object] = {}
        self._split: dict[int, object] = {}
        self._best: dict[tuple[int, bool], tuple] = {}
        self._reference: tuple | None = None
        self.deferrals: tuple = ()
        self.analysis_s: list[float] = []

    def view(self, batch: int):
        if batch not in self._views:
            self._views.clear()  # keep one: a published-size view is large
            t0 = time.perf_counter()
            self._views[batch] = tflms.analyze(self.keras, batch_size=batch)
            self.analysis_s.append(time.perf_counter() - t0)
        return self._views[batch]

    def splits(self, batch: int):
        """The split plan at ``batch``: planned on the first view analysed, rescaled.

        The loss's rows grow with the batch and nothing else changes, so the
        plan made at one batch is rescaled rather than analysing every batch
        twice (once whole to plan, once split); ``plan_splits`` on the view of
        ``batch`` gives the same entries.
        """
        if self._reference is None:
            ref_batch = next(iter(self._views)) if self._views else batch
            view = self.view(ref_batch)
            self._reference = (ref_batch, plan_splits(view, SPLIT_BYTES))
            self.deferrals = plan_deferrals(view, SPLIT_BYTES)
        ref_batch, ref = self._reference
        out = []
        for split in ref:
            rows = split.rows * batch // ref_batch
            nbytes = split.bytes * batch // ref_batch
            chunks = min(-(-nbytes // SPLIT_BYTES), rows // ALIGN)
            out.append(dataclasses.replace(split, rows=rows, bytes=nbytes, chunks=chunks))
        return tuple(out)

    def split_view(self, batch: int):
        """The view of the training step at ``batch`` after the split rewrite."""
        if batch not in self._split:
            self._split.clear()
            splits = self.splits(batch)
            t0 = time.perf_counter()
            graph = tflms.train_step_graph(self.keras, batch_size=batch)
            split_graph(graph, splits, deferrals=self.deferrals)
            self._split[batch] = finish_view(tflms.build_view(graph), splits)
            self.analysis_s.append(time.perf_counter() - t0)
        return self._split[batch]

    def plain(self, batch: int):
        return tflms.simulate(self.view(batch), device=DEVICE, baseline=False)

    def best(self, batch: int, split: bool):
        """The lowest peak of every plan of ``PLANS`` with instantaneous copies."""
        key = (batch, split)
        if key not in self._best:
            view = self.split_view(batch) if split else self.view(batch)
            tried = {}
            for name, options in PLANS.items():
                plan = tflms.make_plan(view, tflms.LMSConfig(link="ideal", **options))
                result = tflms.simulate(view, plan, device=DEVICE, link="ideal", baseline=False)
                tried[name] = result
            winner = min(tried, key=lambda k: tried[k].device_peak_bytes)
            self._best[key] = (
                winner,
                tried[winner],
                {k: r.device_peak_bytes for k, r in tried.items()},
            )
        return self._best[key]

    def recompute_only(self, batch: int):
        """``bench_capacity.best_recompute_only`` at ``batch`` (cached)."""
        key = (batch, "recompute")
        if key not in self._best:
            self._best[key] = best_recompute_only(self.view(batch))
        return self._best[key]

    def tuned(self, batch: int, split: bool, link: str) -> dict:
        view = self.split_view(batch) if split else self.view(batch)
        t0 = time.perf_counter()
        try:
            tuned = tflms.autotune(view, DEVICE, config=TUNED, safety_margin=0.0, link=link)
        except PlanInfeasibleError as err:
            return {"fits": False, "best_peak_bytes": err.best_peak_bytes}
        return {
            "fits": True,
            "peak_bytes": tuned.result.device_peak_bytes,
            "overhead": tuned.overhead,
            "step_time_s": tuned.result.step_time_s,
            "plain_step_time_s": tuned.baseline.step_time_s,
            "swaps": len(tuned.plan.swaps),
            "recomputes": len(tuned.plan.recomputes),
            "bytes_swapped_each_way": tuned.plan.bytes_swapped,
            "tune_s": round(time.perf_counter() - t0, 1),
        }


def largest(check, start: int) -> tuple[int, dict[int, dict]]:
    """The largest batch for which ``check`` finds a fitting step (assumed monotone).

    ``check(batch)`` returns ``(fits, peak_bytes)``: the peak of the step
    (the best one tried when none fits). Each probe costs minutes (an
    ``autotune`` search), so the next batch is the one at which the peak
    would reach the budget on the line through the two nearest probes
    (false position), kept strictly inside the bracket once there is one and
    replaced by the bracket's midpoint whenever the line fails to halve it; the
    result is always confirmed by a probe that fits at it and one that does
    not one batch above it.
    """
    seen: dict[int, dict] = {}

    def probe(b: int) -> None:
        fits, peak = check(b)
        seen[b] = {"fits": fits, "peak_bytes": peak}
        print(
            f"    batch {b}: {'fits' if fits else 'does not fit'} ({peak / 2**30:.2f} GiB)",
            flush=True,
        )

    def line(a: int, b: int) -> float:
        """Bytes per sample between two probes (at least one byte)."""
        return max((seen[b]["peak_bytes"] - seen[a]["peak_bytes"]) / (b - a), 1.0)

    probe(start)
    width = None
    while True:
        fit = [b for b in seen if seen[b]["fits"]]
        over = [b for b in seen if not seen[b]["fits"]]
        lo, hi = max(fit, default=0), min(over, default=None)
        if hi is not None and hi - lo <= 1:
            return lo, seen
        if lo and hi is not None:  # bracketed: false position, bisection when it stalls
            guess = lo + (BUDGET - seen[lo]["peak_bytes"]) / line(lo, hi)
            nxt = min(max(int(guess), lo + 1), hi - 1)
            if width is not None and hi - lo > width / 2:
                nxt = (lo + hi) // 2
            width = hi - lo
        elif hi is None:  # everything fits so far: up along the last two probes
            below = sorted(fit)[-2:]
            step = 1 if len(below) < 2 else (BUDGET - seen[lo]["peak_bytes"]) / line(*below)
            nxt = lo + min(max(int(step), 1), lo)
        else:  # nothing fits yet: down along the two lowest probes, landing below
            above = sorted(over)[:2]
            step = max(hi // 16, 1)  # the first step: wide enough for a slope above the noise
            if len(above) == 2:
                step = (seen[hi]["peak_bytes"] - BUDGET) / line(*above)
            nxt = hi - min(max(int(step) + 1, 1), max(hi // 2, 1))
            if nxt < 1:
                return 0, seen
        probe(nxt)


def ladder(fits, start: int) -> tuple[int, dict[int, bool]]:
    """The largest batch for which ``fits`` holds (assumed monotone), searched from ``start``.

    Up from ``start`` in steps that double until one fails, then bisection;
    down from ``start`` one batch at a time.
    """
    seen: dict[int, bool] = {}

    def check(b):
        seen[b] = fits(b)
        print(f"    batch {b}: {'fits' if seen[b] else 'does not fit'}", flush=True)
        return seen[b]

    if check(start):
        lo, step = start, 1
        while check(lo + step):
            lo, step = lo + step, step * 2
        hi = lo + step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if check(mid) else (lo, mid)
        return lo, seen
    b = start
    while b > 1 and not check(b - 1):
        b -= 1
    return b - 1, seen


def cap(result) -> dict:
    """What sits at the peak: the op and the largest buffers live there."""
    live = sorted(result.live_at_peak, key=lambda buf: -buf.bytes)
    return {
        "peak_bytes": result.device_peak_bytes,
        "peak_op": result.peak_op,
        "peak_op_type": result.peak_op_type,
        "memory_terms": result.memory_terms,
        "largest_live": [
            {"tensor": buf.tensor, "op_type": buf.op_type, "bytes": buf.bytes} for buf in live[:6]
        ],
        "live_tensor_bytes": sum(buf.bytes for buf in live),
    }


def study(name: str, variants: list[str], old: dict) -> dict:
    print(f"== {name}", flush=True)
    model = Model(name)
    start = MODELS[name]["start"]
    out: dict = {"description": MODELS[name]["description"]}  # only what this run computes
    if "plain" in variants:
        t0 = time.perf_counter()
        most, seen = ladder(lambda b: model.plain(b).device_peak_bytes <= BUDGET, start["plain"])
        out["without_lms"] = {
            "batch": most,
            "checked": seen,
            "peak_bytes": model.plain(most).device_peak_bytes if most else None,
            "cap": cap(model.plain(most + 1)),
            "search_s": round(time.perf_counter() - t0, 1),
        }
        print(f"  without LMS: {most}", flush=True)
    for variant, split in (("lms", False), ("split", True)):
        if variant not in variants:
            continue
        key = "with_lms_split" if split else "with_lms"
        t0 = time.perf_counter()
        most, seen = ladder(
            lambda b, split=split: model.best(b, split)[1].device_peak_bytes <= BUDGET,
            max(start[variant], {**old, **out}.get("without_lms", {}).get("batch", 1)),
        )
        winner, result, peaks = model.best(most, split)
        entry = {
            "batch": most,
            "checked": seen,
            "best_plan": winner,
            "peaks_of_every_plan": peaks,
            "peak_bytes_instant_copies": result.device_peak_bytes,
        }
        if split:
            entry["max_op_bytes"] = SPLIT_BYTES
            entry["splits"] = [s.to_dict() for s in model.splits(most)]
            entry["deferred_random_ops"] = len(model.deferrals)
        entry["cap"] = cap(model.best(most + 1, split)[1])
        entry["search_s"] = round(time.perf_counter() - t0, 1)
        entry["links"] = {}
        for link in LINKS:
            t0 = time.perf_counter()
            runs: dict[int, dict] = {}

            def check(b, split=split, link=link, runs=runs):
                runs[b] = model.tuned(b, split, link)
                run = runs[b]
                return run["fits"], run["peak_bytes" if run["fits"] else "best_peak_bytes"]

            batch, probes = largest(check, most)
            entry["links"][link] = {
                "batch": batch,
                **(runs[batch] if batch else {"fits": False}),
                "probes": probes,
                "search_s": round(time.perf_counter() - t0, 1),
            }
            print(f"    {link}: {batch} by autotune", flush=True)
        out[key] = entry
        tuned = ", ".join(
            f"{k} {v['batch']} ({v['overhead']:+.1%})" if v["batch"] else f"{k} none"
            for k, v in entry["links"].items()
        )
        print(
            f"  {key}: {tuned}; {most} with instantaneous copies (best plan {winner}); "
            f"capped at {most + 1} by {entry['cap']['peak_op']}",
            flush=True,
        )
    if "recompute" in variants:
        t0 = time.perf_counter()
        most, seen = ladder(
            lambda b: model.recompute_only(b)[1].device_peak_bytes <= BUDGET,
            max(start.get("recompute", 1), {**old, **out}.get("without_lms", {}).get("batch", 1)),
        )
        winner, result, peaks = model.recompute_only(most)
        out["recompute_only"] = {
            "batch": most,
            "checked": seen,
            "best_plan": winner,
            "options": RECOMPUTE_ONLY[winner],
            "peaks_of_every_plan": peaks,
            "peak_bytes": result.device_peak_bytes,
            "overhead": result.step_time_s / model.plain(most).step_time_s - 1,
            "cap": cap(model.recompute_only(most + 1)[1]),
            "search_s": round(time.perf_counter() - t0, 1),
        }
        print(
            f"  recompute only: {most} ({winner}, overhead "
            f"{out['recompute_only']['overhead']:+.1%})",
            flush=True,
        )
    out["analysis_s"] = [round(s, 1) for s in model.analysis_s]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--variants", default="plain,lms,split,recompute")
    args = parser.parse_args()
    setup_logging()
    path = RESULTS / "capacity_transformers.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    models = dict(old.get("models", {}))
    for name in args.models.split(","):
        result = study(name, args.variants.split(","), models.get(name, {}))
        # merge into the file as it is now: another run may have written other entries
        models = json.loads(path.read_text()).get("models", {}) if path.exists() else {}
        merged = models[name] = {**models.get(name, {}), **result}
        plain = merged.get("without_lms", {}).get("batch")
        for key in ("with_lms", "with_lms_split", "recompute_only"):
            if plain and key in merged:
                merged[key]["ratio"] = merged[key]["batch"] / plain
                for run in merged[key].get("links", {}).values():
                    run["ratio"] = run["batch"] / plain
        data = {
            **provenance(
                "Largest BERT-base (seq 512) and GPT-2 small (seq 1024) batch that fits the "
                "realistic V100-16GB (tensors plus the modelled non-tensor terms, TensorFlow "
                "2.x), without LMS, with LMS and with LMS after the split rewrite: per link the "
                "largest batch tflms.autotune finds a plan for (links), and the largest batch "
                "at which the best of bench_capacity.PLANS fits with instantaneous copies "
                "(batch); "
                "overheads are tflms.autotune's predictions (roofline per op, copies on their "
                "own streams), not measured."
            ),
            "budget_bytes": BUDGET,
            "device": f"{DEVICE} (virtual, accounting='realistic', stack tf2)",
            "plans_tried": PLANS,
            "target_ratio": TARGET_RATIO,
            "anchor": CAPUCHIN,
            "models": models,
        }
        write_result("capacity_transformers.json", data)
    summary = {
        name: {
            key: {link: run.get("ratio") for link, run in res.get(key, {}).get("links", {}).items()}
            for key in ("with_lms", "with_lms_split")
        }
        for name, res in models.items()
    }
    print(f"ratios: {json.dumps(summary)}\n-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
