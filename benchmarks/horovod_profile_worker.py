"""Where ddl_tf's eager allreduce spends its time (cProfile on rank 0), next to one plain MPI_Allreduce.

Usage: mpirun -np 2 python benchmarks/horovod_profile_worker.py BYTES DTYPE
(e.g. 67108864 float32, 16777216 float16). Written to explain where ddl_tf is
slower than Horovod in ``bench_horovod.py``: it times an in-place
``MPI_Allreduce`` of the same buffer (float32 only; MPI has no float16 sum),
then ``ddl_tf.allreduce`` of an eager tensor, then profiles three more calls
and prints the functions with the most own time and who called ``ndarray.copy``.
Runs in the product's environment (Horovod is not needed).
"""

import cProfile
import io
import pstats
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import ddl_tf

comm = MPI.COMM_WORLD
ddl_tf.init()
nbytes = int(sys.argv[1])
dtype = np.dtype(sys.argv[2])
a = np.ones(nbytes // dtype.itemsize, dtype)
x = tf.constant(a)
buf = a.copy()


def t(f, n=3):
    f()
    comm.Barrier()
    s = time.perf_counter()
    for _ in range(n):
        f()
    comm.Barrier()
    return (time.perf_counter() - s) / n * 1e3


plain = (
    t(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM))
    if dtype == np.float32
    else float("nan")
)
fresh = (
    t(lambda: comm.Allreduce(MPI.IN_PLACE, np.ones_like(a), op=MPI.SUM))
    if dtype == np.float32
    else float("nan")
)
ddl = t(lambda: ddl_tf.allreduce(x, op=ddl_tf.Sum))
pr = cProfile.Profile()
comm.Barrier()
pr.enable()
for _ in range(3):
    ddl_tf.allreduce(x, op=ddl_tf.Sum)
pr.disable()
if comm.rank == 0:
    print(
        f"{nbytes >> 20} MiB {dtype}: MPI_Allreduce in place {plain:.1f} ms, same on a fresh np.ones buffer {fresh:.1f} ms, ddl_tf.allreduce(eager) {ddl:.1f} ms"
    )
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    print(s.getvalue()[:1500])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).print_callers("copy")
    print(s.getvalue()[:2500])
ddl_tf.shutdown()
