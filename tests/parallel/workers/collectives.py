"""Engine collectives against numpy references, plus a randomized run of many collectives.

Usage: collectives.py [N_RANDOM]. Every rank can compute every other rank's
input (seeded by rank), so each rank checks its own results locally and
reports failures; the test also compares result digests across ranks.
"""

import hashlib
import sys
import time

import ml_dtypes
import numpy as np

import ddl_tf as hvd
from ddl_tf.core.algorithms.steps import shard_layout
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.errors import ConfigError
from tests.parallel.workers.common import report

SUM = ReduceSpec(ReduceOp.SUM)

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
REDUCE = {
    ReduceOp.SUM: lambda s: s.sum(0),
    ReduceOp.AVERAGE: lambda s: s.mean(0),
    ReduceOp.MIN: lambda s: s.min(0),
    ReduceOp.MAX: lambda s: s.max(0),
    ReduceOp.PRODUCT: lambda s: s.prod(0),
}


def data(seed, r, shape, dtype, op=ReduceOp.SUM):
    rng = np.random.default_rng([*seed, r])
    if op is ReduceOp.PRODUCT:
        values = (
            rng.choice([1, 2, 1], size=shape)
            if dtype.kind in "iu"
            else rng.uniform(0.8, 1.2, size=shape)
        )
    elif dtype.kind in "iu":
        values = rng.integers(0 if dtype.kind == "u" else -100, 100, size=shape)
    elif dtype.kind == "b":
        values = rng.integers(0, 2, size=shape)
    else:
        values = rng.normal(size=shape)
    return np.asarray(values).astype(dtype)


def tolerance(dtype, compression):
    if compression == "bf16" or dtype == BF16:
        return 3e-2
    if compression == "fp16" or dtype == np.float16:
        return 4e-3
    return 1e-5 if dtype == np.float32 else 1e-12


class Checker:
    def __init__(self):
        self.failures, self.count, self.digest = [], 0, hashlib.sha256()

    def close(self, label, got, expected, tol=0.0, shared=True):
        """Compare with the reference; ``shared`` results must be identical on all ranks."""
        self.count += 1
        got = np.asarray(got)
        if shared:
            self.digest.update(np.ascontiguousarray(got).tobytes())
        expected = np.asarray(expected)
        if got.shape != expected.shape:
            self.failures.append(f"{label}: shape {got.shape} != {expected.shape}")
            return
        if tol == 0.0:
            ok = np.array_equal(got, expected.astype(got.dtype))
        else:
            scale = max(1.0, float(np.abs(expected.astype(np.float64)).max(initial=0.0)))
            ok = np.allclose(
                got.astype(np.float64), expected.astype(np.float64), atol=tol * scale, rtol=tol
            )
        if not ok:
            self.failures.append(f"{label}: values differ")


def check_allreduce(engine, chk, seed, layout, op, compression):
    size, rank = engine.size, engine.rank
    mine = [data((*seed, i), rank, shape, dt, op) for i, (shape, dt) in enumerate(layout)]
    got = engine.allreduce(mine, ReduceSpec.of(op, compression=compression), name=f"t{seed}")
    for i, ((shape, dt), g) in enumerate(zip(layout, got, strict=True)):
        stack = np.stack(
            [data((*seed, i), r, shape, dt, op).astype(np.float64) for r in range(size)]
        )
        if dt.kind in "iu":
            stack = np.stack([data((*seed, i), r, shape, dt, op) for r in range(size)])
        expected = REDUCE[op](stack)
        if g.dtype != dt:
            chk.failures.append(f"allreduce {seed} dtype {g.dtype} != {dt}")
        chk.close(
            f"allreduce{seed}[{i}] {dt} {op.name} {compression}",
            g,
            expected,
            0.0 if dt.kind in "iu" else tolerance(dt, compression) * size,
        )


