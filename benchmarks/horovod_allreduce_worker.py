"""One rank of the Horovod side-by-side allreduce benchmark (started by bench_horovod.py).

Usage: horovod_allreduce_worker.py PLAN.json OUT.json

Runs in the Horovod peer's environment (``benchmarks/peers/horovod/build.sh``)
with the repository on ``PYTHONPATH``. PLAN is ``{"library": "horovod" |
"ddl_tf" | "both", "sizes": [bytes, ...], "dtypes": ["float32", "float16"],
"budget_seconds": S}``.

One library per job (``horovod`` or ``ddl_tf``; the benchmark alternates
jobs): Horovod's background thread polls MPI every cycle (1 ms) as long as
Horovod is initialized, which slows every other MPI call and computation in
the process (a bare in-place ``MPI_Allreduce`` of 64 MiB on two local ranks
took about twice as long with Horovod initialized, in this worker's
``mpi/eager`` row), so the two libraries do not share processes. ``both``
initializes both in one process (``mpirun`` on ``COMM_WORLD``), the earlier
method, kept to show that effect.

Per size and dtype, the calls of ``allreduce(x, op=Sum)`` on the same tensor
are timed *interleaved* (``allreduce_worker.measure``: in each round every
call runs a few times back to back; median over rounds of the per-call mean,
slowest rank): the library eagerly and inside a ``tf.function``, and for
float32 a bare in-place ``MPI_Allreduce`` of the same bytes (``mpi/eager``,
the floor). Each result is checked against the exact sum once. Both
libraries run with their defaults (Horovod: MPI CPU operations, fusion
threshold 128 MiB, cycle time 1 ms; ddl_tf: ``auto`` algorithm policy,
collective checks on). Sizes whose predicted time would overrun the budget
are skipped (rank 0 decides, all ranks follow).
"""

import json
import sys
import time

import numpy as np
import tensorflow as tf
from allreduce_worker import measure
from mpi4py import MPI

import ddl_tf


def calls_for(x: tf.Tensor, libraries: dict, comm) -> dict:
    """The ways to allreduce ``x``: each library eagerly and in a graph, and bare MPI (float32)."""
    calls = {}
    for name, lib in libraries.items():
        graph = tf.function(lambda t, lib=lib: lib.allreduce(t, op=lib.Sum), jit_compile=False)
        calls[f"{name}/eager"] = lambda lib=lib: lib.allreduce(x, op=lib.Sum)
        calls[f"{name}/graph"] = lambda graph=graph: graph(x)
    if x.dtype == tf.float32:
        buf = x.numpy()
        calls["mpi/eager"] = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return calls


def check(calls: dict, x: tf.Tensor, comm) -> dict:
    """Each library call's result against the exact sum over ranks (computed in float64)."""
    local = x.numpy().astype(np.float64)
    total = np.empty_like(local)
    comm.Allreduce(local, total, op=MPI.SUM)
    expected = total.astype(x.dtype.as_numpy_dtype)
    return {
        name: bool(np.array_equal(call().numpy(), expected))
        for name, call in calls.items()
        if not name.startswith("mpi/")
    }


def init_libraries(which: str) -> dict:
    """Initialize the library (or both) this job measures; ``{name: module}``."""
    libraries = {}
    if which in ("horovod", "both"):
        import horovod.tensorflow as hvd

        hvd.init(comm=MPI.COMM_WORLD)
        libraries["horovod"] = hvd
    if which in ("ddl_tf", "both"):
        ddl_tf.init()
        libraries["ddl_tf"] = ddl_tf
    if not libraries:
        raise SystemExit(f"unknown library {which!r}; use horovod, ddl_tf or both")
    return libraries


def main():
    plan = json.loads(open(sys.argv[1]).read())
    out = sys.argv[2]
    comm = MPI.COMM_WORLD.Dup()
    libraries = init_libraries(plan.get("library", "both"))
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
            predicted = per_byte.get(dtype, 0.0) * nbytes * 2 * len(libraries) * 5
            if not comm.bcast(time.monotonic() - started + predicted <= budget, root=0):
                skipped.append({"bytes": nbytes, "dtype": dtype, "predicted_s": predicted})
                continue
            calls = calls_for(x, libraries, comm)
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
                        "correct": correct.get(impl),
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
                    "libraries": sorted(libraries),
                    "horovod": horovod_info(libraries),
                    "rows": rows,
                    "skipped": skipped,
                    "seconds": time.monotonic() - started,
                },
                f,
            )
    for lib in libraries.values():
        lib.shutdown()
    comm.Free()


def horovod_info(libraries: dict) -> dict | None:
    if "horovod" not in libraries:
        return None
    import horovod

    return {"version": horovod.__version__, "mpi_built": libraries["horovod"].mpi_built()}


if __name__ == "__main__":
    main()
