"""Train a 3D U-Net on BraTS-like volumes with tflms (LMS) and ddl_tf (data parallel).

Launch on 2 ranks (``make demo`` does this)::

    ddlrun -np 2 examples/unet3d_demo.py --out out/demo

Each rank trains on its shard of the volumes with ``LMSCallback`` swapping
long-lived activations to host memory and ``DistributedOptimizer`` averaging
gradients; rank 0 shows the Keras progress bar. At the end rank 0 prints a
report (LMS plan, per-epoch loss and Dice per class, throughput,
communication share, simulated GPU peaks at the demo size and at the seed
paper's 144^3 and 192^3) and writes a JSON summary, a training-curve PNG and
a memory-timeline PNG.

Exit codes: 0 ok, 2 bad flags or data, 3 no MPI / ddl_tf could not start.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "parse_args"]

logger = logging.getLogger("unet3d_demo")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="3D U-Net with tflms + ddl_tf on BraTS-like MRI volumes.",
        epilog="example: ddlrun -np 2 examples/unet3d_demo.py --size 32 --epochs 20 --out out/demo",
    )
    p.add_argument(
        "--data", help="folder of real volumes (see examples/unet3d/data.py); default: synthetic"
    )
    p.add_argument(
        "--volumes", type=int, default=32, help="synthetic training volumes in total (default 32)"
    )
    p.add_argument(
        "--val-volumes", type=int, default=4, help="synthetic validation volumes (default 4)"
    )
    p.add_argument("--size", type=int, default=32, help="cube edge in voxels (default 32)")
    p.add_argument("--depth", type=int, default=2, help="U-Net poolings (default 2)")
    p.add_argument(
        "--base-filters", type=int, default=8, help="filters at the top level (default 8)"
    )
    p.add_argument("--epochs", type=int, default=20, help="epochs (default 20)")
    p.add_argument(
        "--batch-size", type=int, default=2, help="volumes per rank per step (default 2)"
    )
    p.add_argument(
        "--lr",
        type=float,
        default=3e-3,
        help="Adam learning rate, not scaled by ranks (default 3e-3)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lms", action="store_true", help="train without LMSCallback")
    p.add_argument(
        "--lms-config",
        default="{}",
        help="tflms.LMSConfig options as JSON, e.g. '{\"min_tensor_bytes\": 0}' (default: the defaults)",
    )
    p.add_argument(
        "--simulate-sizes",
        default="144,176,208",
        help="cube sizes of the seed paper's model to simulate on a V100-16GB "
        "(default 144,176,208; the paper: 144 -> 192)",
    )
    p.add_argument(
        "--sim-depth",
        type=int,
        default=5,
        help="isensee2017 depth for the simulated sizes (default 5, the paper's)",
    )
    p.add_argument(
        "--sim-base-filters",
        type=int,
        default=16,
        help="base filters for the simulated sizes (default 16, the paper's)",
    )
    p.add_argument(
        "--link", default="nvlink2", help="CPU-GPU link preset for overheads (default nvlink2)"
    )
    p.add_argument("--out", default="out/demo", help="output folder (default out/demo)")
    args = p.parse_args(argv)
    problems = []
    for name in ("volumes", "val_volumes", "size", "depth", "base_filters", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.size % 2**args.depth:
        problems.append(f"--size {args.size} must be divisible by 2**depth = {2**args.depth}")
    try:
        args.simulate_sizes = [int(s) for s in args.simulate_sizes.split(",") if s]
    except ValueError:
        problems.append(
            f"--simulate-sizes must be comma-separated ints, got {args.simulate_sizes!r}"
        )
    try:
        import json

        from tflms.config import LMSConfig

        args.lms_config = LMSConfig.from_dict(json.loads(args.lms_config))
    except (ValueError, TypeError) as err:  # JSON errors and tflms ConfigError are ValueErrors
        problems.append(f"--lms-config: {err}")
    if problems:
        p.error("; ".join(problems))
    return args


def _weights_digest(model) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def _load(args, rank: int, ranks: int):
    """This rank's training and validation shards. Raises DataError."""
    from .data import load_volumes, synthetic_dataset

    if args.data:
        x, y = load_volumes(args.data, args.size, rank=rank, ranks=ranks)
        xv, yv = x[-1:], y[-1:]  # real data: hold out each rank's last case
        x, y = (x[:-1], y[:-1]) if len(x) > 1 else (x, y)
        return x, y, xv, yv, "real"
    x, y = synthetic_dataset(args.volumes, args.size, args.seed, rank=rank, ranks=ranks)
    seed = args.seed + 10_000
    xv, yv = synthetic_dataset(args.val_volumes, args.size, seed, rank=rank, ranks=ranks)
    return x, y, xv, yv, "synthetic BraTS-like"


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        import ddl_tf.keras as hvd

        hvd.init()
    except Exception as err:  # noqa: BLE001 - any start-up failure is reported the same way
        sys.stderr.write(
            f"error: ddl_tf could not start ({err}). Install MPI with pip install 'tflms-ddl[mpi]' "
            "and launch with: ddlrun -np 2 examples/unet3d_demo.py\n"
        )
        return 3
    import keras

    import tflms
    from tflms import zoo
    from tflms.utils.cpu import cpu_state
    from tflms.utils.files import write_json

    from .callbacks import EpochStats
    from .memory import describe, simulate_size
    from .report import format_report, plot_training

    rank, ranks = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(
        args.seed
    )  # same initial weights everywhere (rank 0's are broadcast anyway)
    from .data import DataError

    try:
        x, y, xv, yv, source = _load(args, rank, ranks)
    except DataError as err:
        sys.stderr.write(f"error: {err}\n")
        hvd.shutdown()
        return 2

    model = zoo.unet3d(args.size, depth=args.depth, base_filters=args.base_filters, seed=args.seed)
    # Adam adapts its step size per weight, so the global learning rate is not scaled
    # by the number of ranks as Horovod's SGD recipe does; a short warmup still helps.
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr))
    model.compile(optimizer=optimizer, loss=zoo.SegmentationLoss(), jit_compile=False)
    lms_config = args.lms_config.replace(batch_size=args.batch_size)
    lms = tflms.LMSCallback(lms_config)
    stats = EpochStats(hvd, xv, yv, volumes_per_epoch=len(x))
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr, warmup_epochs=1, verbose=0),
        stats,
    ] + ([] if args.no_lms else [lms])
    start = time.perf_counter()
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        verbose=1 if rank == 0 else 0,
        callbacks=callbacks,
    )
    train_seconds = time.perf_counter() - start
    digests = hvd.allgather_object(_weights_digest(model))

    # Simulated GPU peaks: the demo's own step and the seed paper's sizes, spread over the ranks.
    out = Path(args.out)
    files = {
        "summary": str(out / "summary.json"),
        "training_curve": str(out / "training_curve.png"),
        "memory_timeline": str(out / "memory_timeline.png"),
    }
    tasks = [("demo", args.size)] + [("seed", s) for s in args.simulate_sizes]
    mine = {}
    for kind, size in tasks[rank::ranks]:
        if kind == "demo":  # the step this run trained, with the plan LMSCallback applied
            mine[(kind, size)] = (
                None
                if args.no_lms
                else describe(
                    lms.simulate(link=args.link),
                    size=size,
                    batch=args.batch_size,
                    device="V100-16GB",
                    link=args.link,
                )
            )
        else:
            png = files["memory_timeline"] if size == max(args.simulate_sizes) else None
            mine[(kind, size)] = simulate_size(
                size,
                depth=args.sim_depth,
                base_filters=args.sim_base_filters,
                link=args.link,
                timeline_png=png,
            )
    memory = {k: v for part in hvd.allgather_object(mine) for k, v in part.items()}
    if rank != 0:
        hvd.shutdown()
        return 0

    steady = stats.epochs[1:] or stats.epochs
    plan = lms.plan
    summary = {
        "ranks": ranks,
        "epochs": args.epochs,
        "train_seconds": round(train_seconds, 2),
        "cpu": cpu_state(),  # oneDNN on or off changes the speed several times over
        "data": {
            "source": source,
            "size": args.size,
            "channels": int(x.shape[-1]),
            "train_volumes_per_rank": len(x),
            "val_volumes_per_rank": len(xv),
        },
        "model": {
            "depth": args.depth,
            "base_filters": args.base_filters,
            "parameters": model.count_params(),
        },
        "lms": {
            "enabled": not args.no_lms,
            "swaps": len(plan.swaps) if plan else 0,
            "bytes_swapped": plan.bytes_swapped if plan else 0,
            "swap_ins": plan.num_swap_ins if plan else 0,
            "summary": plan.summary() if plan else "",
        },
        "history": stats.epochs,
        "performance": {
            "volumes_per_second_per_rank": float(
                np.mean([e["volumes_per_second"] for e in steady])
            ),
            "communication_share": float(
                sum(e["allreduce_seconds"] for e in steady) / sum(e["seconds"] for e in steady)
            ),
        },
        "weights_identical": len(set(digests)) == 1,
        "memory": {
            "simulated": True,
            "budget": "V100-16GB (realistic: tensors and what a TensorFlow GPU process holds)",
            "device": "V100-16GB",
            "link": args.link,
            "demo": memory[("demo", args.size)],
            "seed_sizes": [memory[("seed", s)] for s in args.simulate_sizes],
        },
        "files": files,
    }
    summary["memory"]["simulator"] = summary["memory"]["demo"]["simulator"]
    plot_training(stats.epochs, Path(files["training_curve"]))
    write_json(Path(files["summary"]), summary)
    sys.stdout.write(format_report(summary) + "\n")
    hvd.shutdown()
    return 0