def fixed_cases(engine, chk):
    size, rank = engine.size, engine.rank
    layout = [
        ((5, 3), np.dtype(np.float32)),
        ((4099,), np.dtype(np.float32)),
        ((), np.dtype(np.float64)),
        ((0,), np.dtype(np.float32)),
        ((17,), BF16),
        ((33,), np.dtype(np.float16)),
        ((9,), np.dtype(np.int32)),
        ((2, 2), np.dtype(np.int64)),
        ((3000,), np.dtype(np.float32)),
    ]
    for k, op in enumerate(REDUCE):
        usable = [(s, d) for s, d in layout if not (op is ReduceOp.AVERAGE and d.kind in "iu")]
        check_allreduce(engine, chk, (1, k), usable, op, None)
    for k, compression in enumerate(["fp16", "bf16"]):
        floats = [(s, d) for s, d in layout if d.kind == "f"]
        check_allreduce(engine, chk, (2, k), floats, ReduceOp.AVERAGE, compression)
    # scaling factors
    x = np.full(4, float(rank + 1), np.float32)
    got = engine.allreduce([x], ReduceSpec.of("sum", prescale_factor=0.5, postscale_factor=3.0))[0]
    chk.close("pre/postscale", got, np.full(4, 1.5 * size * (size + 1) / 2), 1e-6)
    # sum accumulates in float32 even when the wire carries float16 (asa, >= 3 ranks)
    if size >= 3:
        buf = np.array([2048.0 if rank == 0 else 1.0], np.float16)
        engine.algorithms["asa"].allreduce(buf, ReduceOp.SUM)
        chk.close("float32 accumulation", buf, np.array([2048.0 + size - 1], np.float16))
    # integer Average is Horovod's truncated mean (mean of 1, 3, 5, ... is size)
    odd = engine.allreduce([np.full(3, 2 * rank + 1, np.int32)], ReduceSpec.of("average"))[0]
    chk.close("integer average", odd, np.full(3, size, np.int32))
    # errors raised identically on every rank (after the negotiation: dtype and op agreed)
    try:
        engine.allreduce([np.ones(3, np.bool_)], ReduceSpec.of("sum"))
        chk.failures.append("boolean sum did not raise")
    except ConfigError:
        chk.count += 1
    # allgather: rank r contributes r+1 rows (rank 0 none when size > 2)
    for dt in [np.dtype(np.float32), BF16, np.dtype(np.int64), np.dtype(np.bool_)]:
        rows = lambda r: 0 if (r == 0 and size > 2) else r + 1  # noqa: E731
        got = engine.allgather(data((3,), rank, (rows(rank), 2, 3), dt), name="gather")
        expected = np.concatenate([data((3,), r, (rows(r), 2, 3), dt) for r in range(size)])
        chk.close(f"allgather {dt}", got, expected)
    # broadcast several arrays at once from the last rank
    root = size - 1
    arrays = [data((4, i), rank, shape, dt) for i, (shape, dt) in enumerate(layout)]
    got = engine.broadcast(arrays, root, name="bcast")
    for i, ((shape, dt), g) in enumerate(zip(layout, got, strict=True)):
        chk.close(f"broadcast[{i}]", g, data((4, i), root, shape, dt))
    # reducescatter with rows not divisible by the rank count
    for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        rows = 2 * size + 1
        got = engine.reducescatter(
            data((5,), rank, (rows, 3), np.dtype(np.float64)), ReduceSpec(op)
        )
        full = REDUCE[op](
            np.stack([data((5,), r, (rows, 3), np.dtype(np.float64)) for r in range(size)])
        )
        counts, displs = shard_layout(rows, size)
        chk.close(
            f"reducescatter {op.name}",
            got,
            full[displs[rank] : displs[rank] + counts[rank]],
            1e-12,
            shared=False,
        )
    # alltoall with uneven splits: rank r sends (r + j) % 3 rows to rank j
    splits = [(rank + j) % 3 for j in range(size)]
    mine = np.arange(sum(splits) * 2, dtype=np.float32).reshape(-1, 2) + 100 * rank
    received, rsplits = engine.alltoall(mine, splits, name="a2a")
    expected_rows, expected_splits = [], []
    for r in range(size):
        theirs = [(r + j) % 3 for j in range(size)]
        block = np.arange(sum(theirs) * 2, dtype=np.float32).reshape(-1, 2) + 100 * r
        start = sum(theirs[:rank])
        expected_rows.append(block[start : start + theirs[rank]])
        expected_splits.append(theirs[rank])
    chk.close("alltoall rows", received, np.concatenate(expected_rows), shared=False)
    chk.close("alltoall splits", rsplits, np.array(expected_splits, np.int32), shared=False)
    chk.close("broadcast_object", np.array(engine.broadcast_object({"v": 7}, 0)["v"]), np.array(7))
    chk.close("allgather_object", np.array(engine.allgather_object(rank)), np.arange(size))
    engine.barrier()


