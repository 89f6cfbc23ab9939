"""Elastic jobs: recovery after a SIGKILL, growth to a discovered host, and the cost when nothing fails.

All runs use ``ddlrun`` and the Keras worker of the tests
(``tests/parallel/workers/elastic_keras.py``), on this machine, where
``localhost`` and ``127.0.0.1`` are two hosts.

* **Recovery**: 4 ranks (2 hosts x 2), commit every batch; launch rank 3
  SIGKILLs itself after batch 5 of epoch 1. Seconds from the kill to the
  survivors' next finished step (rank 0's clock; the Keras step is traced
  again for the new membership), batches trained after the last commit and
  rolled back, and whether the survivors end bitwise equal.
* **Growth**: 2 ranks on ``localhost``; rank 0 adds ``127.0.0.1:2`` to the
  discovery script's output after batch 3 of epoch 1. Seconds from that write
  to the first step at 4 ranks: the discovery poll (1 s), the commit that
  sees it, spawning 2 Python processes that import TensorFlow and build the
  model, and the state broadcast.
* **A node lost and replaced, on the rehearsal cluster** (``--rehearse 3
  --link 1gbit``): both ranks of one virtual node SIGKILLed, then a fresh
  node listed; see :func:`node_loss_rehearsal`.
* **A node crashing whole, on the rehearsal cluster** (``--rehearse 2``): every
  process of one virtual node, its Open MPI daemon included, SIGKILLed; the
  job relaunched on the other node from the commits mirrored in host memory;
  see :func:`node_crash_rehearsal`.
* **Cost when nothing fails**: 2 ranks on one host, the MLP of the Horovod
  benchmark and MobileNetV2 (64x64, batch 8 per rank), median step time of
  epochs 2-3 for: a fixed job (Open MPI's default transports), a fixed job on
  the transports elastic jobs use (``ob1`` + ``tcp,self``), and the elastic
  job committing every batch and every 10 batches. The configurations run
  interleaved, ``ROUNDS`` times, so that ratios come from the same minutes.

* **Growth without a pause, on the rehearsal cluster** (``--rehearse 2``): a
  node listed while the job trains; see :func:`growth_rehearsal`.
* **Twenty in a row** (``--repeat 20``, only then): the node-crash and growth
  rehearsals 20 times each, alternating, counting the runs that needed a
  retry and why; see :func:`repeat`.

``python benchmarks/bench_elastic.py`` writes ``results/elastic.json`` (about
15 minutes on a 2-core machine; the rehearsal part needs root, and is recorded
as skipped without); ``--only PART`` measures one part again and keeps the
others (``measured`` says when each part ran); ``--repeat 20`` runs only the
twenty-run check (about 20 minutes) and keeps the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info  # noqa: E402
from tflms.utils.files import write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
WORKER = REPO / "tests" / "parallel" / "workers" / "elastic_keras.py"
DDLRUN = Path(sys.executable).parent / "ddlrun"
ROUNDS = 2
TCP = "--mca pml ob1 --mca btl tcp,self"
CONFIGS = {
    "fixed": (["-np", "2"], {"ELASTIC_FIXED": "1"}),
    "fixed_tcp": (["-np", "2", "--mpi-args", TCP], {"ELASTIC_FIXED": "1"}),
    "elastic_commit_1": (["--min-np", "2", "-np", "2", "-H", "localhost:2"], {}),
    "elastic_commit_10": (
        ["--min-np", "2", "-np", "2", "-H", "localhost:2"],
        {"ELASTIC_COMMIT": "10"},
    ),
}
MODELS = {"mlp": {"ELASTIC_STEPS": "40"}, "mobilenet": {"ELASTIC_STEPS": "24"}}


def _job(
    out: Path, options: list[str], *, transcript: list[str] | None = None, **env: str
) -> dict[int, dict]:
    variables = {
        **os.environ,
        "ELASTIC_OUT": str(out),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PYTHONPATH": str(REPO),
        **env,
    }
    done = subprocess.run(
        [str(DDLRUN), *options, str(WORKER)],
        cwd=out,
        env=variables,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if transcript is not None:
        transcript.append(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"job {options} {env} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


def _equal(results: dict[int, dict]) -> bool:
    weights = [r["weights"] for r in results.values()]
    return all(w == weights[0] for w in weights[1:])


def recovery() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        results = _job(
            out,
            ["--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2", "-np", "4"],
            ELASTIC_KILL="3,1,5",
        )
        killed = float((out / "killed").read_text())
        steps = results[0]["steps"]
        after = next(t for t, size, _, _ in steps if size == 2)
        # batches finished at 4 ranks after the killed rank's last one: trained, never
        # committed, rolled back (the step in flight at the kill is re-run in any case)
        rolled_back = sum(1 for _, size, e, b in steps if size == 4 and (e, b) > (1, 5))
        return {
            "ranks_before": 4,
            "ranks_after": results[0]["size"],
            "batches_per_commit": 1,
            "recovery_seconds": round(after - killed, 3),
            "batches_rolled_back": rolled_back,
            "replicas_bitwise_equal": _equal(results),
        }


def _discovery(out: Path, hosts: str) -> Path:
    """A discovery script printing ``out/hosts`` (the worker appends to it), which holds ``hosts``."""
    (out / "hosts").write_text(hosts)
    script = out / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {out / 'hosts'}\n")
    script.chmod(0o755)
    return script


def growth() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        script = _discovery(out, "localhost:2\n")
        results = _job(
            out,
            ["--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script)],
            ELASTIC_GROW="127.0.0.1:2",
        )
        added = float((out / "added").read_text())
        first = next(t for t, size, _, _ in results[0]["steps"] if size == 4)
        return {
            "ranks_before": 2,
            "ranks_after": results[0]["size"],
            "growth_seconds": round(first - added, 3),
            "replicas_bitwise_equal": _equal(results),
        }


def node_loss_rehearsal(link: str = "1gbit") -> dict:
    """A virtual node's ranks SIGKILLed on the rehearsal cluster, then a fresh node listed.

    ``ddlrun --rehearse 3 --link 1gbit``: virtual nodes (network namespaces
    joined by shaped links, each with its own Open MPI daemon), the job on
    ``node0`` and ``node1`` x 2 ranks. Launch rank 3 takes ``node1`` out of the
    discovery output and SIGKILLs both ranks of ``node1`` after batch 5 of
    epoch 1; rank 0 lists ``node2:2`` after batch 3 of epoch 2, and the job
    grows back to 4 ranks by spawning two onto ``node2`` through its daemon.
    (``node1`` itself cannot take ranks again within the job: Open MPI 5.0
    fails to start ranks on a remote daemon that ran ranks of the job before;
    see docs/elastic.md.)
    """
    from ddl_tf.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": f"rehearsal cluster unavailable: {reason}"}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        script = _discovery(out, "node0:2\nnode1:2\n")
        options = [
            "--rehearse", "3", "--link", link, "-np", "4", "--min-np", "2", "--max-np", "4",
            "--host-discovery-script", str(script), "--blacklist-cooldown-range", "1", "1",
        ]  # fmt: skip
        results = _job(
            out,
            options,
            ELASTIC_KILL="3,1,5",
            ELASTIC_KILL_HOST="1",
            ELASTIC_GROW="node2:2",
            ELASTIC_GROW_AT="2,3",
            ELASTIC_EPOCHS="4",
        )
        killed = float((out / "killed").read_text())
        added = float((out / "added").read_text())
        steps = results[0]["steps"]
        recovered = next(t for t, size, _, _ in steps if size == 2 and t > killed)
        grown = next(t for t, size, _, _ in steps if size == 4 and t > added)
        return {
            "cluster": f"virtual nodes x 2 ranks, links {link} each direction",
            "lost": "node1 (both ranks SIGKILLed)",
            "replacement": "node2 (listed by discovery, 2 ranks spawned)",
            "ranks_before": 4,
            "ranks_after_loss": 2,
            "ranks_after_regrowth": results[0]["size"],
            "recovery_seconds": round(recovered - killed, 3),
            "regrowth_seconds": round(grown - added, 3),
            "batches_per_commit": 1,
            "replicas_bitwise_equal": _equal(results),
        }


CRASH_RUNS = 3


def _crash_run(link: str, transcript: list[str] | None = None) -> dict:
    """One node-crash rehearsal run (see :func:`node_crash_rehearsal`); its figures."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        results = _job(
            out,
            ["--rehearse", "2", "--link", link, "-np", "4", "--min-np", "2"],
            transcript=transcript,
            ELASTIC_KILL="3,0,8",
            ELASTIC_KILL_NODE="1",
            ELASTIC_COMMIT_LOG="1",
            ELASTIC_SLEEP="0.1",
        )
        killed = float((out / "killed").read_text())
        log = [json.loads(line) for line in (out / "commits.jsonl").read_text().splitlines()]
    survivors = [r for r in log if r["relaunch"] == 0 and r["host"] == "node0"]
    committed = [r for r in survivors if "entered" not in r]
    reformed = [r["time"] for r in survivors if r.get("entered") and r["size"] == 2]
    entered = [r for r in log if r["relaunch"] == 1 and r.get("entered")]
    resumed = entered[0]["commit"]
    digests = [r["digest"] for r in committed if r["commit"] == resumed]
    return {
        "recovery_seconds": round(min(t for t, *_ in results[0]["steps"]) - killed, 3),
        "in_job_reform_seconds": round(min(reformed) - killed, 3) if reformed else None,
        "ranks_after": results[0]["size"],
        "processes_restarted": all(r["relaunch"] == 1 for r in results.values()),
        "newest_survivor_commit": max(r["commit"] for r in committed),
        "resumed_commit": resumed,
        "resumed_bitwise_from_that_commit": bool(digests)
        and all(r["digest"] == digests[-1] for r in entered),
        "replicas_bitwise_equal": _equal(results),
    }


