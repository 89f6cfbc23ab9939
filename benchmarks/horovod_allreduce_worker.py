"""One rank of the Horovod side-by-side allreduce benchmark (started by bench_horovod.py).

Usage: horovod_allreduce_worker.py PLAN.json OUT.json

Runs in the Horovod peer's environment (``benchmarks/peers/horovod/build.sh``)
with the repository on ``PYTHONPATH``, so Horovod 0.28.1 and ddl_tf live in
the same process, on the same MPI ranks: mpi4py initializes MPI (thread
level multiple), ``horovod.tensorflow.init(comm=COMM_WORLD)`` and
``ddl_tf.init()`` both run on it. PLAN is ``{"sizes": [bytes, ...],
"dtypes": ["float32", "float16"], "budget_seconds": S}``.

Per size and dtype, four calls of ``allreduce(x, op=Sum)`` on the same
tensor are timed *interleaved* (``allreduce_worker.measure``: in each round
every call runs a few times back to back; median over rounds of the per-call
mean, slowest rank): Horovod eager, ddl_tf eager, Horovod inside a
``tf.function``, ddl_tf inside a ``tf.function``. Each result is checked
against the exact sum once. Both libraries run with their defaults (Horovod:
MPI CPU operations, fusion threshold 128 MiB, cycle time 1 ms; ddl_tf:
``auto`` algorithm policy, collective checks on). Sizes whose predicted time
would overrun the budget are skipped (rank 0 decides, all ranks follow).
"""

import json
import sys
import time

import horovod
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from allreduce_worker import measure
from mpi4py import MPI

import ddl_tf

IMPLS = ("horovod/eager", "ddl_tf/eager", "horovod/graph", "ddl_tf/graph")


def calls_for(x: tf.Tensor) -> dict:
    """The four ways to allreduce ``x`` (graph functions traced for ``x``'s signature)."""
    hvd_graph = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum), jit_compile=False)
    ddl_graph = tf.function(lambda t: ddl_tf.allreduce(t, op=ddl_tf.Sum), jit_compile=False)
    return {
        "horovod/eager": lambda: hvd.allreduce(x, op=hvd.Sum),
        "ddl_tf/eager": lambda: ddl_tf.allreduce(x, op=ddl_tf.Sum),
        "horovod/graph": lambda: hvd_graph(x),
        "ddl_tf/graph": lambda: ddl_graph(x),
    }


def check(calls: dict, x: tf.Tensor, comm) -> dict:
    """Each call's result against the exact sum over ranks (computed in float64)."""
    local = x.numpy().astype(np.float64)
    total = np.empty_like(local)
    comm.Allreduce(local, total, op=MPI.SUM)
    expected = total.astype(x.dtype.as_numpy_dtype)
    return {name: bool(np.array_equal(call().numpy(), expected)) for name, call in calls.items()}


def main():
    plan = json.loads(open(sys.argv[1]).read())
    out = sys.argv[2]
    comm = MPI.COMM_WORLD.Dup()
    hvd.init(comm=MPI.COMM_WORLD)
    engine = ddl_tf.init()
    started = time.monotonic()
    budget = float(plan.get("budget_seconds", 600))
    rows, skipped = [], []
    per_byte: dict[str, float] = {}
    rng = np.random.default_rng(comm.rank)
    for dtype in plan["dtypes"]:
        for nbytes in plan["sizes"]:
            np_dtype = np.dtype(dtype)
            # small integers: sums are exact in float16 too, so results can be compared bit for bit
            x = tf.constant(rng.integers(-8, 8, nbytes // np_dtype.itemsize).astype(np_dtype))
            predicted = per_byte.get(dtype, 0.0) * nbytes * len(IMPLS) * 5
            if not comm.bcast(time.monotonic() - started + predicted <= budget, root=0):
                skipped.append({"bytes": nbytes, "dtype": dtype, "predicted_s": predicted})
                continue
            calls = calls_for(x)
            correct = check(calls, x, comm)
            results = measure(comm, calls, min_rounds=3)
            per_byte[dtype] = max(s for s, _, _ in results.values()) / nbytes
            for impl, (seconds, reps, rounds) in results.items():
                library, mode = impl.split("/")
                rows.append(
                    {
                        "bytes": nbytes,
                        "dtype": dtype,
                        "library": library,
                        "mode": mode,
                        "seconds": seconds,
                        "reps": reps,
                        "rounds": rounds,
                        "correct": correct[impl],
                    }
                )
            if comm.rank == 0:
                times = " ".join(f"{k} {v[0] * 1e3:9.3f}" for k, v in results.items())
                print(f"  {comm.size} ranks {nbytes:>10} B {dtype}: {times} ms", flush=True)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "ranks": comm.size,
                    "topology": engine.topology.describe(),
                    "horovod": {"version": horovod.__version__, "mpi_built": hvd.mpi_built()},
                    "rows": rows,
                    "skipped": skipped,
                    "seconds": time.monotonic() - started,
                },
                f,
            )
    ddl_tf.shutdown()
    hvd.shutdown()
    comm.Free()


if __name__ == "__main__":
    main()
