"""One rank of the cluster allreduce benchmark (started by bench_cluster_allreduce.py).

Usage: cluster_allreduce_worker.py PLAN.json OUT.json

PLAN is ``{"budget_seconds": S, "min_rounds": R, "cases": [{"bytes": B,
"compression": "none"|"fp16", "algorithms": [...]}, ...]}``; ``bytes`` is
the float32 size of the buffer; ``hierarchical[ring/flat]`` names a
hierarchical allreduce with those step algorithms (inner levels / world). Timing reuses ``allreduce_worker.measure``
(algorithms of one case interleaved in rounds, median of rounds, slowest
rank) and ``allreduce_worker.make_call`` (fp16 rows include the float32 ->
float16 -> float32 conversions). ``flat`` is one MPI_Allreduce: Open MPI's
own algorithm (its ``han`` component, hierarchical itself, is the default
in Open MPI 5); float16 sums go through ddl_tf's float32-accumulating MPI
operation, as MPI has no float16 type. ``auto`` is what the engine's policy
(``DDL_AUTO_POLICY``) picks for the buffer.

With ``"account": true`` in the plan, every timed configuration is then run
once more, untimed, between barriers, while the first rank of each node
reads its node's link counters (:func:`ddl_tf.cluster.counters.read_local`;
a rank runs inside its node's network namespace) before and after: the
row's ``link`` holds, per node, the bytes that crossed the node's link
during that one allreduce (the barriers add a few hundred bytes).

Bounded in time: a case whose predicted duration (from the previous size,
scaled by the size ratio) would overrun the budget is skipped and recorded
as skipped; the decision is rank 0's, broadcast, so all ranks agree.
"""

import json
import sys
import time

import numpy as np
from allreduce_worker import HALF, make_call, measure
from mpi4py import MPI

import ddl_tf as hvd
from ddl_tf.cluster.counters import read_local
from ddl_tf.core.algorithms.allreduce import make_allreduce


def add_variants(engine, names):
    """Build ``hierarchical[<node step>/<world step>]`` variants named in the plan."""
    levels = len(engine.comms.steps) - 1
    for name in names:
        if name.startswith("hierarchical[") and name not in engine.algorithms:
            inner, top = name[len("hierarchical[") : -1].split("/")
            engine.algorithms[name] = make_allreduce(
                "hierarchical",
                engine.comms.data,
                step_comms=engine.comms.steps,
                step_algorithms=[inner] * levels + [top],
            )


def link_traffic(comm, call, lead: bool) -> dict | None:
    """Counters of every node's link around one ``call()`` (on rank 0: lists by node; else None)."""
    comm.Barrier()
    before = read_local() if lead else None
    comm.Barrier()
    call()
    comm.Barrier()
    delta = (read_local() - before).to_json() if lead else None
    gathered = comm.gather(delta, root=0)
    if gathered is None:
        return None
    nodes = [d for d in gathered if d is not None]  # leads in rank order = node order
    return {key: [d[key] for d in nodes] for key in nodes[0]}


def main():
    plan = json.loads(open(sys.argv[1]).read())
    out = sys.argv[2]
    engine = hvd.init()
    add_variants(engine, {a for case in plan["cases"] for a in case["algorithms"]})
    comm = MPI.COMM_WORLD.Dup()
    topo = engine.topology
    started = time.monotonic()
    budget = float(plan.get("budget_seconds", 600))
    min_rounds = int(plan.get("min_rounds", 3))
    account = bool(plan.get("account", False))
    lead = topo.local_rank == 0
    per_byte: dict[tuple[str, str], float] = {}  # (algorithm, compression) -> s/byte, last size
    rows, skipped = [], []
    for case in plan["cases"]:
        nbytes, compression = int(case["bytes"]), case["compression"]
        data = np.zeros(nbytes // 4, np.float32)
        wire = HALF.get(compression, np.dtype(np.float32))
        chosen = engine.choose(data.size * wire.itemsize, wire).name
        calls, predicted = {}, 0.0
        for algo in case["algorithms"]:
            call = make_call(engine, comm, algo, data, compression)
            if call is not None:
                calls[algo] = call
                calls_per_algo = min_rounds + 1 + account
                predicted += per_byte.get((algo, compression), 0.0) * nbytes * calls_per_algo
        go = comm.bcast(time.monotonic() - started + predicted <= budget, root=0)
        if not go:
            skipped.append({"bytes": nbytes, "compression": compression, "predicted_s": predicted})
            if comm.rank == 0:
                print(f"  skip {nbytes} B {compression}: predicted {predicted:.0f} s", flush=True)
            continue
        for algo, (seconds, reps, rounds) in measure(comm, calls, min_rounds=min_rounds).items():
            per_byte[(algo, compression)] = seconds / nbytes
            link = link_traffic(comm, calls[algo], lead) if account else None
            rows.append(
                {
                    "ranks": comm.size,
                    "nodes": topo.num_nodes,
                    "ranks_per_node": topo.local_size,
                    "bytes": nbytes,
                    "wire_bytes": data.size * wire.itemsize,
                    "algorithm": algo,
                    "chosen": chosen if algo == "auto" else algo,
                    "compression": compression,
                    "seconds": seconds,
                    "reps": reps,
                    "rounds": rounds,
                    **({"link": link} if account else {}),
                }
            )
            if comm.rank == 0:
                print(
                    f"  {topo.num_nodes}x{topo.local_size} {nbytes:>10} B {algo:>12} "
                    f"{compression:>4}: {seconds * 1e3:10.2f} ms"
                    + (f" (auto -> {chosen})" if algo == "auto" else ""),
                    flush=True,
                )
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "topology": topo.describe(),
                    "hosts": sorted(set(topo.node_names)),
                    "policy": engine.policy.source,
                    "rows": rows,
                    "skipped": skipped,
                    "seconds": time.monotonic() - started,
                },
                f,
            )
    comm.Free()
    hvd.shutdown()


if __name__ == "__main__":
    main()
