"""Model state off the device: GPT-2 small to XL on one GPU, and per rank on 8 with ZeRO (simulated).

Run by ``make bench`` (or ``python benchmarks/bench_model_state.py [--models small,xl]``;
a partial run keeps the other models' entries). For each of GPT-2's four
published sizes (``tflms.zoo.GPT2_SIZES``; sequence 1024, untied
50257-word head, AdamW in float32, dropout 0.1), the Keras training step is
traced as ``tflms.analyze`` traces it, in three placements:

* ``plain``: weights, gradients, AdamW's slots and activations on the device;
* ``offload``: AdamW's state on the host, the update there
  (``OffloadedOptimizer``, ``LMSConfig(offload_optimizer=True)``);
* ``stream``: the weights on the host too (``tflms.keras.weights_on_host``),
  streamed in ahead of each use by the plan of ``LMSConfig(offload_weights=True,
  swap=False)`` (no activation swapped in these three);
* ``stream_swap``: the same, and tflms's default activation swaps
  (``LMSConfig(offload_weights=True)``);
* ``stream_tuned`` (GPT-2 XL on the V100-16GB only): the same, with the activation plan
  ``tflms.autotune`` finds for the GPU's memory over PCIe3 (no safety margin;
  batch 8 first, reported as "at least 8" when a plan fits there, else the
  largest fitting batch bisected below it), and over NVLink2 at that batch:
  what a user asking for ``memory_budget="V100-16GB"`` gets.
* ``zero2_tuned`` (GPT-2 XL on the V100-16GB only): per rank on 8 ranks with
  ddl_tf's ``DistributedOptimizer(AdamW, sharding="gradients")`` (ZeRO-2)
  and no offload: the weights and the rank's share of AdamW's slots on the
  device, and the auto-tuner's activation plan for the GPU, at batch 8 per
  rank (the goal's batch; no other is tried: each try is one ``mpirun -np 8``
  of ``model_state_rank.py`` of about 25 minutes here, where eight processes
  build the model, without memory, and the sharded optimizer, and rank 0
  traces the step and searches a plan per link). Simulated on the step rank
  0 really traces: its bucketed reduce-scatters, its own update and the fused
  allgathers of the weights. Where no plan fits, the smallest peak the
  search reached is recorded.

Two logical CPU devices stand in for the GPU (``CPU:1``) and its host
(``CPU:0``), so each view places every variable where it lives. The
variables are made without memory (TensorFlow's ``UninitializedVariable``,
for those of 8 MiB or more): the step is traced, never run, so GPT-2 XL's 26
GB of weights and AdamW state need not exist on this 24 GiB machine.

For each placement and device (V100-16GB, A100-80GB; ``accounting=
"realistic"``), the largest batch whose simulated device peak fits: two
traced batches give the peak's slope, the batch it predicts is traced and
checked, then its neighbours until the boundary is found. At that batch,
the predicted step time over PCIe3 and NVLink2 and its ratio to the busy
time of the compute stream (the GPU's own work), and the host peak (pinned).

Per rank on 8 ranks with ZeRO-1 and no plan
(``DistributedOptimizer(sharding="optimizer")``): each rank keeps 1/8 of
AdamW's slots, which are resident all step, so its device peak is the plain
one minus 7/8 of the slot bytes (derived from the plain simulation, not
simulated with the collectives; ``zero2_tuned`` is simulated).

Published anchors, quoted beside (not reproduced): ZeRO-Offload (Ren et al.,
USENIX ATC 2021) trains a 13B-parameter model on one V100-32GB; ZeRO
(Rajbhandari et al., SC 2020, figure 1) puts a 7.5B model's per-device model
state at 120 GB replicated, 31.4 GB with optimizer-state sharding and
16.6 GB with gradients sharded too, on 64 ranks with mixed precision.

Every figure is simulated; none was measured on a GPU. Writes
``benchmarks/results/model_state.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(  # before anything starts TensorFlow's devices
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import keras  # noqa: E402
from tensorflow.python.ops.resource_variable_ops import (  # noqa: E402
    UninitializedVariable,  # a variable without memory: the SavedModel loader's own
)

import tflms  # noqa: E402
from benchmarks.common import RESULTS, provenance, setup_logging, write_result  # noqa: E402
from ddl_tf.cluster.mpi import job_environment  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.cost.hardware import get_device  # noqa: E402
from tflms.errors import PlanInfeasibleError  # noqa: E402
from tflms.keras import OffloadedOptimizer, weights_on_host  # noqa: E402

HOST, DEVICE = "/device:CPU:0", "/device:CPU:1"
GPUS = ("V100-16GB", "A100-80GB")
LINKS = ("pcie3", "nvlink2")
PLACEMENTS = ("plain", "offload", "stream", "stream_swap", "stream_tuned", "zero2_tuned")
TUNED = ("stream_tuned", "zero2_tuned")
"""Placements whose plan is the auto-tuner's: a batch fits when it finds one."""
TUNED_GPUS = ("V100-16GB",)  # each autotune of GPT-2 XL takes minutes
TUNED_MODELS = ("xl",)  # the size the goal names; the others' searches add an hour here
TUNED_CAP = 8
"""The largest batch the auto-tuner is asked for: a plan that fits there is reported as
"at least 8" (``capped``); below it the largest fitting batch is bisected."""
RANKS = 8
HOLLOW_BYTES = 8 << 20
OUT = RESULTS / "model_state.json"
ANCHORS = {
    "zero_offload": "ZeRO-Offload (Ren et al., USENIX ATC 2021): 13B parameters trained on one "
    "V100-32GB with the optimizer state and update on the host",
    "zero": "ZeRO (Rajbhandari et al., SC 2020, fig. 1): 7.5B parameters, 64 ranks, mixed "
    "precision Adam: per-device model state 120 GB replicated, 31.4 GB with the optimizer "
    "state sharded (ZeRO-1), 16.6 GB with the gradients sharded too (ZeRO-2)",
}


