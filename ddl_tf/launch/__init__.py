"""The launch library behind ``ddlrun``: hosts, the mpirun command, pre-flight checks.

:mod:`~ddl_tf.launch.hosts` parses ``-H``/``--hostfile`` and places ranks,
:mod:`~ddl_tf.launch.command` finds ``mpirun`` (the one lookup every caller
uses) and builds its argument list and environment, and
:mod:`~ddl_tf.launch.checks` runs the pre-flight checks. It depends on
nothing above it: the rehearsal cluster (:mod:`ddl_tf.cluster`) uses it, and
the ``ddlrun`` command line (:mod:`ddl_tf.ddlrun`) sits on top of both.
"""

__all__: list[str] = []
