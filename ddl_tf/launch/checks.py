"""Pre-flight checks of ``ddlrun``: fail in seconds, with a fix, instead of inside a job.

* every host name resolves;
* the program exists (when it is a local script);
* the ranks' Python can import ``ddl_tf``, ``mpi4py`` and ``tensorflow``
  (checked with ``importlib.util.find_spec``, without importing them: on
  this machine, and through mpirun on each remote host).

Example:
    >>> from ddl_tf.launch.checks import python_of
    >>> python_of(["/usr/bin/python3", "train.py"])
    '/usr/bin/python3'
    >>> python_of(["./my_binary"]) is None
    True
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from ddl_tf.errors import LaunchError
from ddl_tf.launch.hosts import EXAMPLE, Host, is_local

__all__ = ["check_hosts_resolve", "check_program", "check_python", "python_of", "IMPORT_CHECK"]

IMPORT_CHECK = (
    "import importlib.util as u, sys\n"
    "missing = [m for m in ('ddl_tf', 'mpi4py', 'tensorflow') if u.find_spec(m) is None]\n"
    "print(('missing: ' + ', '.join(missing)) if missing else 'ok')\n"
    "sys.exit(1 if missing else 0)\n"
)


def check_hosts_resolve(hosts: list[Host]) -> None:
    """Raise :class:`LaunchError` naming every host that does not resolve.

    Args:
        hosts: The hosts of the launch; local names (localhost, this machine's
            hostname) are not looked up.

    Raises:
        LaunchError: a host name does not resolve on this machine.
    """
    bad = []
    for host in hosts:
        if is_local(host.name):
            continue
        try:
            socket.getaddrinfo(host.name, None)
        except OSError as err:
            bad.append(f"{host.name} ({err.strerror or err})")
    if bad:
        raise LaunchError(
            f"ddlrun: cannot resolve host(s) {', '.join(bad)}. Fix the names in -H/--hostfile "
            f"(they must resolve on this machine), e.g. {EXAMPLE}"
        )


def python_of(program: list[str]) -> str | None:
    """The Python interpreter ``program`` runs, or None if it is not a Python command.

    Args:
        program: The command line to launch (program and arguments).

    Returns:
        The interpreter's path (as found on ``PATH``, else as given) when the
        program's name starts with ``python``, else None.
    """
    first = Path(program[0]).name
    if first.startswith("python"):
        return shutil.which(program[0]) or program[0]
    return None


def check_program(program: list[str]) -> None:
    """Raise if the program (or the script given to Python) does not exist here.

    Args:
        program: The command line to launch (program and arguments).

    Raises:
        LaunchError: ``program`` is empty, its executable is not found, or the
            ``.py`` script given to Python does not exist.
    """
    if not program:
        raise LaunchError(f"ddlrun: no program to run; e.g. {EXAMPLE}")
    if python_of(program) is None and shutil.which(program[0]) is None:
        raise LaunchError(
            f"ddlrun: program {program[0]!r} is neither an executable nor a Python script; "
            f"e.g. {EXAMPLE}"
        )
    if python_of(program) is not None and len(program) > 1 and program[1].endswith(".py"):
        if not Path(program[1]).exists():
            raise LaunchError(
                f"ddlrun: script {program[1]!r} does not exist (relative to {os.getcwd()}); "
                f"e.g. {EXAMPLE}"
            )


def check_python(
    python: str,
    environment: dict[str, str],
    remote_hosts: list[Host],
    mpirun_prefix: list[str] | None,
    timeout: float = 120.0,
) -> None:
    """Check that ``python`` can import ddl_tf, mpi4py and tensorflow, here and on remote hosts.

    Args:
        python: Interpreter the ranks run.
        environment: The ranks' environment (PYTHONPATH matters).
        remote_hosts: Non-local hosts; checked through ``mpirun_prefix``.
        mpirun_prefix: mpirun arguments running one process per remote host.
        timeout: Seconds before a check counts as failed.

    Raises:
        LaunchError: A check failed; the message shows its output.
    """
    runs = [("this machine", [python, "-c", IMPORT_CHECK])]
    if remote_hosts and mpirun_prefix:
        names = ", ".join(h.name for h in remote_hosts)
        runs.append((f"host(s) {names}", [*mpirun_prefix, python, "-c", IMPORT_CHECK]))
    for where, cmd in runs:
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, env=environment, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"ddlrun: checking Python on {where} did not finish within {timeout:.0f} s: "
                f"{' '.join(cmd[:4])} ... Check that the hosts are reachable (ssh without a "
                "password) or skip with --skip-checks."
            ) from None
        except OSError as err:
            raise LaunchError(f"ddlrun: cannot run {cmd[0]!r} on {where}: {err}.") from None
        if out.returncode != 0:
            detail = (out.stdout + out.stderr).strip().splitlines()[-3:]
            raise LaunchError(
                f"ddlrun: the ranks' Python ({python}) on {where} cannot run ddl_tf: "
                f"{' / '.join(detail) or 'exit code ' + str(out.returncode)}. Install it there "
                "(pip install 'tflms-ddl[ddl,cpu,mpi]') or set PYTHONPATH, then e.g. " + EXAMPLE
            )
