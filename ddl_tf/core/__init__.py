"""Framework-neutral core of ddl_tf: numpy buffers over mpi4py communicators.

Nothing in this package imports TensorFlow or Keras, and nothing imports
``mpi4py.MPI`` at module level (that would initialize MPI on import); MPI is
loaded by :func:`ddl_tf.core.numerics.mpi.load` when ``init()`` runs.

Sub-packages, lowest first (each uses only those before it and
:mod:`~ddl_tf.core.timeline`):

* :mod:`~ddl_tf.core.numerics`: reduction ops, wire compression, scale
  factors, float16/bfloat16 conversion (with its C kernels), aligned
  buffers, and :mod:`~ddl_tf.core.numerics.mpi` (mpi4py's late loading, the
  dtype and reduction tables).
* :mod:`~ddl_tf.core.topology`: who is where (:mod:`~ddl_tf.core.topology.layout`,
  :mod:`~ddl_tf.core.topology.topology_file`) and the MPI sub-communicators
  (:mod:`~ddl_tf.core.topology.comms`).
* :mod:`~ddl_tf.core.algorithms`: the allreduce algorithms (flat, ring,
  hierarchical, asa) and their steps, Adasum, and ``auto``'s
  :mod:`~ddl_tf.core.algorithms.selection` (its tables are learnt from
  benchmark timings by ``benchmarks/policy_fit.py``).
* :mod:`~ddl_tf.core.collectives`: the :mod:`~ddl_tf.core.collectives.engine`
  (collectives on numpy arrays) and what it uses: negotiation (mismatch and
  stall detection), the guard (runtime state, each collective's critical
  section), fusion and gradient buckets, movement (gather, broadcast,
  alltoall), join, and :mod:`~ddl_tf.core.collectives.reduce_spec` (a
  reduction's settings, parsed once by the caller: what the engine's
  allreduce and reducescatter take).

At the top, the job: :mod:`~ddl_tf.core.basics` (``init()``, rank queries),
:mod:`~ddl_tf.core.current` (the current :class:`~ddl_tf.core.job.Job`: one
membership's communicator, engine, hosts and process sets),
:mod:`~ddl_tf.core.process_sets`, and :mod:`~ddl_tf.core.timeline`.
"""

HOROVOD_BASICS = (
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "start_timeline",
    "stop_timeline",
    "collective_stats",
)
"""Horovod's initialization, rank-query, build-flag and timeline names that
:mod:`ddl_tf.core.basics` defines (here, where importing them imports nothing)."""

__all__ = ["HOROVOD_BASICS"]
