"""Every allreduce algorithm x dtype x op x size against a numpy reference.

Run under mpirun (any rank count, optionally with DDL_PSEUDO_NODES and
DDL_TOPOLOGY_FILE). Besides the engine's algorithms it builds every
hierarchical variant (each step algorithm at the inner levels x each at the
world step) over the same communicators. Each rank reports its failures and
a digest of every result; the test checks that the digests agree across ranks.
"""

import hashlib
import itertools
import sys

import ml_dtypes
import numpy as np

import ddl_tf as hvd
from ddl_tf.core import basics
from ddl_tf.core.algorithms.allreduce import make_allreduce
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from tests.parallel.workers.common import report

DTYPES = [
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.uint8),
]
OPS = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
VARIANT_DTYPES = [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.int32)]


def rank_data(r: int, n: int, dtype: np.dtype, op: ReduceOp, salt: int) -> np.ndarray:
    rng = np.random.default_rng([r, n, salt])
    if op is ReduceOp.PRODUCT:
        values = rng.choice([1, 2, 1, -1] if dtype.kind == "i" else [1, 2, 1], size=n)
        if dtype.kind == "f" or dtype == ml_dtypes.bfloat16:
            values = rng.uniform(0.75, 1.25, size=n)
    elif dtype.kind == "u":
        values = rng.integers(0, 50, size=n)
    elif dtype.kind == "i":
        values = rng.integers(-1000, 1000, size=n)
    else:
        values = rng.normal(size=n) * 10
    return values.astype(dtype)


def reference(size: int, n: int, dtype: np.dtype, op: ReduceOp, salt: int) -> np.ndarray:
    stack = np.stack([rank_data(r, n, dtype, op, salt).astype(np.float64) for r in range(size)])
    if dtype.kind in "iu":
        stack = np.stack([rank_data(r, n, dtype, op, salt) for r in range(size)])
    fn = {
        ReduceOp.SUM: np.sum,
        ReduceOp.MIN: np.min,
        ReduceOp.MAX: np.max,
        ReduceOp.PRODUCT: np.prod,
    }[op]
    return fn(stack, axis=0)


def close(result: np.ndarray, expected: np.ndarray, dtype: np.dtype, size: int) -> bool:
    if dtype.kind in "iu":
        return np.array_equal(result, expected.astype(dtype))
    tol = {2: 2e-2 if dtype == ml_dtypes.bfloat16 else 4e-3, 4: 1e-5, 8: 1e-12}[dtype.itemsize]
    got = result.astype(np.float64)
    scale = np.abs(expected).max(initial=1.0) * size
    return bool(np.all(np.abs(got - expected) <= tol * scale))


def main() -> None:
    sizes = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else None
    engine = hvd.init()
    size, rank = hvd.size(), hvd.rank()
    topo = basics.topology()
    algorithms = dict(engine.algorithms)
    if topo.is_uniform:
        levels = len(engine.comms.steps) - 1
        for inner, top in itertools.product(("flat", "ring", "asa"), repeat=2):
            algorithms[f"hierarchical[{inner}/{top}]"] = make_allreduce(
                "hierarchical",
                engine.comms.data,
                step_comms=engine.comms.steps,
                step_algorithms=[inner] * levels + [top],
            )
    sizes = sizes or [0, 1, 2, size - 1, size + 1, 7, 1000, 4099, 65537]
    # the engine's algorithms get the full matrix; the per-level variants a representative part
    matrix = [
        (item, dtype, op, n)
        for item in algorithms.items()
        for dtype, op, n in itertools.product(DTYPES, OPS, sizes)
        if not item[0].startswith("hierarchical[")
        or (dtype in VARIANT_DTYPES and op in (ReduceOp.SUM, ReduceOp.MAX) and n in sizes[::2])
    ]
    failures, digest, checks = [], hashlib.sha256(), 0
    for (label, algo), dtype, op, n in matrix:
        salt = 7
        buf = rank_data(rank, n, dtype, op, salt)
        algo.allreduce(buf, op)
        expected = reference(size, n, dtype, op, salt)
        checks += 1
        if not close(buf, expected, dtype, size):
            failures.append(f"{label} {dtype} {op.name} n={n}")
        digest.update(buf.tobytes())
    # integer sums wrap around like numpy (Open MPI's AVX kernels would saturate 8/16-bit sums)
    for label, algo in algorithms.items():
        for dtype, value in ((np.dtype(np.uint8), 200), (np.dtype(np.int16), 30000)):
            buf = np.full(1000, value, dtype)
            algo.allreduce(buf, ReduceOp.SUM)
            checks += 1
            wrapped = np.array(value * size, np.int64).astype(dtype)
            if not np.all(buf == wrapped):
                failures.append(
                    f"{label} {dtype} SUM overflow gave {buf[0]}, numpy wraps to {wrapped}"
                )
    report(
        rank,
        {
            "size": size,
            "checks": checks,
            "failures": failures[:50],
            "digest": digest.hexdigest(),
            "algorithms": sorted(algorithms),
            "steps": [s.level for s in topo.steps()],
        },
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
