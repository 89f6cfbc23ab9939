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
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ddl_tf.config import DDLConfig
from ddl_tf.core.startup import VERDICT_MARGIN_SECONDS, check_in_with_launcher
from ddl_tf.errors import ConfigError, StartupError
from ddl_tf.launch.startup import StartupCheck
from tests.harness import mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

WORKER = Path(__file__).parent / "startup_worker.py"
REPO = Path(__file__).resolve().parents[2]
DDLRUN = Path(sys.executable).parent / "ddlrun"
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


# --------------------------------------------------------------------------- real launchers


def _job(
    tmp_path: Path, launcher: list[str], mode: str
) -> tuple[subprocess.CompletedProcess, float, dict, str]:
    token = uuid.uuid4().hex
    env = mpi_env({"DDL_TEST_OUTDIR": str(tmp_path), "DDL_START_TIMEOUT": str(TIMEOUT)})
    start = time.monotonic()
    job = subprocess.run(
        [*launcher, sys.executable, str(WORKER), mode, token],
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
