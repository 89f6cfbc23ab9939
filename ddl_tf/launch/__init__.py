"""``ddlrun``: an mpirun-like launcher with sanity checks, in the spirit of PowerAI's.

:mod:`~ddl_tf.launch.hosts` parses ``-H``/``--hostfile``,
:mod:`~ddl_tf.launch.command` finds ``mpirun`` and builds its argument list
and environment, :mod:`~ddl_tf.launch.checks` runs the pre-flight checks and
:mod:`~ddl_tf.launch.cli` is the console script (``main(argv) -> int``).
"""

__all__: list[str] = []