def node_crash_rehearsal(link: str = "1gbit") -> dict:
    """A virtual node crashing whole: its ranks and its Open MPI daemon SIGKILLed at once.

    ``ddlrun --rehearse 2 --link 1gbit -np 4 --min-np 2`` (2 virtual nodes x 2
    ranks). Launch rank 3 SIGKILLs every process of ``node1``'s network
    namespace (both ranks, the daemon, the launch agent) after batch 8 of
    epoch 0; steps sleep 0.1 s so that training goes on for seconds after it.
    Open MPI 5.0's runtime then ends ``node0``'s ranks too (before that, they
    re-form by themselves over ULFM and train on); ``ddlrun`` relaunches the
    job on ``node0``, and the 2 new processes (TensorFlow imported, model
    built) resume from the newest commit ``node0``'s ranks mirrored in
    ``/dev/shm``. Each rank logs every commit's number and a digest of its
    values before committing, and what it starts from after the relaunch.
    ``CRASH_RUNS`` runs; the seconds are each run's and their median.
    """
    from ddl_tf.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": f"rehearsal cluster unavailable: {reason}"}
    runs = []
    for _ in range(CRASH_RUNS):
        runs.append(_crash_run(link))
        print(f"node crash: {runs[-1]}", flush=True)
    seconds = [r["recovery_seconds"] for r in runs]
    return {
        "cluster": f"2 virtual nodes x 2 ranks, links {link} each direction",
        "lost": "node1: every process of its namespace (2 ranks, its Open MPI daemon) SIGKILLed",
        "ranks_before": 4,
        "ranks_after": min(r["ranks_after"] for r in runs),
        "recovery_seconds": round(statistics.median(seconds), 3),
        "recovery_seconds_max": max(seconds),
        "processes_restarted": all(r["processes_restarted"] for r in runs),
        "commits_lost": max(r["newest_survivor_commit"] - r["resumed_commit"] for r in runs),
        "resumed_bitwise_from_commit": all(r["resumed_bitwise_from_that_commit"] for r in runs),
        "replicas_bitwise_equal": all(r["replicas_bitwise_equal"] for r in runs),
        "batches_per_commit": 1,
        "runs": runs,
    }


