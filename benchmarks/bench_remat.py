"""tflms recomputation against Keras's ``RematScope``, on TensorFlow's real CPU allocator.

Run by ``make bench`` (or ``python benchmarks/bench_remat.py [--families gpt,cnn] [--repeats 3]
[--pairs 2 --rounds 12]``; a run of some families keeps the other families' entries of the
JSON; ``--timing-only`` re-runs the paired timing alone, ``--ops-only`` the op counts alone,
into the JSON's rows).

Four block-stack families (``benchmarks/remat_models.py``: a GPT-style
decoder, a Conv + BatchNorm + ReLU CNN, a residual MLP, a dilated temporal
convolution network), each trained by one custom AdamW loop in six ways:

* ``plain``: ``tf.function``;
* ``rematscope``: each block created inside ``keras.RematScope(mode="full")``
  (one ``tf.recompute_grad`` per block: what a Keras user would pick);
* ``tflms_cheap``: ``tflms.function`` with ``swap=False, recompute=True``
  (the cheap-op groups alone);
* ``tflms_segments1``, ``tflms_segments2``, ``tflms_segments4``: the same
  with ``recompute_segments=1``, ``2`` or ``4`` (whole segments re-run from
  checkpoints kept at every cut, every second or every fourth: a transformer
  block has two cuts, a residual MLP or TCN block one, a Conv + BatchNorm +
  ReLU block four);
  (A segment re-runs every tensor its backward pass reads, the last block's
  before the loss too, as ``RematScope`` re-runs every block, each re-run
  started at most 2 levels before its first reader.)

A family's tflms figure (``best_segments``) is the segment setting that
re-runs the fewest dense ops (then: spends the least CPU time) among those
whose peak is at or under ``RematScope``'s and whose weights equal plain
training's; when none is, the lowest peak of them all. Dense ops first:
their count is the same in every run, where CPU times of settings doing the
same work differ by several percent from run to run on this machine. Every
setting's row stays in the JSON, with the count of each op type of its
runtime step beyond plain training's (``ops_beyond_plain``).

CPU time is timed side by side (``paired_worker``): one process builds every
variant, warms each up, then times one step of each per round, the order
rotated by one from round to round; ``--pairs`` processes of ``--rounds``
rounds. A row's ``cpu_vs_plain`` is the median of its per-round ratios to
plain's step, ``paired.cpu_vs_rematscope`` the same against ``RematScope``'s
with a bootstrap 90% interval: one process's steps differ from another's by
up to a third, so rows timed in separate processes (``cpu_vs_plain_separate``)
cannot be told apart.

Each run is a fresh process (oneDNN's allocator on any x86-64 CPU,
``tflms.utils.cpu.measurement_env``) that measures the step's allocator peak
(``measure_cpu_step``, 3 runs after a warm-up), then times 5 more steps (wall
and process CPU seconds) and hashes the weights. A cell's peak is the median
of its processes' medians; its worst step is the highest peak of any measured
step of any of its processes (TensorFlow's executor orders ready ops
differently from step to step, and a memory budget must hold for every step). The variants run interleaved
``--repeats`` times; the JSON keeps every run and the medians, and says for
each family whether every variant's weights equal plain training's bitwise.
It also records what ``RematScope`` does to single Keras layers in a
TensorFlow step. Real training on this CPU, nothing simulated. Writes
``benchmarks/results/remat.json``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

VARIANTS = {
    "plain": None,
    "rematscope": None,
    "tflms_cheap": dict(swap=False, recompute=True),
    "tflms_segments1": dict(swap=False, recompute=True, recompute_segments=1),
    "tflms_segments2": dict(swap=False, recompute=True, recompute_segments=2),
    "tflms_segments4": dict(swap=False, recompute=True, recompute_segments=4),
}
SEGMENT_VARIANTS = tuple(v for v in VARIANTS if v.startswith("tflms_segments"))
"""The segment settings; :func:`best_segments` picks each family's tflms figure among them."""
FAMILIES = ("gpt", "cnn", "mlp", "tcn")
TIMED_STEPS = 5
DENSE_OPS = re.compile(
    r'^\s*op: "(_Fused)?(MatMul|BatchMatMul\w*|Conv\w*|DepthwiseConv\w*|Einsum)"$'
)
"""The dense op types counted in the runtime's optimized step (backprop ops included)."""


