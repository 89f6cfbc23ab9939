"""One rank of the allreduce benchmark (started by bench_allreduce.py under mpirun).

Usage: allreduce_worker.py OUT.json ALGOS SIZES COMPRESSIONS

For every message size (bytes of float32 data) and compression, the
algorithms are timed *interleaved*: in each round every algorithm runs a few
back-to-back allreduces, and a configuration's time is the median over rounds
of the per-call mean, taken on the slowest rank. Interleaving keeps load from
other processes on a shared machine from favouring whichever algorithm
happened to run in a quiet moment. Rows:

* ``mpi4py``: plain ``comm.Allreduce(IN_PLACE, buf, SUM)``, the baseline;
* ``flat``/``ring``/``asa``/``hierarchical``: ddl_tf's algorithm objects;
* ``auto``: what ``auto`` picks for that message, through the engine's
  dispatch (``engine.choose(nbytes, dtype).allreduce``);
* ``engine``: the full ``engine.allreduce`` call (descriptor check across
  ranks, fusion copy, compression) that ``hvd.allreduce`` runs;
* ``engine-unchecked``: the same with ``DDL_CHECK_COLLECTIVES=0``.
* ``average``/``adasum``: ``engine.allreduce`` with ``op=Average`` and
  ``op=Adasum`` (``bench_allreduce.py --adasum``; no target phase then).

Then a *target* phase repeats, for 8 KiB and 1..256 MiB, a tighter A/B of
``auto`` against ``mpi4py`` alone (at least 9 rounds), which is what the
issue's targets are judged on.

With fp16/bf16 compression the timed region includes the float32 -> half
conversion before and the half -> float32 conversion after the transfer,
made the way the engine makes them (``ddl_tf.core.numerics.halfconv.cast_into``,
compiled: 1.6-2.3 ms each way for 16 MiB of float32 here, where numpy's
``astype`` took 9.6-17 ms);
compressed rows cover the reducing algorithms (flat, ring, asa, auto; only
flat and auto from 64 MiB on, to keep the whole run near 10 minutes).
"""

import json
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import ddl_tf as hvd
from ddl_tf.core.collectives.engine import Engine
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.halfconv import cast_into

