"""Experiment (not run by ``make bench``): the hierarchical allreduce vs a chunked pipeline of it.

The pipeline reduce-scatters chunk k+1 inside the node while chunk k's
allreduce across nodes (a non-blocking ``Iallreduce``) is on the wire, then
allgathers chunk k. Plain mpi4py, float32, flat MPI steps; checks every
result against ``MPI_Allreduce`` and across ranks. Run it on a rehearsal
cluster (root)::

    python -m ddl_tf.cluster run --nodes 2 --ranks-per-node 4 --link 1gbit -- \
        .venv/bin/python benchmarks/exp_pipelined_hierarchical.py 16,64 4,8 9

Arguments: sizes in MiB, chunk sizes in MiB, rounds. Prints the median time
per variant (slowest rank). README.md, "Rehearsing a cluster", quotes one run.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
cross = world.Split(node.rank, world.rank)
P = node.size


def layout(n, parts):
    base, extra = divmod(n, parts)
    counts = [base + (1 if i < extra else 0) for i in range(parts)]
    displs = [sum(counts[:i]) for i in range(parts)]
    return counts, displs


def rs(ch):
    counts, displs = layout(ch.size, P)
    r = node.rank
    out = np.empty(counts[r], ch.dtype)
    node.Reduce_scatter([ch, MPI.FLOAT], [out, MPI.FLOAT], counts, op=MPI.SUM)
    own = slice(displs[r], displs[r] + counts[r])
    ch[own] = out
    return own


def ag(ch):
    counts, displs = layout(ch.size, P)
    node.Allgatherv(MPI.IN_PLACE, [ch, (counts, displs), MPI.FLOAT])


def hier(buf):
    own = rs(buf)
    cross.Allreduce(MPI.IN_PLACE, [buf[own], MPI.FLOAT], op=MPI.SUM)
    ag(buf)


def pipelined(buf, chunk):
    prev = None
    for start in range(0, buf.size, chunk):
        ch = buf[start : start + chunk]
        own = rs(ch)
        shard = ch[own]
        req = cross.Iallreduce(MPI.IN_PLACE, [shard, MPI.FLOAT], op=MPI.SUM)
        if prev is not None:
            prev[1].Wait()
            ag(prev[0])
        prev = (ch, req, shard)
    prev[1].Wait()
    ag(prev[0])


def flat(buf):
    world.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)


sizes = [int(s) << 20 for s in sys.argv[1].split(",")]
chunks = [int(c) << 20 for c in sys.argv[2].split(",")]
rounds = int(sys.argv[3])
rng = np.random.default_rng(world.rank)
for size in sizes:
    n = size // 4
    data = rng.standard_normal(n).astype(np.float32)
    expect = data.copy()
    flat(expect)
    variants = {"flat": flat, "hier": hier}
    for c in chunks:
        variants[f"pipe{c >> 20}M"] = lambda b, c=c: pipelined(b, c // 4)
    times = {k: [] for k in variants}
    for rnd in range(rounds):
        order = list(variants) if rnd % 2 == 0 else list(variants)[::-1]
        for k in order:
            buf = data.copy()
            world.Barrier()
            t = time.perf_counter()
            variants[k](buf)
            dt = time.perf_counter() - t
            dt = world.allreduce(dt, op=MPI.MAX)
            times[k].append(dt)
            ok = np.allclose(buf, expect, rtol=1e-4, atol=1e-4)
            g = world.gather(buf[:1000].tobytes(), root=0)
            same = world.rank != 0 or all(x == g[0] for x in g)
            if world.rank == 0 and (not ok or not same):
                print(f"  {k}: correct={ok} identical_across_ranks={same}", flush=True)
    if world.rank == 0:
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(
            f"{size >> 20} MiB: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in med.items()),
            flush=True,
        )