def _hollow(next_creator, **kwargs):
    """Make a large variable without memory (its shape, dtype and device only)."""
    initial = kwargs.get("initial_value")
    value = tf.convert_to_tensor(initial() if callable(initial) else initial, kwargs.get("dtype"))
    if value.shape.num_elements() * value.dtype.size < HOLLOW_BYTES:
        return next_creator(**kwargs)  # small ones are real (read while the model is built)
    return UninitializedVariable(
        shape=value.shape,
        dtype=value.dtype,
        name=kwargs.get("name"),
        trainable=kwargs.get("trainable", True),
    )


class Traces:
    """The views of one size with its variables in one place, traced on demand by batch.

    Args:
        size: A key of ``zoo.GPT2_SIZES``.
        where: ``"plain"`` (all on the device), ``"offload"`` (AdamW's state on
            the host) or ``"host"`` (the weights too).
    """

    def __init__(self, size: str, where: str):
        self.size, self.where = size, where
        self.views: dict[int, object] = {}
        self.plans: dict[tuple[int, str], object] = {}
        self.parameters = 0

    def _model(self):
        options = zoo.GPT2_SIZES[self.size]
        if self.where == "host":
            with weights_on_host(HOST):
                model = zoo.gpt2(**options)
        else:
            with tf.device(DEVICE):
                model = zoo.gpt2(**options)
        if self.where != "plain":
            model.compile(
                optimizer=OffloadedOptimizer(keras.optimizers.AdamW(1e-4), host_device=HOST),
                loss=model.loss,
                jit_compile=False,
            )
        return model

    def view(self, batch: int):
        if batch not in self.views:
            keras.backend.clear_session()
            gc.collect()
            config = tflms.LMSConfig(device=DEVICE, host_device=HOST, batch_size=batch)
            with tf.variable_creator_scope(_hollow):
                model = self._model()
                with tf.device(DEVICE):
                    self.views[batch] = tflms.analyze(model, batch_size=batch, config=config)
            self.parameters = int(sum(v.shape.num_elements() for v in model.trainable_variables))
            del model
        return self.views[batch]

    def plan(self, batch: int, placement: str, gpu: str = "", link: str = "pcie3"):
        """The plan of ``placement`` at ``batch`` (None: the step as traced).

        ``stream_tuned`` plans are the auto-tuner's for ``gpu`` over ``link``
        (None when no plan fits).
        """
        if placement not in ("stream", "stream_swap", "stream_tuned"):
            return None
        if placement == "stream_tuned":
            key = (batch, placement, gpu, link)
            if key not in self.plans:
                config = _streaming(batch, link=link, safety_margin=0.0)
                try:
                    tuned = tflms.autotune(self.view(batch), gpu, config=config, link=link)
                    self.plans[key] = tuned.plan
                except PlanInfeasibleError:
                    self.plans[key] = None
            return self.plans[key]
        key = (batch, placement)
        if key not in self.plans:
            config = _streaming(batch, swap=placement == "stream_swap")
            self.plans[key] = tflms.make_plan(self.view(batch), config)
        return self.plans[key]


