"""Framework-neutral core of ddl_tf: numpy buffers over mpi4py communicators.

Nothing in this package imports TensorFlow or Keras, and nothing imports
``mpi4py.MPI`` at module level (that would initialize MPI on import); MPI is
loaded by :func:`ddl_tf.core.mpi.load` when ``init()`` runs.

Modules, in data-flow order: :mod:`~ddl_tf.core.basics` (``init()``, rank
queries), :mod:`~ddl_tf.core.current` (the current :class:`~ddl_tf.core.job.Job`:
one membership's communicator, engine, hosts and process sets),
:mod:`~ddl_tf.core.process_sets`,
:mod:`~ddl_tf.core.topology` and
:mod:`~ddl_tf.core.topology_file` (who is where), :mod:`~ddl_tf.core.comms`
(finding nodes through MPI, sub-communicators), :mod:`~ddl_tf.core.mpi`
(dtype and reduction tables), :mod:`~ddl_tf.core.algorithms` (flat, ring,
hierarchical, asa), :mod:`~ddl_tf.core.selection` (``auto``; its tables are
learnt from benchmark timings by ``benchmarks/policy_fit.py``),
:mod:`~ddl_tf.core.fusion` (fusion and gradient buckets), :mod:`~ddl_tf.core.compression`,
:mod:`~ddl_tf.core.movement` (gather, broadcast, alltoall),
:mod:`~ddl_tf.core.negotiation` (mismatch and stall detection),
:mod:`~ddl_tf.core.timeline`, :mod:`~ddl_tf.core.guard` (the engine's
runtime state and each collective's critical section), and :mod:`~ddl_tf.core.engine`, which ties them into
collectives on numpy arrays.
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
