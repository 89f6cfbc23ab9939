"""``ddl_tf.run(fn, ...)``: run a Python function on every rank of a job, in the place of ``horovod.run``.

The function and its arguments are pickled (``cloudpickle``: lambdas and
functions of ``__main__`` included) into a private folder, ``ddlrun`` launches
``python -m ddl_tf.launch.run_fn`` on every rank with the same options as on
the command line (``np``, ``hosts``, the elastic ones), each rank unpickles
and calls the function and writes what it returns, and ``run`` returns the
results ordered by rank. In an elastic job the ranks are those of the final
membership (a rank that left returns nothing).

Example (not run here: it starts MPI processes)::

    import ddl_tf

    def train(lr):
        import ddl_tf.keras as hvd
        hvd.init()
        return hvd.rank(), hvd.size()

    ddl_tf.run(train, args=(0.1,), np=2)                      # [(0, 2), (1, 2)]
    ddl_tf.run(train, args=(0.1,), min_np=1, max_np=4, hosts="localhost:2,127.0.0.1:2")
"""

from __future__ import annotations

import logging
import pickle
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddl_tf.errors import LaunchError

__all__ = ["run", "RunError"]

logger = logging.getLogger(__name__)


class RunError(LaunchError):
    """The job that :func:`run` started failed; the message has ddlrun's exit code and output."""


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    np: int | None = None,
    *,
    num_proc: int | None = None,
    min_np: int | None = None,
    min_num_proc: int | None = None,
    max_np: int | None = None,
    max_num_proc: int | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    host_discovery_script: str | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[float, float] | None = None,
    elastic_timeout: float | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    executable: str | None = None,
    verbose: bool | int | None = False,
    start_timeout: float | None = None,
    network_interfaces: str | Sequence[str] | None = None,
    output_filename: str | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    disable_cache: bool | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on every rank of a new job; return the results by rank.

    Takes ``horovod.run``'s arguments (``num_proc``/``np``, ``min_num_proc``/
    ``min_np``, ``max_num_proc``/``max_np``, ``slots`` as ``--slots-per-host``,
    ``cooldown_range``) and ddlrun's.

    Args:
        func: The function each rank calls (it calls ``init()`` itself).
        args: Positional arguments for ``func``.
        kwargs: Keyword arguments for ``func``.
        np: Number of ranks (elastic jobs: the initial number).
        num_proc: Horovod's name for ``np``.
        min_np: Fewest ranks (makes the job elastic).
        min_num_proc: Horovod's name for ``min_np``.
        max_np: Most ranks of an elastic job.
        max_num_proc: Horovod's name for ``max_np``.
        hosts: ``host:slots,...``.
        hostfile: A hostfile, instead of ``hosts``.
        host_discovery_script: Elastic jobs: prints the available hosts.
        slots: Slots of a discovered host printed without ``:slots``.
        reset_limit: Elastic jobs: most membership changes.
        cooldown_range: Elastic jobs: ``(low, high)`` seconds a failed host stays out.
        elastic_timeout: Elastic jobs: seconds to wait for ``min_np`` slots.
        mpi_args: Extra mpirun arguments (one string).
        network_interface: Interfaces for MPI's TCP traffic.
        executable: The ranks' Python (default: this one).
        verbose: Show ddlrun's and the ranks' output as the job runs (Horovod's
            levels ``1``/``2`` count as True).
        start_timeout: Seconds for the ranks to start (``--start-timeout``).
        network_interfaces: Horovod's name for ``network_interface`` (a list or
            ``"eth0,eth1"``).
        output_filename: A folder for every rank's output (Open MPI's
            ``--output dir=...``: ``<folder>/<job>/rank.N/stdout``).
        use_gloo: Accepted for Horovod's scripts (its elastic mode needs Gloo):
            ddl_tf runs every job over MPI, elastic ones over Open MPI's fault
            tolerance, and says so in a warning.
        use_mpi: Accepted: ddl_tf always runs over MPI.
        disable_cache: Accepted: ddl_tf keeps no cache of host checks.
        ssh_port: Refused with the alternative (``~/.ssh/config``).
        ssh_identity_file: Refused with the alternative (``~/.ssh/config``).

    Returns:
        What ``func`` returned on each rank, ordered by rank.

    Raises:
        RunError: The job failed (ddlrun's exit code and the end of its output).
        LaunchError: ``cloudpickle`` is missing, no ``ddlrun`` is installed, or an
            ssh option was given.
    """
    if ssh_port is not None or ssh_identity_file is not None:
        raise LaunchError(
            "ddl_tf.run takes no ssh options: Open MPI starts remote ranks with ssh, which "
            "reads ~/.ssh/config; add a 'Host <name>' entry with 'Port N' and "
            "'IdentityFile PATH' for each host instead of ssh_port/ssh_identity_file."
        )
    if use_gloo:
        logger.warning(
            "ddl_tf.run: use_gloo=True - ddl_tf runs every job over MPI (elastic jobs over "
            "Open MPI's fault tolerance, ULFM), which gives Horovod's Gloo-only elastic "
            "mode; the job runs over MPI."
        )
    if network_interface is None and network_interfaces is not None:
        network_interface = (
            network_interfaces
            if isinstance(network_interfaces, str)
            else ",".join(network_interfaces)
        )
    if output_filename is not None:
        mpi_args = " ".join(
            part for part in (mpi_args, f"--output dir={shlex.quote(output_filename)}") if part
        )
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - installed with the ddl extra
        raise LaunchError(
            "ddl_tf.run needs cloudpickle to send the function to the ranks; pip install "
            "cloudpickle (it comes with the 'ddl' extra)."
        ) from None
    ddlrun = shutil.which("ddlrun", path=str(Path(sys.executable).parent)) or shutil.which("ddlrun")
    if ddlrun is None:
        raise LaunchError("ddl_tf.run needs the ddlrun command; install tflms-ddl with pip.")
    options: list[str] = []
    for flag, value in (
        ("-np", np if np is not None else num_proc),
        ("--min-np", min_np if min_np is not None else min_num_proc),
        ("--max-np", max_np if max_np is not None else max_num_proc),
        ("-H", hosts),
        ("--hostfile", hostfile),
        ("--host-discovery-script", host_discovery_script),
        ("--slots-per-host", slots),
        ("--reset-limit", reset_limit),
        ("--elastic-timeout", elastic_timeout),
        ("--start-timeout", start_timeout),
        ("--mpi-args", mpi_args),
        ("--network-interface", network_interface),
    ):
        if value is not None:
            options += [flag, str(value)]
    if cooldown_range is not None:
        options += ["--blacklist-cooldown-range", *(str(v) for v in cooldown_range)]
    with tempfile.TemporaryDirectory(prefix="ddl_tf-run-") as folder:
        work = Path(folder)
        (work / "call.pkl").write_bytes(cloudpickle.dumps((func, tuple(args), kwargs or {})))
        command = [
            ddlrun,
            *options,
            executable or sys.executable,
            "-m",
            "ddl_tf.launch.run_fn",
            str(work),
        ]
        done = subprocess.run(
            command,
            capture_output=not verbose,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            output = "" if verbose else (done.stdout + done.stderr)[-4000:]
            raise RunError(
                f"ddl_tf.run: the job failed (ddlrun exit code {done.returncode}).\n{output}"
            )
        results = sorted(work.glob("result.*.pkl"), key=lambda p: int(p.name.split(".")[1]))
        return [pickle.loads(p.read_bytes()) for p in results]