def _training(family: str, variant: str):
    """``(model, step function, x, y)``: the family trained by AdamW as ``variant`` says."""
    import keras
    import tensorflow as tf

    import tflms
    from benchmarks.remat_models import batch, build
    from tests.tflms.models import tape_step

    model = build(family, variant == "rematscope")
    optimizer = keras.optimizers.AdamW(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tape_step(model, optimizer, loss_fn)
    options = VARIANTS[variant]
    fn = tflms.function(step, config=tflms.LMSConfig(**options)) if options else tf.function(step)
    x, y = (tf.constant(a) for a in batch(family))
    return model, fn, x, y


def _timed_step(fn, x, y) -> tuple[float, float]:
    """One step's (wall, process CPU) seconds, its result fetched."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn(x, y).numpy()
    return time.perf_counter() - w0, time.process_time() - c0


def worker(family: str, variant: str) -> dict:
    """One measured run in this process (see the module doc)."""
    from tflms.simulation.measure import measure_cpu_step

    model, fn, x, y = _training(family, variant)
    options = VARIANTS[variant]
    start = time.perf_counter()
    fn(x, y)  # trace (and plan) once, outside every figure
    first = time.perf_counter() - start
    measured = measure_cpu_step(fn, x, y, runs=3, warmup=1, profile=False)
    wall, cpu = zip(*(_timed_step(fn, x, y) for _ in range(TIMED_STEPS)), strict=True)
    out = {
        "peak_bytes": measured.peak_bytes,
        "peaks_bytes": list(measured.peaks_bytes),
        "resident_bytes": measured.resident_bytes,
        "step_seconds": statistics.median(wall),
        "step_cpu_seconds": statistics.median(cpu),
        "first_call_seconds": round(first, 2),
        "weights": hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest(),
        "steps": 1 + 4 + TIMED_STEPS,
    }
    ops = _op_counts()
    out["op_counts"] = ops
    out["dense_ops"] = None if ops is None else sum(ops.get(t, 0) for t in _dense_types(ops))
    if options:
        plan = fn.plan_for(x, y)
        out["plan"] = {
            "groups": len(plan.recomputes),
            "ops_rerun": sum(len(r.ops) for r in plan.recomputes),
            "bytes_not_kept": sum(r.bytes for r in plan.recomputes),
            "check": plan.notes[-1][:300],
        }
    return out


def paired_worker(family: str, rounds: int) -> dict:
    """Every variant's step timed side by side in this one process (see the module doc).

    Each variant trains its own copy of the family; after two warm-up steps each,
    every round times one step of each variant, the order rotated by one from
    round to round. Returns, per variant, each round's ``[wall, cpu]`` seconds.
    """
    trainings = {v: _training(family, v)[1:] for v in VARIANTS}
    for fn, x, y in trainings.values():
        for _ in range(2):
            fn(x, y).numpy()
    order = list(VARIANTS)
    times: dict = {v: [] for v in order}
    for r in range(rounds):
        for v in order[r % len(order) :] + order[: r % len(order)]:
            times[v].append(_timed_step(*trainings[v]))
    return times


def _op_counts() -> dict[str, int] | None:
    """Ops per type of the training step's graph as the runtime ran it (see the module doc)."""
    found = sorted(
        Path(os.environ["TF_DUMP_GRAPH_PREFIX"]).glob("*.after_graph_optimization.pbtxt")
    )
    sizes = {p: p.stat().st_size for p in found}
    if not sizes:
        return None
    step = max(sizes, key=sizes.get)  # the step, not the variables' initializers
    types = re.findall(r'^\s*op: "(\w+)"$', step.read_text(), flags=re.MULTILINE)
    return dict(sorted(collections.Counter(types).items()))


def _dense_types(ops: dict[str, int]) -> list[str]:
    return [t for t in ops if DENSE_OPS.match(f'op: "{t}"')]


def ops_beyond_plain(row: dict, plain: dict) -> dict[str, int]:
    """The op types whose count in a row's runtime step differs from plain training's
    (resource reads and the runtime's ``Identity``/``Const`` left out: they compute nothing).

    >>> ops_beyond_plain({"op_counts": {"MatMul": 6, "Mean": 2, "Identity": 9}},
    ...                  {"op_counts": {"MatMul": 4, "Mean": 2, "Identity": 1}})
    {'MatMul': 2}
    """
    mine, theirs = row.get("op_counts") or {}, plain.get("op_counts") or {}
    return {
        t: mine.get(t, 0) - theirs.get(t, 0)
        for t in sorted(set(mine) | set(theirs))
        if t not in _NO_WORK and mine.get(t, 0) != theirs.get(t, 0)
    }


_NO_WORK = frozenset({"Identity", "Const", "ReadVariableOp", "NoOp"})


def _this_script(*args: str, timeout: int, **env: str) -> tuple[dict | None, str]:
    """Runs this script with ``args`` in a fresh process (``measurement_env`` plus ``env``):
    ``(the JSON of its last output line, or None if it failed; its stderr)``."""
    from tflms.utils.cpu import measurement_env

    done = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env={**measurement_env(), **env},
        timeout=timeout,
    )
    if done.returncode != 0:
        return None, done.stderr.strip()
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _run(family: str, variant: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_remat_") as dump:
        out, err = _this_script(
            "--worker",
            family,
            variant,
            timeout=1800,
            TF_DUMP_GRAPH_PREFIX=dump,
            TF_DUMP_GRAPH_NAME_FILTER="*",
        )
    return out if out is not None else {"error": err.splitlines()[-1][:300]}


def _run_paired(family: str, rounds: int) -> dict:
    out, err = _this_script("--paired-worker", family, str(rounds), timeout=3600)
    if out is None:
        raise RuntimeError(f"paired timing of {family} failed: {err[-2000:]}")
    return out


def _interval(ratios: list[float], level: float = 0.9, draws: int = 2000) -> list[float]:
    """A bootstrap ``level`` interval of the median of ``ratios`` (fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    tail = int(draws * (1 - level) / 2)
    return [round(medians[tail], 3), round(medians[draws - 1 - tail], 3)]


def paired_summary(processes: list[dict]) -> dict:
    """Each variant's time against plain's (and a tflms row's against ``RematScope``'s)
    from :func:`paired_worker`'s rounds, pooled over processes: medians of per-round
    ratios, and the ratio of the fastest steps.

    >>> one = {"plain": [[1.0, 2.0], [1.2, 2.4]], "rematscope": [[1.1, 2.4], [1.4, 2.6]],
    ...        "tflms_segments1": [[1.0, 2.2], [1.3, 2.8]]}
    >>> row = paired_summary([one])["tflms_segments1"]
    >>> row["cpu_vs_plain"], row["cpu_fastest_vs_plain"], row["cpu_vs_rematscope"]
    (1.133, 1.1, 0.997)
    >>> row["rounds_under_rematscope"], row["cpu_vs_rematscope_90"]
    ('1 of 2', [0.917, 1.077])
    """
    pooled = {v: [t for p in processes for t in p[v]] for v in processes[0]}
    out: dict = {}
    for variant, times in pooled.items():
        row: dict = {"rounds": len(times)}
        for k, clock in enumerate(("wall", "cpu")):
            mine = [t[k] for t in times]
            for other in ("plain", "rematscope"):
                if (
                    other == variant
                    or other not in pooled
                    or (other == "rematscope" and variant == "plain")
                ):
                    continue
                theirs = [t[k] for t in pooled[other]]
                row[f"{clock}_vs_{other}"] = round(
                    statistics.median(a / b for a, b in zip(mine, theirs, strict=True)), 3
                )
            if variant != "plain":
                fastest = min(mine) / min(t[k] for t in pooled["plain"])
                row[f"{clock}_fastest_vs_plain"] = round(fastest, 3)
        if variant.startswith("tflms") and "rematscope" in pooled:
            ratios = [a[1] / b[1] for a, b in zip(times, pooled["rematscope"], strict=True)]
            row["rounds_under_rematscope"] = f"{sum(r < 1 for r in ratios)} of {len(ratios)}"
            row["cpu_vs_rematscope_90"] = _interval(ratios)
        out[variant] = row
    return out


def _summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"]}
    return {
        "peak_mib": round(statistics.median(r["peak_bytes"] for r in ok) / 2**20, 1),
        # what a memory budget must cover: the executor's order varies from step to step
        "worst_step_peak_mib": round(max(p for r in ok for p in r["peaks_bytes"]) / 2**20, 1),
        "step_seconds": round(statistics.median(r["step_seconds"] for r in ok), 4),
        "step_cpu_seconds": round(statistics.median(r["step_cpu_seconds"] for r in ok), 4),
        "runs": len(ok),
        "weights": sorted({r["weights"] for r in ok}),
        "dense_ops": ok[0].get("dense_ops"),
        "op_counts": ok[0].get("op_counts"),
        **({"plan": ok[0]["plan"]} if "plan" in ok[0] else {}),
    }


def best_segments(rows: dict) -> dict | None:
    """The family's tflms figure among its segment rows (see the module doc), named.

    >>> rows = {"rematscope": {"peak_mib": 90.0},
    ...         "tflms_segments1": {"peak_mib": 97.0, "cpu_vs_plain": 1.10,
    ...                             "dense_ops_rerun": 4, "bitwise_with_plain": True},
    ...         "tflms_segments2": {"peak_mib": 89.0, "cpu_vs_plain": 1.22,
    ...                             "dense_ops_rerun": 6, "bitwise_with_plain": True},
    ...         "tflms_segments4": {"peak_mib": 81.0, "cpu_vs_plain": 1.20,
    ...                             "dense_ops_rerun": 6, "bitwise_with_plain": True}}
    >>> best_segments(rows)["setting"]  # at or under 90 MiB, as many dense ops: less CPU
    'tflms_segments4'
    >>> rows["rematscope"]["peak_mib"] = 80.0  # none: the lowest peak
    >>> best_segments(rows)["setting"]
    'tflms_segments4'
    """
    segments = {v: rows[v] for v in SEGMENT_VARIANTS if v in rows and "error" not in rows[v]}
    if not segments:
        return None
    scope = rows.get("rematscope", {}).get("peak_mib")
    level = {
        v: row
        for v, row in segments.items()
        if scope is not None and row["peak_mib"] <= scope and row.get("bitwise_with_plain")
    }
    if level:
        name = min(
            level,
            key=lambda v: (level[v].get("dense_ops_rerun") or 0, level[v]["cpu_vs_plain"]),
        )
    else:
        name = min(segments, key=lambda v: segments[v]["peak_mib"])
    return {"setting": name, **segments[name]}


def _compare_ops(rows: dict) -> None:
    """Each row's dense ops and op types beyond plain training's."""
    plain = rows["plain"]
    for name, row in rows.items():
        if "error" in row or name == "plain" or plain.get("dense_ops") is None:
            continue
        if row.get("dense_ops") is not None:
            row["dense_ops_rerun"] = row["dense_ops"] - plain["dense_ops"]
            row["ops_beyond_plain"] = ops_beyond_plain(row, plain)


def _count_ops(entry: dict, family: str) -> None:
    """Re-counts a family entry's runtime ops, one fresh process per variant."""
    rows = entry["variants"]
    for variant in VARIANTS:
        run = _run(family, variant)
        if "error" in run:
            raise RuntimeError(f"{family} {variant}: {run['error']}")
        rows[variant].update(dense_ops=run["dense_ops"], op_counts=run["op_counts"])
        print("ops", family, variant, run["dense_ops"])
    _compare_ops(rows)
    entry["best_segments"] = best_segments(rows)


def _time_side_by_side(entry: dict, family: str, pairs: int, rounds: int) -> None:
    """Adds the paired timing to a family's ``entry`` (its rows' ``cpu_vs_plain`` becomes
    the paired figure; the separate processes' ratio stays as ``cpu_vs_plain_separate``)."""
    processes = []
    for n in range(pairs):
        processes.append(_run_paired(family, rounds))
        print("paired", family, n, json.dumps(paired_summary(processes[-1:]))[:300])
    entry["paired"] = {
        "processes": pairs,
        "rounds_per_process": rounds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "runs": processes,
    }
    summarize_paired(entry)


def summarize_paired(entry: dict) -> None:
    """Sets a family entry's paired figures from its ``paired`` runs (see
    :func:`_time_side_by_side`)."""
    paired = paired_summary(entry["paired"]["runs"])
    rows = entry["variants"]
    plain = rows["plain"]
    for name, row in rows.items():
        if "error" in row or name == "plain":
            continue
        row["cpu_vs_plain_separate"] = round(row["step_cpu_seconds"] / plain["step_cpu_seconds"], 3)
        row["paired"] = paired[name]
        row["cpu_vs_plain"] = paired[name]["cpu_vs_plain"]
    entry["best_segments"] = best_segments(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--repeats", type=int, default=3, help="memory processes per variant")
    parser.add_argument("--pairs", type=int, default=2, help="paired timing processes")
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds per paired process")
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="only re-run the paired timing, into the existing JSON's rows",
    )
    parser.add_argument(
        "--ops-only",
        action="store_true",
        help="only re-count the runtime's ops (one process per variant), into the existing JSON",
    )
    parser.add_argument("--worker", nargs=2, metavar=("FAMILY", "VARIANT"))
    parser.add_argument("--paired-worker", nargs=2, metavar=("FAMILY", "ROUNDS"))
    parser.add_argument(
        "--layers-only",
        action="store_true",
        help="only re-record what RematScope does to single layers, into the existing JSON",
    )
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if args.paired_worker:
        family, rounds = args.paired_worker
        print(json.dumps(paired_worker(family, int(rounds))))
        return
    from benchmarks.common import RESULTS, write_result
    from benchmarks.remat_models import BATCH, MODELS, remat_layer_failures
    from tflms.utils.cpu import cpu_state

    families = args.families.split(",")
    path = RESULTS / "remat.json"
    if args.layers_only or args.timing_only or args.ops_only:
        result = json.loads(path.read_text())
        if args.layers_only:
            result["rematscope_single_layers"] = remat_layer_failures()
        for family in families if args.ops_only else ():
            _count_ops(result["families"][family], family)
        for family in families if args.timing_only else ():
            _time_side_by_side(result["families"][family], family, args.pairs, args.rounds)
        for entry in result["families"].values():  # today's summary of the kept rounds
            if "paired" in entry:
                summarize_paired(entry)
        print(write_result("remat.json", result))
        return

    # a run of some families keeps the others' entries (each family's runs are its own)
    kept = json.loads(path.read_text()) if path.exists() and set(families) < set(FAMILIES) else {}
    runs: dict = {f: {v: [] for v in VARIANTS} for f in families}
    for repeat in range(args.repeats):
        for family in families:
            for variant in VARIANTS:  # interleaved: the machine's drift hits every variant alike
                runs[family][variant].append(_run(family, variant))
                print(repeat, family, variant, json.dumps(runs[family][variant][-1])[:200])
    result: dict = {
        "measured": "TensorFlow's CPU allocator (oneDNN), one process per run; nothing simulated",
        "cpu": cpu_state(),
        "repeats": args.repeats,
        "models": {
            **kept.get("models", {}),
            **{f: {"blocks_width_input_classes": MODELS[f], "batch": BATCH[f]} for f in families},
        },
        "variants": {k: v or k for k, v in VARIANTS.items()},
        "rematscope_single_layers": remat_layer_failures(),
        "families": {f: row for f, row in kept.get("families", {}).items() if f not in families},
    }
    for family in families:
        rows = {v: _summary(r) for v, r in runs[family].items()}
        plain = rows["plain"]
        for name, row in rows.items():
            if "error" in row or name == "plain":
                continue
            row["peak_vs_plain"] = round(row["peak_mib"] / plain["peak_mib"], 3)
            row["worst_step_vs_plain"] = round(
                row["worst_step_peak_mib"] / plain["worst_step_peak_mib"], 3
            )
            row["bitwise_with_plain"] = row["weights"] == plain["weights"]
        _compare_ops(rows)
        entry = {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "repeats": args.repeats,
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "variants": rows,
            "runs": runs[family],
        }
        _time_side_by_side(entry, family, args.pairs, args.rounds)
        result["families"][family] = entry
    print(write_result("remat.json", result))


if __name__ == "__main__":
    main()
