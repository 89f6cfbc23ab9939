"""A private place for ``mpirun``'s session directory, one per ddlrun job, removed when it ends.

Open MPI 5's ``mpirun`` (PRRTE) keeps its session directory in
``$TMPDIR/ompi.<pid>`` (``prted.<pid>`` for the daemon of a node), with
PMIx's rendezvous file ``pmix.<host>.tool`` in it. A killed ``mpirun``
leaves that directory behind, and a later ``mpirun`` that gets the same pid
refuses to take the file over: it exits 213 ("The PMIx server's listener
thread failed to start") before starting any rank. So ddlrun gives each job
a fresh directory of its own (``tempfile.mkdtemp``, under ``$TMPDIR``) as the
base of those session directories, through PRRTE's MCA parameter
``prte_local_tmpdir_base`` (``PRTE_MCA_prte_local_tmpdir_base`` in
``mpirun``'s environment), and removes it when the job ends, whether it
succeeded, failed or was stopped. No name in it can be left over from
another job, and nothing outside it is ever removed. The ranks' own
``TMPDIR`` is not touched: the parameter reaches ``mpirun`` and its daemons
only.

When every daemon of the job runs on this machine (``--rehearse`` virtual
nodes, or local hosts only), ``prte_remote_tmpdir_base`` points there too;
otherwise the other hosts keep their default (the directory exists on this
machine only). A base the user chose wins: when one of PRRTE's three
parameters (``prte_tmpdir_base`` and its ``local_``/``remote_`` forms) is
set in the environment, in ddlrun's extra mpirun arguments, or in Open MPI's
parameter files (as ``prte_info`` reports them), ddlrun sets nothing -
PRRTE refuses ``prte_tmpdir_base`` together with either of the others. The
same holds for an MPI other than Open MPI.

Example:
    >>> import os
    >>> from ddl_tf.launch.session import private_session_base
    >>> with private_session_base("mpirun", [], flavor="openmpi", same_machine=True,
    ...                           environ={}) as variables:
    ...     base = variables["PRTE_MCA_prte_local_tmpdir_base"]
    ...     variables["PRTE_MCA_prte_remote_tmpdir_base"] == base, os.path.isdir(base)
    (True, True)
    >>> os.path.exists(base)
    False
    >>> with private_session_base("mpirun", [], flavor="openmpi", same_machine=True,
    ...     environ={"PRTE_MCA_prte_tmpdir_base": "/scratch"}) as variables:
    ...     variables
    {}
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ddl_tf import env

__all__ = [
    "SESSION_PARAMETERS",
    "LOCAL_BASE",
    "REMOTE_BASE",
    "PREFIX",
    "session_base_setting",
    "private_session_base",
]

SESSION_PARAMETERS = ("prte_tmpdir_base", "prte_local_tmpdir_base", "prte_remote_tmpdir_base")
"""PRRTE's MCA parameters for the base of the session directories (all daemons; ``mpirun``'s
own; the other nodes'). ``prte_info --all`` lists them."""

LOCAL_BASE = "PRTE_MCA_prte_local_tmpdir_base"
"""The environment variable of ``prte_local_tmpdir_base``, which ddlrun sets for ``mpirun``."""

REMOTE_BASE = "PRTE_MCA_prte_remote_tmpdir_base"
"""... and of ``prte_remote_tmpdir_base``, set too when every daemon runs on this machine."""

PREFIX = "ddlrun-ompi-"
"""How the names of ddlrun's private session bases begin (the rest is ``mkdtemp``'s)."""

PRTE_INFO_TIMEOUT_S = 30.0
"""Seconds ``prte_info --all`` may take (it answers in milliseconds)."""

_VALUE = re.compile(r'"(prte_(?:local_|remote_)?tmpdir_base)" \(current value: "([^"]*)"')


def session_base_setting(
    mpirun: str, mpi_args: Sequence[str], environ: Mapping[str, str] | None = None
) -> str | None:
    """Where the user already set the base of Open MPI's session directories, if anywhere.

    Args:
        mpirun: The launcher (its ``prte_info`` next to it reads the parameter files).
        mpi_args: Extra mpirun arguments of the job (``--mpi-args``).
        environ: The environment ``mpirun`` gets (default: this process's).

    Returns:
        The setting, e.g. ``"PRTE_MCA_prte_tmpdir_base=/scratch"``, or None when none is set.

    Example:
        >>> session_base_setting("mpirun", ["--prtemca", "prte_tmpdir_base", "/x"], {})
        'mpirun argument prte_tmpdir_base'
    """
    for name in SESSION_PARAMETERS:
        value = env.get(f"PRTE_MCA_{name}", environ)
        if value:
            return f"PRTE_MCA_{name}={value}"
    for arg in mpi_args:
        if any(name in arg for name in SESSION_PARAMETERS):
            return f"mpirun argument {arg}"
    return _parameter_files_setting(mpirun, environ)


def _parameter_files_setting(mpirun: str, environ: Mapping[str, str] | None) -> str | None:
    """The base set in Open MPI's parameter files, as ``prte_info`` next to ``mpirun`` sees it."""
    found = shutil.which(mpirun)
    if found is None:
        return None
    info = Path(found).parent / "prte_info"
    if not info.is_file():
        return None
    try:
        out = subprocess.run(
            [str(info), "--all"],
            capture_output=True,
            text=True,
            timeout=PRTE_INFO_TIMEOUT_S,
            env=env.snapshot(environ),
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for name, value in _VALUE.findall(" ".join(out.split())):
        if value:
            return f"{name}={value} (Open MPI's parameter files)"
    return None


@contextlib.contextmanager
def private_session_base(
    mpirun: str,
    mpi_args: Sequence[str],
    *,
    flavor: str,
    same_machine: bool,
    environ: Mapping[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """A fresh base for the job's session directories while the ``with`` block runs.

    Args:
        mpirun: The launcher.
        mpi_args: Extra mpirun arguments of the job.
        flavor: ``"openmpi"`` or ``"hydra"`` (:func:`~ddl_tf.launch.command.mpi_flavor`);
            only Open MPI gets a private base.
        same_machine: Every daemon of the job runs on this machine (virtual nodes,
            local hosts): the other nodes' base is the same directory.
        environ: The environment ``mpirun`` gets (default: this process's); its
            ``TMPDIR`` is where the directory is made.

    Yields:
        The variables to add to ``mpirun``'s environment: none when the user set a base
        (:func:`session_base_setting`), for another MPI, or when the directory cannot be
        made (``mpirun`` then does as it always did).
    """
    if flavor != "openmpi" or session_base_setting(mpirun, mpi_args, environ) is not None:
        yield {}
        return
    try:
        base = tempfile.mkdtemp(prefix=PREFIX, dir=env.get("TMPDIR", environ) or None)
    except OSError:
        yield {}
        return
    try:
        variables = {LOCAL_BASE: base}
        if same_machine:
            variables[REMOTE_BASE] = base
        yield variables
    finally:
        shutil.rmtree(base, ignore_errors=True)