HALF = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
ROUND_SECONDS = 0.02
BUDGET_SECONDS = 0.4  # per (size, compression, algorithm), roughly
COMPRESSED_ALGOS = ("flat", "ring", "asa", "auto")  # compressed rows: the reducing algorithms
LARGE_COMPRESSED_ALGOS = ("flat", "auto")  # >= 64 MiB: keep the run under ~10 minutes
TARGET_SIZES = [8 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def make_call(engine, comm, algo, data, compression):
    """A zero-argument callable doing one allreduce of ``data`` the way ``algo`` names."""
    if algo == "mpi4py":
        return lambda: comm.Allreduce(MPI.IN_PLACE, [data, MPI.FLOAT], op=MPI.SUM)
    if algo == "engine":
        spec = ReduceSpec.of("sum", compression=compression)
        return lambda: engine.allreduce([data], spec)
    if algo in ("average", "adasum"):
        spec = ReduceSpec.of(algo, compression=compression)
        return lambda: engine.allreduce([data], spec)
    if algo == "engine-unchecked":
        unchecked, spec = engine.unchecked, ReduceSpec.of("sum", compression=compression)
        return lambda: unchecked.allreduce([data], spec)
    wire_dtype = HALF.get(compression, np.dtype(np.float32))
    nbytes = data.size * wire_dtype.itemsize
    op = hvd.ReduceOp.SUM
    if algo != "auto" and algo not in engine.algorithms:
        return None
    if compression == "none":
        if algo == "auto":
            return lambda: engine.choose(nbytes, wire_dtype).allreduce(data, op)
        chosen = engine.algorithms[algo]
        return lambda: chosen.allreduce(data, op)

    wire = np.empty(data.size, wire_dtype)

    def compressed():
        cast_into(data, wire)  # the engine's conversion (compiled), not numpy's astype
        (
            engine.choose(nbytes, wire_dtype) if algo == "auto" else engine.algorithms[algo]
        ).allreduce(wire, op)
        cast_into(wire, data)

    return compressed


def measure(comm, calls, min_rounds=3):
    """Median-of-rounds mean seconds per call, per algorithm (slowest rank)."""
    reps, round_seconds = {}, 0.0
    for name, call in calls.items():
        comm.Barrier()
        start = time.perf_counter()
        call()  # warm-up (page faults, lazy connections) that also sizes the rounds
        once = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if once < 0.05:
            call()
        reps[name] = int(min(500, max(1, ROUND_SECONDS / max(once, 1e-7))))
        round_seconds += reps[name] * once
    budget = BUDGET_SECONDS * len(calls)
    rounds = int(min(25, max(min_rounds, budget / max(round_seconds, 1e-7))))
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(reps[name]):
                call()
            samples[name].append((time.perf_counter() - start) / reps[name])
    out = {}
    for name, values in samples.items():
        median = float(np.median(values))
        out[name] = (comm.allreduce(median, op=MPI.MAX), reps[name], rounds)
    return out


def main():
    out, algos, sizes, compressions = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    sizes = [int(s) for s in sizes.split(",")]
    engine = hvd.init()
    # the same pipeline without the cross-rank descriptor check (DDL_CHECK_COLLECTIVES=0)
    engine.unchecked = Engine(
        engine.comms, engine.topology, engine.config.replace(check_collectives=False), engine.policy
    )
    comm = MPI.COMM_WORLD.Dup()
    size, topo = comm.size, engine.topology
    rows = []
    for nbytes in sizes:
        data = np.zeros(nbytes // 4, np.float32)
        for compression in compressions.split(","):
            calls = {}
            for algo in algos:
                if compression != "none":
                    allowed = LARGE_COMPRESSED_ALGOS if nbytes >= 64 << 20 else COMPRESSED_ALGOS
                    if algo not in allowed:
                        continue
                call = make_call(engine, comm, algo, data, compression)
                if call is not None:
                    calls[algo] = call
            wire_dtype = HALF.get(compression, np.dtype(np.float32))
            chosen = engine.choose(data.size * wire_dtype.itemsize, wire_dtype).name
            for algo, (seconds, reps, rounds) in measure(comm, calls).items():
                algbw = nbytes / seconds
                rows.append(
                    {
                        "ranks": size,
                        "nodes": topo.num_nodes,
                        "bytes": nbytes,
                        "algorithm": algo,
                        "chosen": chosen
                        if algo in ("auto", "engine", "engine-unchecked")
                        else algo,
                        "compression": compression,
                        "seconds": seconds,
                        "reps": reps,
                        "rounds": rounds,
                        "algbw_GBps": algbw / 1e9,
                        "busbw_GBps": algbw * 2 * (size - 1) / size / 1e9,
                    }
                )
                if comm.rank == 0:
                    print(
                        f"  {size} ranks {nbytes:>10} B {algo:>12} {compression:>4}: "
                        f"{seconds * 1e6:11.1f} us  busbw {rows[-1]['busbw_GBps']:7.3f} GB/s",
                        flush=True,
                    )
    # targets: a tighter A/B of auto against plain MPI_Allreduce (two algorithms, more rounds)
    for nbytes in [b for b in TARGET_SIZES if b in sizes and "auto" in algos]:
        data = np.zeros(nbytes // 4, np.float32)
        calls = {a: make_call(engine, comm, a, data, "none") for a in ("mpi4py", "auto")}
        results = measure(comm, calls, min_rounds=9)
        for algo, (seconds, reps, rounds) in results.items():
            rows.append(
                {
                    "phase": "target",
                    "ranks": size,
                    "nodes": topo.num_nodes,
                    "bytes": nbytes,
                    "algorithm": algo,
                    "chosen": engine.choose(nbytes, data.dtype).name,
                    "compression": "none",
                    "seconds": seconds,
                    "reps": reps,
                    "rounds": rounds,
                    "algbw_GBps": nbytes / seconds / 1e9,
                    "busbw_GBps": nbytes / seconds * 2 * (size - 1) / size / 1e9,
                }
            )
        if comm.rank == 0:
            ratio = results["auto"][0] / results["mpi4py"][0]
            print(f"  target {nbytes:>10} B: auto/mpi4py = {ratio:.3f}", flush=True)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump({"topology": topo.describe(), "rows": rows}, f)
    comm.Free()
    hvd.shutdown()


if __name__ == "__main__":
    main()
