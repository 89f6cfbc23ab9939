"""The launch library behind ``ddlrun``: hosts, the mpirun command, pre-flight checks, supervision.

:mod:`~ddl_tf.launch.hosts` parses ``-H``/``--hostfile``, places ranks and
counts this machine's slots, :mod:`~ddl_tf.launch.command` finds ``mpirun``
(the one lookup every caller uses) and builds its argument list and
environment, :mod:`~ddl_tf.launch.checks` runs the pre-flight checks, and
:mod:`~ddl_tf.launch.supervise` runs ``mpirun`` and ends the whole job on a
stop signal, in a base for ``mpirun``'s session directories of the job's own
(:mod:`~ddl_tf.launch.session`). It depends on nothing above it: the rehearsal cluster
(:mod:`ddl_tf.cluster`) uses it, and the ``ddlrun`` command line
(:mod:`ddl_tf.ddlrun`) sits on top of both.
"""

__all__: list[str] = []
