"""A rank that never calls init() makes the others fail in time, naming it (issue 45).

Without the bound, rank 0 waited in MPI_Init for as long as rank 1 slept, and
for ever when rank 1 exited before rank 0 reached it (measured, Open MPI 5.0).
The start-up check of ddlrun is tested first with ranks played by threads
(no MPI), then each bound under a real launcher: ddlrun's check, the check-in
over MPI (rank 1 runs MPI but never calls init()), and the watchdog of
MPI_Init under plain mpirun.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from ddl_tf.config import DDLConfig
from ddl_tf.core.startup import VERDICT_MARGIN_SECONDS, check_in_with_launcher
from ddl_tf.errors import ConfigError, StartupError
from ddl_tf.launch.startup import StartupCheck
from ddl_tf.launch.supervise import FinishedWatch
from tests.harness import mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

WORKER = Path(__file__).parent / "startup_worker.py"
REPO = Path(__file__).resolve().parents[2]
DDLRUN = Path(sys.executable).parent / "ddlrun"
HELLO = REPO / "tests" / "parallel" / "workers" / "hello.py"
TIMEOUT = 3.0


def _ranks(check: StartupCheck, ranks, size, timeout=TIMEOUT, members=None):
    """Play ``ranks`` checking in at once; returns each one's outcome and seconds."""
    outcomes: dict[int, tuple[object, float]] = {}

    def rank(r: int) -> None:
        start = time.monotonic()
        try:
            outcomes[r] = (check_in_with_launcher(check.address, r, size, timeout, members), 0.0)
        except StartupError as err:
            outcomes[r] = (err, time.monotonic() - start)

    threads = [threading.Thread(target=rank, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout + VERDICT_MARGIN_SECONDS + 5)
    return outcomes


def test_ranks_that_never_report_are_named_to_every_waiting_rank_and_to_ddlrun():
    said: list[str] = []
    check = StartupCheck(4, report=said.append, stop=threading.Event())
    try:
        outcomes = _ranks(check, [0, 2], 4)
    finally:
        check.close()
    expected = "Rank(s) 1, 3 of 4 did not call ddl_tf.init() within 3 s of the first rank's init()"
    for rank in (0, 2):
        error, seconds = outcomes[rank]
        assert isinstance(error, StartupError) and expected in str(error), error
        assert TIMEOUT - 0.5 <= seconds < TIMEOUT + VERDICT_MARGIN_SECONDS, seconds
    assert said == [f"ddlrun: {outcomes[0][0]}"] and check.stop.is_set()


def test_when_all_report_all_go_on_and_a_rank_that_then_never_starts_mpi_is_named():
    said: list[str] = []
    check = StartupCheck(2, report=said.append, stop=threading.Event())
    try:
        outcomes = _ranks(check, [0, 1], 2)
        assert all(callable(started) for started, _ in outcomes.values())
        outcomes[0][0]()  # rank 0's MPI_Init returned; rank 1 died before its own
        deadline = time.monotonic() + TIMEOUT + 5
        while not check.stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        check.close()
    assert check.stop.is_set(), "ddlrun was not told to end the job"
    assert len(said) == 1 and "MPI's start-up did not complete on rank(s) 1 of 2" in said[0]


def test_a_job_that_starts_leaves_the_check_quiet_and_init_comm_lists_count():
    said: list[str] = []
    check = StartupCheck(4, report=said.append, stop=threading.Event())
    try:  # init(comm=[0, 1]): ranks 2 and 3 are not expected to call init()
        outcomes = _ranks(check, [0, 1], 4, members=[0, 1])
        for started, _ in outcomes.values():
            started()
        deadline = time.monotonic() + 5
        while check.outcome is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        check.close()
    assert check.outcome == "started" and said == [] and not check.stop.is_set()


def test_an_unreachable_check_and_bad_settings_are_refused_with_the_fix():
    with pytest.raises(StartupError, match="cannot reach ddlrun's start-up check at 127.0.0.1:1"):
        check_in_with_launcher("127.0.0.1:1", 0, 2, TIMEOUT)
    assert DDLConfig.from_env({"HOROVOD_START_TIMEOUT": "30"}).start_timeout_seconds == 30
    assert DDLConfig.from_env({}).start_timeout_seconds == 60
    with pytest.raises(ConfigError, match="DDL_START_TIMEOUT=60"):
        DDLConfig.from_env({"DDL_START_TIMEOUT": "-1"})


def test_over_a_unix_socket_the_check_names_the_missing_and_removes_its_file(tmp_path):
    """The --rehearse cluster's virtual nodes reach ddlrun's check through a socket file."""
    path = tmp_path / "check.sock"
    said: list[str] = []
    check = StartupCheck(2, report=said.append, stop=threading.Event(), unix=str(path))
    try:
        assert check.address == f"unix:{path}" and path.exists()
        outcomes = _ranks(check, [0], 2)
    finally:
        check.close()
    error, seconds = outcomes[0]
    assert isinstance(error, StartupError) and "Rank(s) 1 of 2 did not call" in str(error)
    assert check.missing == [1] and said == [f"ddlrun: {error}"] and check.stop.is_set()
    assert not path.exists(), "the socket file was left"


def test_an_elastic_launch_that_did_not_start_drops_the_missing_ranks_hosts():
    said: list[str] = []
    watch = FinishedWatch(said.append)
    watch.start_check_failed("ddlrun: Rank(s) 2, 3 of 4 did not call ...", ["b", "b"])
    assert watch.halt.is_set() and said == ["ddlrun: Rank(s) 2, 3 of 4 did not call ..."]
    assert watch.relaunchable(1) and watch.dropped_hosts == ["b"]
    assert watch.why_dropped(["b"]).startswith("ranks on host b did not call init() within")
    assert not watch.relaunchable(143)  # ddlrun was stopped: never relaunched
    assert watch.status(1) == 1 and "stopped at the start of its launch" in said[-1]
    watch.reset()
    assert not watch.halt.is_set() and watch.not_started is None and not watch.dropped_hosts


# --------------------------------------------------------------------------- real launchers


def _job(
    tmp_path: Path, launcher: list[str], mode: str, *args: str
) -> tuple[subprocess.CompletedProcess, float, dict, str]:
    token = uuid.uuid4().hex
    env = mpi_env({"DDL_TEST_OUTDIR": str(tmp_path), "DDL_START_TIMEOUT": str(TIMEOUT)})
    start = time.monotonic()
    job = subprocess.run(
        [*launcher, sys.executable, str(WORKER), mode, token, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS,
    )
    took = time.monotonic() - start
    report = tmp_path / "rank0.json"
    rank0 = json.loads(report.read_text()) if report.exists() else {}
    survivors = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
    return job, took, rank0, survivors


def _mpirun() -> list[str]:
    return [mpirun_executable(), "-np", "2", "--oversubscribe", "--bind-to", "none"]


@pytest.mark.parallel
@pytest.mark.parametrize("mode", ["sleep", "exit"])
def test_under_ddlrun_a_rank_that_never_calls_init_is_named_within_the_timeout(tmp_path, mode):
    mpirun_executable()  # skips without an MPI
    job, took, rank0, survivors = _job(
        tmp_path, [str(DDLRUN), "-np", "2", "--start-timeout", str(TIMEOUT)], mode
    )
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    assert rank0.get("raised") == "StartupError", output
    named = "Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s"
    assert named in rank0["message"] and f"ddlrun: {named}" in job.stderr, output
    assert TIMEOUT - 0.5 <= rank0["seconds"] < TIMEOUT + VERDICT_MARGIN_SECONDS, rank0
    assert took < HANG_SECONDS, f"the job took {took:.1f} s to end"
    assert survivors == "", "processes of the failed job survive"


@pytest.mark.parallel
def test_under_mpirun_a_rank_that_runs_mpi_but_never_calls_init_is_named(tmp_path):
    job, took, rank0, survivors = _job(tmp_path, _mpirun(), "mpi")
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    assert rank0.get("raised") == "StartupError", output
    assert "Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s" in rank0["message"]
    assert TIMEOUT - 0.5 <= rank0["seconds"] < TIMEOUT + VERDICT_MARGIN_SECONDS, rank0
    assert "the job could not start; aborting all ranks (MPI_Abort)" in job.stderr, output
    assert took < HANG_SECONDS and survivors == "", output


@pytest.mark.parallel
def test_under_mpirun_mpi_init_is_bounded_by_the_watchdog(tmp_path):
    job, took, rank0, survivors = _job(tmp_path, _mpirun(), "sleep")
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    assert rank0 == {}, rank0  # killed inside MPI_Init: no Python ran to report
    assert "ddl_tf: rank 0: MPI's start-up (MPI_Init) did not complete within 3 s" in job.stderr
    assert "under ddlrun the start-up check names them" in job.stderr
    assert took < HANG_SECONDS and survivors == "", output


# --------------------------------------------------------------------------- elastic jobs


@pytest.mark.parallel
def test_an_elastic_job_whose_rank_never_calls_init_ends_naming_it_when_it_cannot_drop_it(
    tmp_path,
):
    """An elastic launch's ranks report to ddlrun's check too: MPI's start-up of the launch
    waits for every rank, so the launch ends, naming the missing rank, instead of hanging.
    Its host is every rank's: without it the job cannot keep --min-np 2, so it ends."""
    mpirun_executable()  # skips without an MPI
    launcher = [str(DDLRUN), "-np", "2", "--min-np", "2", "-H", "localhost:2"]
    job, took, rank0, survivors = _job(
        tmp_path, [*launcher, "--start-timeout", str(TIMEOUT)], "sleep"
    )
    output = job.stdout + job.stderr
    assert job.returncode == 1, output
    assert rank0.get("raised") == "StartupError", output
    named = "Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s"
    assert named in rank0["message"] and f"ddlrun: {named}" in job.stderr, output
    assert "ranks on host localhost did not call init() within DDL_START_TIMEOUT" in job.stderr
    assert "no relaunch: ddlrun: --min-np 2 needs that many slots" in job.stderr, output
    assert "ddlrun: the elastic job stopped at the start of its launch" in job.stderr, output
    assert TIMEOUT - 0.5 <= rank0["seconds"] < TIMEOUT + VERDICT_MARGIN_SECONDS, rank0
    assert took < HANG_SECONDS, f"the job took {took:.1f} s to end"
    assert survivors == "", "processes of the failed job survive"


@pytest.mark.parallel
def test_an_elastic_rank_that_runs_mpi_but_never_calls_init_is_named(tmp_path):
    """MPI started before init() (mpi4py imported): the check over MPI names the rank in an
    elastic launch too; the rank that never came, which the job's MPI_Abort left running
    under MPI's fault tolerance, does not outlive ddlrun."""
    mpirun_executable()  # skips without an MPI
    launcher = [str(DDLRUN), "-np", "2", "--min-np", "2", "-H", "localhost:2"]
    job, took, rank0, survivors = _job(
        tmp_path, [*launcher, "--start-timeout", str(TIMEOUT)], "mpi"
    )
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    assert rank0.get("raised") == "StartupError", output
    assert "Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s" in rank0["message"]
    assert TIMEOUT - 0.5 <= rank0["seconds"] < TIMEOUT + VERDICT_MARGIN_SECONDS, rank0
    assert took < HANG_SECONDS and survivors == "", output


@pytest.mark.parallel
def test_an_elastic_job_drops_the_host_of_a_rank_that_never_calls_init_and_goes_on(tmp_path):
    """As Horovod drops a worker that does not start: the host of the rank that never called
    init() is dropped and the job relaunched on the others; a relaunch is bounded the same
    way (three hosts, all this machine: the rank on 127.0.0.1 never calls init() at the
    first launch, the one on 127.0.0.2 not at the relaunch; the job finishes on localhost)."""
    mpirun_executable()  # skips without an MPI
    launcher = [
        str(DDLRUN), "--min-np", "1", "-H", "localhost:1,127.0.0.1:1,127.0.0.2:1",
        "--start-timeout", str(TIMEOUT),
    ]  # fmt: skip
    job, took, rank0, survivors = _job(tmp_path, launcher, "host-sleep", "127.0.0.1", "127.0.0.2")
    output = job.stdout + job.stderr
    assert job.returncode == 0, output
    assert "ddlrun: Rank(s) 1 of 3 did not call ddl_tf.init() within 3 s" in job.stderr, output
    assert "ranks on host 127.0.0.1 did not call init()" in job.stderr, output
    assert "relaunching the elastic job on localhost:1,127.0.0.2:1 (2 rank(s), relaunch 1)" in (
        job.stderr
    ), output
    assert "ddlrun: Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s" in job.stderr, output
    assert "ranks on host 127.0.0.2 did not call init()" in job.stderr, output
    assert "relaunching the elastic job on localhost:1 (1 rank(s), relaunch 2)" in job.stderr
    assert "ddl_tf: elastic job finished on 1 rank(s) (localhost)" in job.stdout, output
    assert rank0 == {**rank0, "raised": None, "host": "localhost", "resumed": "2"}, rank0
    assert took < HANG_SECONDS, f"the job took {took:.1f} s to end"
    assert survivors == "", "processes of the job survive"


# --------------------------------------------------------------------------- --rehearse


def _rehearsal_unavailable() -> str | None:
    from ddl_tf.cluster.netns import unavailable_reason

    return unavailable_reason()


rehearsal = pytest.mark.skipif(
    _rehearsal_unavailable() is not None,
    reason=f"rehearsal cluster unavailable: {_rehearsal_unavailable()}",
)


@pytest.fixture
def no_cluster_left(monkeypatch):
    """ddlrun runs with a temporary directory of this test's own (a short path: a Unix
    socket's is at most 107 bytes), so the socket check sees its sockets alone, not those
    of a job another worker runs meanwhile; and no virtual node is left."""
    from ddl_tf.cluster.netns import find_tools, list_namespaces

    private = Path(tempfile.mkdtemp(prefix="ddlst", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(private))
    before = set(list_namespaces(find_tools(), "ddlc"))
    yield
    left = sorted(p.name for p in private.glob("ddlrun-start-*.sock"))
    shutil.rmtree(private, ignore_errors=True)
    assert set(list_namespaces(find_tools(), "ddlc")) <= before, "a virtual node was left"
    assert not left, f"ddlrun left its start-up check's socket: {left}"


@pytest.mark.parallel
@rehearsal
def test_on_the_rehearsal_cluster_a_rank_that_never_calls_init_is_named(tmp_path, no_cluster_left):
    """The virtual nodes have a network of their own: they reach ddlrun's check through a
    Unix socket in the files they share with this machine."""
    launcher = [str(DDLRUN), "--rehearse", "2", "-np", "2", "--start-timeout", str(TIMEOUT)]
    job, took, rank0, survivors = _job(tmp_path, launcher, "sleep")
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    assert "-x DDL_START_ADDR" in job.stdout, output
    assert rank0.get("raised") == "StartupError", output
    named = "Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s"
    assert named in rank0["message"] and f"ddlrun: {named}" in job.stderr, output
    assert TIMEOUT - 0.5 <= rank0["seconds"] < TIMEOUT + VERDICT_MARGIN_SECONDS, rank0
    assert took < HANG_SECONDS and survivors == "", output


def _stale_node0_sessions() -> Path:
    """:func:`tests.harness.stale_session_directories` for mpirun inside virtual node 0
    (its host name is ``node0``: PMIx names its rendezvous file after it)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if pid_max > 65536:
        pytest.skip(f"pid_max {pid_max}: too many pids to cover with stale session directories")
    base = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    stale = base / "stale"
    stale.mkdir()
    (stale / "pmix.node0.tool").write_text("tcp4://127.0.0.1:1\n")  # a killed mpirun's
    for pid in range(2, pid_max):
        os.symlink("stale", base / f"ompi.{pid}")
    return base


@pytest.mark.parallel
@rehearsal
def test_on_the_rehearsal_cluster_a_job_mpirun_failed_to_start_is_launched_again(
    tmp_path, no_cluster_left
):
    stale = _stale_node0_sessions()
    try:
        start = time.monotonic()
        job = subprocess.run(
            [str(DDLRUN), "--rehearse", "2", "-np", "2", str(HELLO)],
            cwd=REPO,
            env=mpi_env(
                {"DDL_TEST_OUTDIR": str(tmp_path), "PRTE_MCA_prte_tmpdir_base": str(stale)},
                session_base=False,
            ),
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS,
        )
        took = time.monotonic() - start
    finally:
        shutil.rmtree(stale, ignore_errors=True)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    failed = [line for line in job.stderr.splitlines() if line.startswith("The PMIx server's")]
    assert len(failed) == 1, job.stderr  # mpirun's own line: the first launch failed
    retry = [line for line in job.stderr.splitlines() if "launching the job again" in line]
    assert len(retry) == 1 and "retry 1 of 2, attempt 2" in retry[0], job.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in reports] == [1, 1] and reports[1]["host"] == "node1", reports
    assert took < HANG_SECONDS, f"{took:.1f} s"


@pytest.mark.parallel
@rehearsal
def test_on_the_rehearsal_cluster_an_elastic_job_drops_a_node_whose_rank_never_calls_init(
    tmp_path, no_cluster_left
):
    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\necho node0:1\necho node1:1\n")
    discovery.chmod(0o755)
    launcher = [
        str(DDLRUN), "--rehearse", "2", "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discovery), "--start-timeout", str(TIMEOUT),
    ]  # fmt: skip
    job, took, rank0, survivors = _job(tmp_path, launcher, "host-sleep", "node1", "-")
    output = job.stdout + job.stderr
    assert job.returncode == 0, output
    assert "ddlrun: Rank(s) 1 of 2 did not call ddl_tf.init() within 3 s" in job.stderr, output
    assert "ranks on host node1 did not call init()" in job.stderr, output
    assert "relaunching the elastic job on node0:1 (1 rank(s), relaunch 1)" in job.stderr, output
    assert "ddl_tf: elastic job finished on 1 rank(s) (node0)" in job.stdout, output
    assert rank0 == {**rank0, "raised": None, "host": "node0", "resumed": "1"}, rank0
    assert took < HANG_SECONDS and survivors == "", output
