"""Rank of a 2-, 4- or 8-rank job: the engine's Adasum against a numpy reference of the tree.

No TensorFlow: the numpy/MPI core only. Every rank draws every rank's tensors
from one seed, reduces its own with ``op=Adasum`` and compares the result with
:func:`reference`, a plain numpy recursion of Adasum's pairwise rule over the
binary tree of ranks (``2i`` with ``2i+1``, then pairs of pairs), in float64
from the inputs as the dtype holds them. Tensor sizes are odd and uneven, so
the halving splits tensors between ranks; one tensor is zero on rank 0 (the
zero side contributes nothing) and one is empty.

``argv[1]``:
``flat``: float16/32/64, fp16 compression of float32 tensors, and (on 4 ranks)
Adasum over process sets of 2 ranks and the refusal on a set of 3.
``hierarchical``: run with ``DDL_ALLREDUCE_ALGO=hierarchical`` and
``DDL_PSEUDO_NODES``: the ranks of a node average, Adasum runs across nodes.
"""

import hashlib
import sys

import numpy as np

from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.process_sets import add_process_set, engine_for
from ddl_tf.errors import UnsupportedError
from tests.parallel.workers.common import report

ADASUM = ReduceSpec.of("adasum")

SHAPES = [(3, 5), (1,), (0,), (7,), (2, 2, 3), (129,)]
ZERO_ON_RANK0 = 3  # tensor index that is all zeros on rank 0


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum's rule for one tensor, in float64 (a zero side keeps coefficient 1)."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, aa, bb = a @ b, a @ a, b @ b
    ca = 1.0 - dot / (2.0 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def reference(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Adasum of ``per_rank[r][i]`` over ranks r, tensor i by tensor i: the binary tree."""
    level = [[t.astype(np.float64) for t in tensors] for tensors in per_rank]
    while len(level) > 1:
        level = [
            [pair(a, b).reshape(a.shape) for a, b in zip(level[k], level[k + 1], strict=True)]
            for k in range(0, len(level), 2)
        ]
    return level[0]


def tensors_of(size: int, seed: int = 5) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = [[rng.normal(size=s) for s in SHAPES] for _ in range(size)]
    out[0][ZERO_ON_RANK0][...] = 0.0
    return out


def error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest error relative to the reference's largest magnitude (1 where it is smaller)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if w.size:
            scale = max(1.0, float(np.max(np.abs(w))))
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / scale)
    return worst


def digest(arrays: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


def flat(engine, rank: int, size: int, checks: dict) -> None:
    per_rank = tensors_of(size)
    for dtype in (np.float16, np.float32, np.float64):
        mine = [t.astype(dtype) for t in per_rank[rank]]
        got = engine.allreduce(mine, ADASUM, name=f"adasum_{np.dtype(dtype).name}")
        want = reference([[t.astype(dtype) for t in ts] for ts in per_rank])
        checks[np.dtype(dtype).name] = {
            "error": error(got, want),
            "dtypes": sorted({g.dtype.name for g in got}),
            "shapes": [list(g.shape) for g in got] == [list(s) for s in SHAPES],
            "digest": digest(got),
        }
    # fp16 compression: the float32 tensors are cast to float16, then Adasum (as Horovod)
    mine = [t.astype(np.float32) for t in per_rank[rank]]
    got = engine.allreduce(mine, ReduceSpec.of("adasum", compression="fp16"), name="adasum_fp16")
    want = reference([[t.astype(np.float16) for t in ts] for ts in per_rank])
    checks["fp16_compression"] = {"error": error(got, want), "dtype": got[0].dtype.name}
    # the pairwise rule's two limits on whole tensors: parallel -> average, orthogonal -> sum
    v = np.zeros(size * 2)
    v[2 * rank] = 1.0 + rank
    got = engine.allreduce([v, np.full(3, 2.0 + rank)], ADASUM, name="limits")
    checks["orthogonal_sum"] = got[0].tolist() == [
        float(1 + i // 2) * (i % 2 == 0) for i in range(2 * size)
    ]
    checks["parallel"] = got[1].tolist()


def process_sets(rank: int, checks: dict) -> None:
    """4 ranks: Adasum among the members of {1, 3} and {0, 2}; a set of 3 is refused."""
    odd, even = add_process_set([1, 3]), add_process_set([0, 2])
    three = add_process_set([0, 1, 2])
    mine = odd if rank in (1, 3) else even
    per_rank = tensors_of(4, seed=11)
    got = engine_for(mine).allreduce(per_rank[rank], ADASUM, name="set")
    want = reference([per_rank[r] for r in mine.ranks])
    checks["set_error"] = error(got, want)
    if rank in three.ranks:
        try:
            engine_for(three).allreduce([np.ones(2)], ADASUM, name="three")
            checks["three"] = "no error"
        except UnsupportedError as err:  # a NotImplementedError, as Horovod raises
            checks["three"] = isinstance(err, NotImplementedError) and "power-of-two" in str(err)


def hierarchical(engine, rank: int, size: int, checks: dict) -> None:
    nodes = engine.topology.num_nodes
    per_rank = tensors_of(size)
    per_node = size // nodes
    averages = [
        [
            np.mean([per_rank[n * per_node + k][i] for k in range(per_node)], axis=0)
            for i in range(len(SHAPES))
        ]
        for n in range(nodes)
    ]
    for dtype in (np.float32, np.float64):
        mine = [t.astype(dtype) for t in per_rank[rank]]
        got = engine.allreduce(mine, ADASUM, name=f"h_{np.dtype(dtype).name}")
        checks[np.dtype(dtype).name] = {
            "error": error(got, reference(averages)),
            "digest": digest(got),
        }
    checks["form"] = type(engine.adasum()).__name__
    checks["nodes"] = nodes


def main() -> None:
    mode = sys.argv[1]
    engine = basics.init(process_sets="dynamic")
    rank, size = engine.rank, engine.size
    checks: dict = {"size": size}
    if mode == "flat":
        flat(engine, rank, size, checks)
        if size == 4:
            process_sets(rank, checks)
    else:
        hierarchical(engine, rank, size, checks)
    report(rank, checks)
    basics.shutdown()


if __name__ == "__main__":
    main()