def random_run(engine, chk, count):
    rng = np.random.default_rng(12345)  # same choices on every rank
    kinds = [
        "allreduce",
        "allreduce",
        "allreduce",
        "allgather",
        "broadcast",
        "reducescatter",
        "alltoall",
    ]
    started = time.perf_counter()
    for i in range(count):
        kind = kinds[rng.integers(len(kinds))]
        if kind == "allreduce":
            op = list(REDUCE)[rng.integers(len(REDUCE))]
            dtypes = FLOATS + ([np.dtype(np.int32)] if op is not ReduceOp.AVERAGE else [])
            layout = [
                (
                    tuple(int(d) for d in rng.integers(0, 40, size=rng.integers(0, 3))),
                    dtypes[rng.integers(len(dtypes))],
                )
                for _ in range(rng.integers(1, 6))
            ]
            compression = [None, None, "fp16", "bf16"][rng.integers(4)]
            if op is ReduceOp.PRODUCT:
                compression = None
            check_allreduce(engine, chk, (9, i), layout, op, compression)
        elif kind == "allgather":
            dt = FLOATS[rng.integers(len(FLOATS))]
            width = int(rng.integers(0, 5))
            rows = [int(x) for x in rng.integers(0, 4, size=engine.size)]
            got = engine.allgather(data((9, i), engine.rank, (rows[engine.rank], width), dt))
            chk.close(
                f"r{i} allgather",
                got,
                np.concatenate([data((9, i), r, (rows[r], width), dt) for r in range(engine.size)]),
            )
        elif kind == "broadcast":
            root = int(rng.integers(engine.size))
            shape = (int(rng.integers(0, 50)),)
            got = engine.broadcast([data((9, i), engine.rank, shape, np.dtype(np.float32))], root)
            chk.close(f"r{i} broadcast", got[0], data((9, i), root, shape, np.dtype(np.float32)))
        elif kind == "reducescatter":
            rows = int(rng.integers(0, 3 * engine.size))
            f64 = np.dtype(np.float64)
            got = engine.reducescatter(data((9, i), engine.rank, (rows, 2), f64), SUM)
            full = sum(data((9, i), r, (rows, 2), f64) for r in range(engine.size))
            counts, displs = shard_layout(rows, engine.size)
            r0 = displs[engine.rank]
            chk.close(
                f"r{i} reducescatter", got, full[r0 : r0 + counts[engine.rank]], 1e-12, shared=False
            )
        else:
            rows = int(rng.integers(0, 3 * engine.size))
            got, _ = engine.alltoall(np.full((rows, 2), engine.rank, np.int32))
            counts, _ = shard_layout(rows, engine.size)
            expected = np.concatenate(
                [np.full((counts[engine.rank], 2), r, np.int32) for r in range(engine.size)]
            )
            chk.close(f"r{i} alltoall", got, expected, shared=False)
    return time.perf_counter() - started


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    engine = hvd.init()
    chk = Checker()
    fixed_cases(engine, chk)
    fixed = chk.count
    seconds = random_run(engine, chk, count)
    report(
        engine.rank,
        {
            "failures": chk.failures[:50],
            "checks": chk.count,
            "fixed": fixed,
            "random": count,
            "random_seconds": seconds,
            "digest": chk.digest.hexdigest(),
        },
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
