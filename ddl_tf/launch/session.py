"""Private places for Open MPI's files, one set per ddlrun job, removed when it ends.

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

The ranks' shared-memory transport (``btl/sm``) keeps one 16 MiB backing file
per rank, ``sm_segment.<host>.<uid>.<job>.<local rank>``, in ``/dev/shm``,
outside the session directory; killed ranks leave them there, in host memory.
:func:`private_sm_directory` gives each job whose ranks all run on this
machine a fresh ``/dev/shm/ddlrun-sm-XXXXXXXX`` instead (still host memory,
so no slower), through ``btl_sm_backing_directory``
(``OMPI_MCA_btl_sm_backing_directory``, which ``mpirun`` forwards to the
ranks), removed when the job ends. A directory the user chose wins (the
parameter, or its old name ``btl_vader_backing_directory``, in the
environment, the extra mpirun arguments or the parameter files as
``ompi_info`` reports them, ~50 ms); nothing is set where ``/dev/shm`` is
not a writable directory (Open MPI's default stays as it was), for ranks on
other hosts (the directory exists here only: their shared-memory transport
would turn itself off), or for another MPI.

Example:
    >>> import os
    >>> from ddl_tf import env
    >>> from ddl_tf.launch.session import private_session_base
    >>> with private_session_base("mpirun", [], flavor="openmpi", same_machine=True,
    ...                           environ={}) as variables:
    ...     base = variables[env.PRTE_MCA_prte_local_tmpdir_base]
    ...     variables[env.PRTE_MCA_prte_remote_tmpdir_base] == base, os.path.isdir(base)
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
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ddl_tf import env

__all__ = [
    "SESSION_PARAMETERS",
    "SESSION_VARIABLES",
    "PREFIX",
    "SM_PARAMETERS",
    "SM_VARIABLES",
    "SM_PREFIX",
    "SHM",
    "session_base_setting",
    "private_session_base",
    "sm_directory_setting",
    "private_sm_directory",
]

SESSION_PARAMETERS = ("prte_tmpdir_base", "prte_local_tmpdir_base", "prte_remote_tmpdir_base")
"""PRRTE's MCA parameters for the base of the session directories (all daemons; ``mpirun``'s
own; the other nodes'). ``prte_info --all`` lists them."""

SESSION_VARIABLES = (
    env.PRTE_MCA_prte_tmpdir_base,
    env.PRTE_MCA_prte_local_tmpdir_base,
    env.PRTE_MCA_prte_remote_tmpdir_base,
)
"""... and their environment variables, in the same order."""

PREFIX = "ddlrun-ompi-"
"""How the names of ddlrun's private session bases begin (the rest is ``mkdtemp``'s)."""

SM_PARAMETERS = ("btl_sm_backing_directory", "btl_vader_backing_directory")
"""Open MPI's MCA parameter for the directory of the shared-memory backing files, and its
older name (a synonym). ``ompi_info --param btl sm --level 9`` lists it."""

SM_VARIABLES = (env.OMPI_MCA_btl_sm_backing_directory, env.OMPI_MCA_btl_vader_backing_directory)
"""... and their environment variables, in the same order."""

SM_PREFIX = "ddlrun-sm-"
"""How the names of ddlrun's private shared-memory directories begin."""

SHM = "/dev/shm"
"""Open MPI's default directory of the shared-memory backing files on Linux (host memory),
where ddlrun makes the job's own."""

INFO_TIMEOUT_S = 30.0
"""Seconds ``prte_info``/``ompi_info`` may take (they answer in milliseconds)."""

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
    return _user_setting(SESSION_VARIABLES, SESSION_PARAMETERS, mpi_args, environ) or (
        _parameter_files_setting(mpirun, environ)
    )


def _user_setting(
    variables: Sequence[str],
    parameters: Sequence[str],
    mpi_args: Sequence[str],
    environ: Mapping[str, str] | None,
) -> str | None:
    """The first of ``variables`` set in ``environ``, else an mpirun argument naming one of
    ``parameters``, as ``"NAME=value"`` or ``"mpirun argument ARG"``; None when neither."""
    for variable in variables:
        value = env.get(variable, environ)
        if value:
            return f"{variable}={value}"
    for arg in mpi_args:
        if any(name in arg for name in parameters):
            return f"mpirun argument {arg}"
    return None


