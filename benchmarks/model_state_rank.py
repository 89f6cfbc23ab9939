"""One rank of ``bench_model_state.py``'s sharded placement: GPT-2's step as rank 0 of N traces it.

Run by the benchmark under ``mpirun -np N`` (``--ranks``). Every rank builds
the same GPT-2 with its large variables made without memory (as the
benchmark's single-process placements do), wraps AdamW in ddl_tf's
``DistributedOptimizer(sharding="gradients")`` (ZeRO-2) and builds it: the
ranks check together that their variables agree, and each builds the slots
of the variables it owns only. Rank 0 then traces the Keras training step
with tflms (the real sharded step: bucketed reduce-scatters of the
gradients, the update of its own variables, the bucketed allgather of the
weights), simulates it on each GPU with the activations on the device, and
asks the auto-tuner for a plan that fits the GPU (no optimizer state or
weight offload; activations swapped or recomputed), over each link. The
other ranks wait for rank 0's result file (sleeping, not in an MPI call,
which would spin on this machine's two cores). The step is traced, never
run, so no collective runs after the build.

Prints one JSON line (rank 0): per GPU, the plain step's device peak, and
per link the tuned plan's device and host peaks, step and compute times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ddl_tf.keras as hvd  # noqa: E402
import tflms  # noqa: E402
from benchmarks.bench_model_state import DEVICE, HOST, _hollow, step_figures  # noqa: E402 (sets the devices)
from tflms import zoo  # noqa: E402
from tflms.cost.hardware import get_device  # noqa: E402
from tflms.errors import PlanInfeasibleError  # noqa: E402

LINKS = ("pcie3", "nvlink2")


def simulate(model, batch: int, gpus: list[str], tune: bool) -> dict:
    """Rank 0's step at ``batch``: the plain peak, and the tuned plan per GPU and link."""
    config = tflms.LMSConfig(device=DEVICE, host_device=HOST, batch_size=batch)
    started = time.perf_counter()
    with tf.device(DEVICE):
        view = tflms.analyze(model, batch_size=batch, config=config)
    out: dict = {"analysis_s": round(time.perf_counter() - started, 1)}
    for gpu in gpus:
        plain = tflms.simulate(view, None, device=gpu, link="pcie3", baseline=False)
        cell: dict = {
            "plain_device_peak_bytes": plain.device_peak_bytes,
            "plain_fits": plain.device_peak_bytes <= get_device(gpu).memory_bytes,
        }
        for link in LINKS if tune else ():
            started = time.perf_counter()
            tuned_config = tflms.LMSConfig(
                device=DEVICE, host_device=HOST, batch_size=batch, safety_margin=0.0
            )
            try:
                tuned = tflms.autotune(view, gpu, config=tuned_config, link=link)
            except PlanInfeasibleError as err:
                cell[link] = {
                    "fits": False,
                    "best_peak_bytes": err.best_peak_bytes,
                    "why": str(err).splitlines()[0][:300],
                }
            else:
                result = tflms.simulate(view, tuned.plan, device=gpu, link=link, baseline=False)
                cell[link] = {"fits": True, **step_figures(result)}
            cell[link]["search_s"] = round(time.perf_counter() - started, 1)
        out[gpu] = cell
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="xl")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpus", default="V100-16GB")
    parser.add_argument("--tune", action="store_true", help="also search a plan per link")
    parser.add_argument("--done", required=True, help="the file rank 0 writes when it is done")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with tf.variable_creator_scope(_hollow):
        with tf.device(DEVICE):
            model = zoo.gpt2(**zoo.GPT2_SIZES[args.size])
        optimizer = hvd.DistributedOptimizer(keras.optimizers.AdamW(1e-4), sharding="gradients")
        model.compile(optimizer=optimizer, loss=model.loss, jit_compile=False)
        with tf.device(DEVICE):
            optimizer.build(model.trainable_variables)  # collective: the ranks' variables agree
        sharded = optimizer.inner_optimizer
        own = sum(sharded.plan.sizes[i] for i in sharded.plan.mine())
        if rank == 0:
            row = {
                "ranks": size,
                "batch": args.batch,
                "parameters": int(sum(sharded.plan.sizes)),
                "rank0_parameters_owned": int(own),
                "rank0_slot_bytes": int(
                    sum(
                        v.shape.num_elements() * np.dtype(v.dtype).itemsize
                        for v in sharded.variables
                        if len(v.shape)
                    )
                ),
                **simulate(model, args.batch, args.gpus.split(","), args.tune),
            }
            tmp = Path(args.done).with_suffix(".tmp")
            tmp.write_text(json.dumps(row))
            tmp.replace(args.done)
            print(json.dumps(row), flush=True)  # noqa: T201
        else:
            while not os.path.exists(args.done):
                time.sleep(1.0)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