GROWTH_RUNS = 3


def growth_rehearsal(link: str = "1gbit", runs: int = GROWTH_RUNS) -> dict:
    """Growth without a pause, on the rehearsal cluster: a node listed while the job trains.

    ``ddlrun --rehearse 2 --link 1gbit --min-np 2 --max-np 4`` with a discovery
    script listing ``node0:2``; rank 0 adds ``node1:2`` after batch 3 of epoch 1
    and trains on (no wait). Rank 0 starts the 2 new ranks through ``node1``'s
    daemon in the background; they import TensorFlow and connect while the
    job trains (steps sleep 0.1 s, as a node's own cores would leave the
    others' free), and join at the first commit after that. Per run: seconds
    from the write to the first step at 4 ranks (discovery's 1 s poll
    included), the survivors' longest pause between two steps around the
    growth against their median step (the steps lost to growth), the steps
    trained at 2 ranks while the newcomers started, and whether replicas end
    bitwise equal. ``runs`` runs; the seconds are each run's and their median.
    """
    from ddl_tf.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": f"rehearsal cluster unavailable: {reason}"}
    rows = []
    for _ in range(runs):
        rows.append(_growth_run(link))
        print(f"growth: {rows[-1]}", flush=True)
    seconds = [r["growth_seconds"] for r in rows]
    lost = [r["steps_lost"] for r in rows]
    return {
        "cluster": f"2 virtual nodes, links {link} each direction",
        "grown": "node1:2 listed by discovery while node0's 2 ranks train (steps of 0.1 s)",
        "ranks_before": 2,
        "ranks_after": min(r["ranks_after"] for r in rows),
        "growth_seconds": round(statistics.median(seconds), 3),
        "growth_seconds_max": max(seconds),
        "pause_seconds": round(statistics.median(r["pause_seconds"] for r in rows), 3),
        "steps_lost": round(statistics.median(lost), 1),
        "steps_lost_max": max(lost),
        "step_seconds": round(statistics.median(r["step_seconds"] for r in rows), 3),
        "steps_while_starting": min(r["steps_while_starting"] for r in rows),
        "replicas_bitwise_equal": all(r["replicas_bitwise_equal"] for r in rows),
        "runs": rows,
    }