def _info_output(
    mpirun: str, tool: str, args: Sequence[str], environ: Mapping[str, str] | None
) -> str | None:
    """What ``tool`` (``prte_info``, ``ompi_info``) next to ``mpirun`` prints; None without it."""
    found = shutil.which(mpirun)
    if found is None:
        return None
    info = Path(found).parent / tool
    if not info.is_file():
        return None
    try:
        return subprocess.run(
            [str(info), *args],
            capture_output=True,
            text=True,
            timeout=INFO_TIMEOUT_S,
            env=env.snapshot(environ),
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _parameter_files_setting(mpirun: str, environ: Mapping[str, str] | None) -> str | None:
    """The base set in Open MPI's parameter files, as ``prte_info`` next to ``mpirun`` sees it."""
    out = _info_output(mpirun, "prte_info", ["--all"], environ)
    for name, value in _VALUE.findall(" ".join((out or "").split())):
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
    with _scratch_directory(PREFIX, env.get("TMPDIR", environ) or None) as base:
        variables = {}
        if base is not None:
            variables[env.PRTE_MCA_prte_local_tmpdir_base] = base
            if same_machine:
                variables[env.PRTE_MCA_prte_remote_tmpdir_base] = base
        yield variables


@contextlib.contextmanager
def _scratch_directory(prefix: str, parent: str | None) -> Iterator[str | None]:
    """A fresh directory ``<parent>/<prefix>XXXXXXXX`` for the ``with`` block, removed with
    whatever is in it at the end; None when it cannot be made (nothing is then set)."""
    try:
        directory = tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError:
        yield None
        return
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def sm_directory_setting(
    mpirun: str, mpi_args: Sequence[str], environ: Mapping[str, str] | None = None
) -> str | None:
    """Where the user already set the directory of the shared-memory backing files, if anywhere.

    Args:
        mpirun: The launcher (its ``ompi_info`` next to it reads the parameter files).
        mpi_args: Extra mpirun arguments of the job (``--mpi-args``).
        environ: The environment ``mpirun`` gets (default: this process's).

    Returns:
        The setting, e.g. ``"OMPI_MCA_btl_sm_backing_directory=/scratch"``, or None.

    Example:
        >>> sm_directory_setting("mpirun", ["--mca", "btl_sm_backing_directory", "/x"], {})
        'mpirun argument btl_sm_backing_directory'
    """
    return _user_setting(SM_VARIABLES, SM_PARAMETERS, mpi_args, environ) or (
        _ompi_info_sm_setting(mpirun, environ)
    )


def _ompi_info_sm_setting(mpirun: str, environ: Mapping[str, str] | None) -> str | None:
    """The directory set anywhere ``ompi_info`` next to ``mpirun`` looks (its parameter files)."""
    name = SM_PARAMETERS[0]
    args = ["--param", "btl", "sm", "--level", "9", "--parsable"]
    out = _info_output(mpirun, "ompi_info", args, environ) or ""
    prefix = f"mca:btl:sm:param:{name}:"
    fields = dict(
        line[len(prefix) :].partition(":")[::2]
        for line in out.splitlines()
        if line.startswith(prefix)
    )
    source = fields.get("source", "default")
    if source == "default":
        return None
    return f"{name}={fields.get('value', '')} (ompi_info: {source})"


@contextlib.contextmanager
def private_sm_directory(
    mpirun: str,
    mpi_args: Sequence[str],
    *,
    flavor: str,
    same_machine: bool,
    environ: Mapping[str, str] | None = None,
    shm: str = SHM,
) -> Iterator[dict[str, str]]:
    """A fresh directory in host memory for the job's shared-memory backing files.

    Args:
        mpirun: The launcher.
        mpi_args: Extra mpirun arguments of the job.
        flavor: ``"openmpi"`` or ``"hydra"``; only Open MPI gets one.
        same_machine: Every rank of the job runs on this machine (the directory exists
            here only); else nothing is set.
        environ: The environment ``mpirun`` gets (default: this process's).
        shm: Where to make it (``/dev/shm``); nothing is set unless it is a writable
            directory.

    Yields:
        The variables to add to ``mpirun``'s environment (Open MPI forwards them to the
        ranks): ``OMPI_MCA_btl_sm_backing_directory`` and the directory
        ``<shm>/ddlrun-sm-XXXXXXXX``, removed with whatever is in it when the block ends;
        none when the user set a directory (:func:`sm_directory_setting`) or in the
        cases above.

    Example:
        >>> with private_sm_directory("mpirun", [], flavor="openmpi", same_machine=False,
        ...                           environ={}) as variables:
        ...     variables  # ranks on other hosts: they keep Open MPI's default
        {}
    """
    usable = os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK)
    if (
        flavor != "openmpi"
        or not same_machine
        or not usable
        or sm_directory_setting(mpirun, mpi_args, environ) is not None
    ):
        yield {}
        return
    with _scratch_directory(SM_PREFIX, shm) as directory:
        yield {} if directory is None else {env.OMPI_MCA_btl_sm_backing_directory: directory}