def _streaming(batch: int, **options) -> tflms.LMSConfig:
    """The options of a step whose weights stream from the host."""
    return tflms.LMSConfig(
        device=DEVICE, host_device=HOST, batch_size=batch, offload_weights=True, **options
    )


class Placement:
    """One placement of one size: its traces and its plan."""

    def __init__(self, traces: Traces, name: str):
        self.traces, self.name, self.size = traces, name, traces.size

    def simulate(self, batch: int, gpu: str, link: str):
        """The simulation at ``batch`` on ``gpu`` over ``link``; None: no tuned plan fits."""
        view, plan = self.traces.view(batch), self.traces.plan(batch, self.name, gpu, link)
        if plan is None and self.name == "stream_tuned":
            return None
        return tflms.simulate(view, plan, device=gpu, link=link, baseline=False)


def largest_batch(traces: Placement, gpu: str, log) -> tuple[int, dict]:
    """The largest batch whose simulated peak fits ``gpu``, and the peak per batch tried."""
    limit = get_device(gpu).memory_bytes
    peaks: dict[int, int] = {}

    def peak(batch: int) -> int:
        if batch not in peaks:
            result = traces.simulate(batch, gpu, "pcie3")
            peaks[batch] = result.device_peak_bytes if result is not None else limit + 1
            log(
                f"  {traces.size} {traces.name} {gpu} batch {batch}: {peaks[batch] / 2**30:.2f} GiB"
            )
        return peaks[batch]

    if peak(1) > limit:
        return 0, peaks
    if traces.name in TUNED:  # a tuned plan fits or not: the cap, else bisect
        if peak(TUNED_CAP) <= limit:
            return TUNED_CAP, peaks  # at least this (each try of GPT-2 XL takes minutes)
        fits, fails = 1, TUNED_CAP
        while fails - fits > 1:
            middle = (fits + fails) // 2
            fits, fails = (middle, fails) if peak(middle) <= limit else (fits, middle)
        return fits, peaks
    slope = max(peak(2) - peak(1), 1)
    guess = max(1, 1 + int((limit - peak(1)) // slope))
    if peak(guess) <= limit:
        while peak(guess + 1) <= limit:
            guess += 1
        return guess, peaks
    while guess > 1 and peak(guess) > limit:
        guess -= 1
    return guess, peaks


def study(size: str, placements, row: dict, log) -> dict:
    started = time.perf_counter()
    row = {**row, "sequence": 1024, "optimizer": "AdamW (float32)", **zoo.GPT2_SIZES[size]}
    kept = {"plain": "plain", "offload": "offload"}
    traces: dict[str, Traces] = {}
    counted = row.get("parameters")  # the count the kept placements were traced with
    for placement in placements:
        if placement in TUNED and size not in TUNED_MODELS:
            continue
        if placement == "zero2_tuned":
            row[placement] = _sharded_entry(size, log)
            row["parameters"] = _parameters(row[placement])
            continue
        where = kept.get(placement, "host")
        for other in [w for w in traces if w != where]:
            del traces[other]  # one model's traces at a time
        traces.setdefault(where, Traces(size, where))
        runner = Placement(traces[where], placement)
        entry: dict = {}
        for gpu in TUNED_GPUS if placement in TUNED else GPUS:
            batch, peaks = largest_batch(runner, gpu, log)
            cell = _cell(runner, gpu, batch, peaks)
            if placement == "plain":
                cell["zero1_per_rank"] = _zero1(peaks, 8 * traces[where].parameters, gpu)
            entry[gpu] = {**cell, "parameters": traces[where].parameters}
        row["parameters"] = traces[where].parameters
        row[placement] = entry
    _drop_stale(row, placements, counted, log)
    row["adamw_slot_bytes"] = 8 * row["parameters"]
    times = row.get("analysis_s")
    if isinstance(times, int | float):  # a file written before the times were per run
        times = {",".join(PLACEMENTS[:4]): times}
    row["analysis_s"] = {
        **(times if isinstance(times, dict) else {}),
        ",".join(placements): round(time.perf_counter() - started, 1),
    }
    return row


def _parameters(entry: dict) -> int:
    """The parameter count of the model an entry's cells were traced with (one per entry)."""
    counts = {cell["parameters"] for cell in entry.values() if "parameters" in cell}
    if len(counts) != 1:
        raise ValueError(f"an entry's cells disagree on the model's parameter count: {counts}")
    return counts.pop()


def _drop_stale(row: dict, placements, counted, log) -> None:
    """Remove the kept placements of ``row`` traced from another version of the model.

    A run of some placements keeps the others' entries from the file; after a
    change to the zoo's model those describe a different model. Each entry's
    cells record the parameter count they were traced with (entries written
    before they did: the row's count at the time, ``counted``); an entry
    whose count is not this run's is dropped, and the log names it, so one
    file never mixes two versions of a model.
    """
    for kept in [p for p in PLACEMENTS if p in row and p not in placements]:
        counts = {cell.get("parameters", counted) for cell in row[kept].values()}
        if counts != {row["parameters"]}:
            del row[kept]
            log(
                f"  {kept}: dropped, traced from a model of {counts} parameters, not "
                f"{row['parameters']:,}; run --placements {kept} to measure it again"
            )


def _cell(runner, gpu: str, batch: int, peaks: dict) -> dict:
    """The result entry of one placement on ``gpu``: its largest batch, and each link there."""
    limit = get_device(gpu).memory_bytes
    tuned = runner.name in TUNED
    cell: dict = {
        "largest_batch": batch,
        "capped": tuned and batch == TUNED_CAP,
        "peaks_tried": {  # None: no tuned plan fits at that batch
            str(b): None if p > limit and tuned else p for b, p in sorted(peaks.items())
        },
    }
    for link in LINKS if batch else ():
        result = runner.simulate(batch, gpu, link)
        if result is None:  # no tuned plan over this link at this batch
            cell[link] = {"fits": False}
            continue
        cell[link] = step_figures(result)
    return cell


def step_figures(result) -> dict:
    """A simulated step's device and host peaks, its times and their ratio, for the JSON."""
    return {
        "device_peak_bytes": result.device_peak_bytes,
        "host_peak_bytes": result.host_peak_bytes,
        "step_time_s": round(result.step_time_s, 4),
        "compute_time_s": round(result.compute_time_s, 4),
        "step_over_compute": round(result.step_time_s / result.compute_time_s, 3),
    }


class ShardedRank:
    """Rank 0's step of a ZeRO-2 job of RANKS ranks, simulated by ``model_state_rank.py`` under mpirun.

    One job per batch, which traces the step, simulates it plain and asks the
    auto-tuner for a plan per link on each GPU of TUNED_GPUS.
    """

    name = "zero2_tuned"

    def __init__(self, size: str, log):
        self.size, self.log = size, log
        self.rows: dict[int, dict] = {}

    def row(self, batch: int) -> dict:
        if batch not in self.rows:
            with tempfile.TemporaryDirectory() as tmp:
                done = Path(tmp) / "rank0.json"
                command = [
                    str(Path(sys.executable).with_name("mpirun")),
                    "-np", str(RANKS), "--oversubscribe", "--bind-to", "none",
                    sys.executable, str(HERE / "model_state_rank.py"), "--size", self.size,
                    "--batch", str(batch), "--gpus", ",".join(TUNED_GPUS), "--tune",
                    "--done", str(done),
                ]  # fmt: skip
                env = {
                    **job_environment(os.environ),
                    "PYTHONPATH": str(HERE.parent),
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                    # eight processes build GPT-2 XL's initial values one after another:
                    # give freed buffers back at once, or their sum outgrows 24 GiB
                    "MALLOC_MMAP_THRESHOLD_": "131072",
                    "MALLOC_TRIM_THRESHOLD_": "131072",
                }
                transcript = Path(tmp) / "ranks.log"
                with transcript.open("w") as out:
                    code = subprocess.run(
                        command, env=env, timeout=7200, stdout=out, stderr=subprocess.STDOUT
                    ).returncode
                if code != 0:
                    tail = transcript.read_text()[-3000:]
                    raise RuntimeError(f"the ranks' job failed ({code}):\n{tail}")
                self.rows[batch] = json.loads(done.read_text())
            self.log(f"  {self.size} zero2_tuned batch {batch}: {json.dumps(self.rows[batch])}")
        return self.rows[batch]

    def simulate(self, batch: int, gpu: str, link: str):
        """The tuned step on ``gpu`` over ``link`` (None: the auto-tuner found no plan)."""
        cell = self.row(batch)[gpu][link]
        return SimpleNamespace(**cell) if cell["fits"] else None


def _sharded_entry(size: str, log) -> dict:
    """ZeRO-2 rank 0 at TUNED_CAP per rank: fits (with the links' steps) or its best peaks."""
    runner = ShardedRank(size, log)
    row = runner.row(TUNED_CAP)
    entry: dict = {}
    for gpu in TUNED_GPUS:
        fits = runner.simulate(TUNED_CAP, gpu, "pcie3") is not None
        cell = _cell(runner, gpu, TUNED_CAP if fits else 0, {})
        cell.update(
            batch_tried=TUNED_CAP,
            ranks=row["ranks"],
            rank0_parameters_owned=row["rank0_parameters_owned"],
            rank0_slot_bytes=row["rank0_slot_bytes"],
            untuned_device_peak_bytes=row[gpu]["plain_device_peak_bytes"],
            best_peak_bytes={
                link: row[gpu][link].get("best_peak_bytes", row[gpu][link].get("device_peak_bytes"))
                for link in LINKS
            },
            search_s={link: row[gpu][link]["search_s"] for link in LINKS},
            parameters=row["parameters"],
        )
        entry[gpu] = cell
    return entry


def _zero1(peaks: dict, slot_bytes: int, gpu: str) -> dict:
    """ZeRO-1 on RANKS ranks, derived: the plain peak less (1 - 1/N) of the resident slots."""
    limit = get_device(gpu).memory_bytes
    saved = slot_bytes - slot_bytes // RANKS
    per_rank = {b: p - saved for b, p in peaks.items()}
    fitting = [b for b, p in per_rank.items() if p <= limit]
    slope = (peaks[2] - peaks[1]) if 2 in peaks and 1 in peaks else None
    batch = max(fitting, default=0)
    if slope and per_rank[1] <= limit:  # the affine model of the plain peak, as measured
        batch = max(batch, 1 + int((limit - per_rank[1]) // slope))
    return {
        "ranks": RANKS,
        "slot_bytes_saved": saved,
        "per_rank_peak_bytes": {str(b): p for b, p in sorted(per_rank.items())},
        "largest_batch_per_rank": batch,
        "derived": "plain simulated peak - (1 - 1/8) * AdamW slot bytes; batch from its slope",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.GPT2_SIZES))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    args = parser.parse_args()
    placements = args.placements.split(",")
    setup_logging()
    old = json.loads(OUT.read_text()).get("models", {}) if OUT.exists() else {}

    def log(line: str) -> None:
        print(line, flush=True)  # noqa: T201

    models = dict(old)
    for size in args.models.split(","):
        models[size] = study(size, placements, models.get(size, {}), log)
        done = [p for p in placements if p in models[size]]
        log(f"{size}: " + json.dumps({p: _batches(models[size][p]) for p in done}))
        write_result(  # after each model: a long run keeps what it finished
            OUT.name,
            {
                **provenance("GPT-2 small to XL, the model state on the device, host or 8 ranks"),
                "accounting": "realistic",
                "anchors": ANCHORS,
                "models": {k: models[k] for k in zoo.GPT2_SIZES if k in models},
            },
        )
    return 0


def _batches(entry: dict) -> dict:
    return {gpu: cell["largest_batch"] for gpu, cell in entry.items()}


if __name__ == "__main__":
    sys.exit(main())