def _growth_run(link: str, transcript: list[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        script = _discovery(out, "node0:2\n")
        options = [
            "--rehearse", "2", "--link", link, "--min-np", "2", "--max-np", "4",
            "--host-discovery-script", str(script),
        ]  # fmt: skip
        results = _job(
            out,
            options,
            transcript=transcript,
            ELASTIC_GROW="node1:2",
            ELASTIC_GROW_AT="1,3",
            ELASTIC_GROW_WAIT="0",
            ELASTIC_SLEEP="0.1",
            ELASTIC_EPOCHS="12",  # 20 s of training after the write: room for a slow start
        )
        added = float((out / "added").read_text())
    return _growth_figures(results, added)


def _growth_figures(results: dict[int, dict], added: float) -> dict:
    """Growth's figures from rank 0's steps ``(time, size, epoch, batch)`` and the write time."""
    steps = results[0]["steps"]
    times = [t for t, *_ in steps]
    first = next((i for i, (t, size, _, _) in enumerate(steps) if size == 4 and t > added), None)
    if first is None:
        sizes = sorted({size for _, size, _, _ in steps})
        raise RuntimeError(
            f"the job trained no step at 4 ranks after the host was listed (sizes seen: {sizes}, "
            f"{len(steps)} steps): the new ranks did not join before training ended; run again "
            "(the `--repeat` bench counts such runs)"
        )
    before = [b - a for a, b in zip(times, times[1:first], strict=False) if b <= added]
    step = statistics.median(before)
    # the survivors' longest gap between two steps from the write to the first step at 4
    around = [b - a for a, b in zip(times, times[1:], strict=False) if added <= b <= times[first]]
    pause = max(around) - step
    return {
        "growth_seconds": round(times[first] - added, 3),
        "ranks_after": results[0]["size"],
        "step_seconds": round(step, 3),
        "pause_seconds": round(pause, 3),
        "steps_lost": round(pause / step, 1),
        "steps_while_starting": sum(1 for t, size, _, _ in steps if size == 2 and t > added),
        "replicas_bitwise_equal": _equal(results),
    }


REPEAT_RUNS = 20
OUTCOMES = (
    # (text in the job's output, why it counts) - the first that matches names a failed run
    (
        "the job finished before they were admitted",
        "the job ended before the new ranks were ready (they were sent away)",
    ),
    ("listener thread failed to start", "mpirun failed at start-up (PMIx listener thread)"),
    (
        "that host is dropped",
        "the new ranks never connected; ddlrun dropped their host and relaunched the job",
    ),
    ("relaunching the elastic job", "Open MPI lost a daemon; ddlrun relaunched the job"),
    ("mpirun died of", "mpirun crashed (PRRTE 3.0 connect defect)"),
    ("Open MPI lost its daemon", "Open MPI lost a daemon"),
    ("did not connect within", "the new ranks did not connect in time"),
)
NOTES = (
    # (text, note) on runs that succeeded: what ddlrun survived on its own
    ("ddlrun: mpirun failed at start-up", "ddlrun launched again after a start-up failure"),
    ("after the elastic job finished", "mpirun crashed after the job finished (exit 0)"),
    ("pmix_server_dyn.c at line", "PRRTE's connect defect printed its PMIX ERROR"),
)


def _attempt(kind: str, link: str) -> dict:
    """One rehearsal run of ``kind`` (``node_crash`` or ``growth``): its figures, or why not."""
    transcript: list[str] = []
    started = time.monotonic()
    try:
        figures = (_crash_run if kind == "node_crash" else _growth_run)(link, transcript)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": "hang (no end within the bench's 900 s limit)"}
    except Exception as err:  # noqa: BLE001 - a failed run is a result here
        text = "".join(transcript) + str(err)
        why = next((w for key, w in OUTCOMES if key in text), None)
        if why is None:
            lines = [line for line in text.splitlines() if line.strip()]
            why = f"{type(err).__name__}: {lines[-1][:200] if lines else err}"
        elif kind == "growth" and "relaunching" in text:
            why = "the new node's daemon was lost (PRRTE's connect defect); relaunched without it"
        lines = [line for line in text.splitlines() if line.strip() and "oneDNN" not in line]
        return {
            "ok": False,
            "why": why,
            "seconds": round(time.monotonic() - started, 1),
            "output_tail": lines[-25:],
        }
    text = "".join(transcript)
    notes = [note for key, note in NOTES if key in text]
    return {"ok": True, **figures, "notes": notes, "seconds": round(time.monotonic() - started, 1)}


def repeat(
    runs: int = REPEAT_RUNS, link: str = "1gbit", kinds: tuple[str, ...] = ("node_crash", "growth")
) -> dict:
    """The node-crash and growth rehearsals (``kinds``) ``runs`` times each in a row, alternating.

    A run that fails (no finished job, no growth, wrong figures, a hang) is run
    once more: it *needed a retry*, and its reason is counted; a run whose
    retry fails too is *lost*. Runs that succeeded may still have needed
    ddlrun's own recovery (a start-up failure launched again, mpirun crashing
    after the job finished): counted as notes.
    """
    from collections import Counter

    from ddl_tf.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": f"rehearsal cluster unavailable: {reason}"}
    attempts: dict[str, list[list[dict]]] = {kind: [] for kind in kinds}
    for index in range(runs):
        for kind, tries in attempts.items():
            first = _attempt(kind, link)
            tries.append([first] if first["ok"] else [first, _attempt(kind, link)])
            print(f"{kind} {index + 1}/{runs}: {[t.get('why', 'ok') for t in tries[-1]]}")
    summary = {"runs_each": runs, "cluster": f"2 virtual nodes, links {link} each direction"}
    for kind, tries in attempts.items():
        done = [t[-1] for t in tries if t[-1]["ok"]]
        figure = "recovery_seconds" if kind == "node_crash" else "growth_seconds"
        row = {
            "runs": runs,
            "ok_first_try": sum(1 for t in tries if len(t) == 1),
            "needed_a_retry": sum(1 for t in tries if len(t) == 2),
            "lost": sum(1 for t in tries if not t[-1]["ok"]),
            "hangs": sum(1 for t in tries for a in t if a.get("why", "").startswith("hang")),
            "retry_reasons": dict(Counter(a["why"] for t in tries for a in t if not a["ok"])),
            "notes": dict(Counter(n for a in done for n in a["notes"])),
            "retry_reasons_text": _counted(a["why"] for t in tries for a in t if not a["ok"]),
            "notes_text": _counted(n for a in done for n in a["notes"]),
            f"{figure}_median": round(statistics.median(a[figure] for a in done), 3)
            if done
            else None,
            f"{figure}_max": max((a[figure] for a in done), default=None),
            "replicas_bitwise_equal": all(a["replicas_bitwise_equal"] for a in done),
        }
        if kind == "growth" and done:
            row["steps_lost_median"] = round(statistics.median(a["steps_lost"] for a in done), 1)
            row["pause_seconds_median"] = round(
                statistics.median(a["pause_seconds"] for a in done), 3
            )
            row["within_10_s"] = sum(1 for a in done if a["growth_seconds"] <= 10.0)
        if kind == "node_crash" and done:
            row["commits_lost_max"] = max(
                a["newest_survivor_commit"] - a["resumed_commit"] for a in done
            )
        row["attempts"] = [[{k: v for k, v in a.items() if k != "runs"} for a in t] for t in tries]
        summary[kind] = row
    return summary


def _counted(items) -> str:
    """``'2 x why; 1 x other'``, or ``'none'`` (for the docs, which quote it as is)."""
    from collections import Counter

    counts = Counter(items)
    return "; ".join(f"{n} x {what}" for what, n in counts.most_common()) or "none"


def _median_step(results: dict[int, dict]) -> float:
    steps = [t for t, _, epoch, _ in results[0]["steps"] if epoch >= 1]
    return statistics.median(b - a for a, b in zip(steps, steps[1:], strict=False))


def cost() -> dict:
    seconds: dict[str, dict[str, list[float]]] = {m: {c: [] for c in CONFIGS} for m in MODELS}
    for _ in range(ROUNDS):
        for model, model_env in MODELS.items():
            for name, (options, env) in CONFIGS.items():
                with tempfile.TemporaryDirectory() as folder:
                    variables = {"ELASTIC_MODEL": model, **model_env, **env}
                    results = _job(Path(folder), options, transcript=None, **variables)
                seconds[model][name].append(_median_step(results))
                print(f"{model} {name}: {seconds[model][name][-1] * 1e3:.1f} ms", flush=True)
    rows = {}
    for model, by_config in seconds.items():
        fixed = statistics.median(by_config["fixed"])
        rows[model] = {
            name: {
                "step_ms": round(statistics.median(values) * 1e3, 2),
                "runs_ms": [round(v * 1e3, 2) for v in values],
                "vs_fixed": round(statistics.median(values) / fixed, 3),
            }
            for name, values in by_config.items()
        }
    return rows


PARTS = {
    "recovery": recovery,
    "growth": growth,
    "node_loss_rehearsal": node_loss_rehearsal,
    "node_crash_rehearsal": node_crash_rehearsal,
    "growth_rehearsal": growth_rehearsal,
    "cost": cost,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        choices=sorted(PARTS),
        action="append",
        help="measure these parts again and keep the others from results/elastic.json",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="only run the node-crash and growth rehearsals N times each in a row (issue 45's "
        "twenty-run check, N=20) and keep the other parts",
    )
    parser.add_argument(
        "--repeat-only",
        choices=("node_crash", "growth"),
        help="with --repeat: run only this rehearsal, and keep the other's rows",
    )
    args = parser.parse_args()
    path = RESULTS / "elastic.json"
    started = time.time()
    keep = args.only or args.repeat
    result = json.loads(path.read_text()) if keep and path.exists() else {}
    result["machine"] = machine_info()
    measured = result.setdefault("measured", {})
    if args.repeat_only and not args.repeat:
        parser.error("--repeat-only needs --repeat N")
    kinds = (args.repeat_only,) if args.repeat_only else ("node_crash", "growth")
    kept = {k: v for k, v in result.get("repeat", {}).items() if k not in kinds}
    for kind in ("node_crash", "growth"):  # when each rehearsal kept was measured
        if kind in kept and "repeat" in measured:
            measured.setdefault(f"repeat_{kind}", measured["repeat"])
    parts = (
        {"repeat": lambda: {**kept, **repeat(args.repeat, kinds=kinds)}} if args.repeat else PARTS
    )
    for name, part in parts.items():
        if args.only and name not in args.only:
            continue
        result[name] = part()
        measured[name] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        if name == "repeat":
            for kind in kinds:
                measured[f"repeat_{kind}"] = measured[name]
        print(json.dumps({name: result[name]}), flush=True)
    result["created"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result["seconds"] = round(time.time() - started, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(path, result)


if __name__ == "__main__":
    main()
