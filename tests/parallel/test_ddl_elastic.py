"""Elastic Keras and custom-loop jobs under ddlrun: a lost rank takes its host out, a host joins.

Horovod's membership scenarios (reset limit, every rank failing, the
``--min-np`` timeout, ...) run in test_ddl_elastic_scenarios.py, on a numpy
worker that starts in a fraction of the time; these tests are the paths a
TensorFlow user takes.

Each test runs a real ``ddlrun --min-np ...`` job of the Keras worker
(tests/parallel/workers/elastic_keras.py) over Open MPI's fault tolerance;
``localhost`` and ``127.0.0.1`` are two hosts of this machine, as in
Horovod's own elastic tests. The failure is a real ``SIGKILL`` of one rank.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.harness import discovery_script, mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "parallel" / "workers" / "elastic_keras.py"
DDLRUN = Path(sys.executable).parent / "ddlrun"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


def _ddlrun(
    tmp_path: Path, *options: str, worker: Path = WORKER, **env: str
) -> subprocess.CompletedProcess:
    mpirun_executable()  # skips without an MPI
    variables = mpi_env({"ELASTIC_OUT": str(tmp_path), **env})
    return subprocess.run(
        [str(DDLRUN), *options, str(worker)],
        cwd=tmp_path,
        env=variables,
        capture_output=True,
        text=True,
        timeout=3 * HANG_SECONDS + PROCESS_MARGIN_SECONDS,
        check=False,
    )


def _results(tmp_path: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))}


def test_a_killed_rank_takes_its_host_out_and_the_others_train_on_bitwise_equal(tmp_path):
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2", "-np", "4",
        ELASTIC_KILL="3,1,5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(tmp_path)
    assert sorted(results) == [0, 1], "the killed rank's host (127.0.0.1) left: ranks 2 and 3"
    assert "rank 2 leaves the elastic job: its host 127.0.0.1 had a failed rank" in done.stderr
    assert "without rank(s) [3] (host(s) 127.0.0.1 blacklisted)" in done.stderr
    first, second = results[0], results[1]
    assert first["size"] == second["size"] == 2
    assert np.array_equal(first["weights"], second["weights"]), "replicas differ after recovery"
    killed = float((tmp_path / "killed").read_text())
    after = [t for t, size, _, _ in first["steps"] if size == 2]
    assert after and after[0] - killed < HANG_SECONDS, "the survivors never trained on"
    epochs = {(epoch, batch) for _, size, epoch, batch in first["steps"] if size == 2}
    assert (2, 15) in epochs, "the survivors finished the last epoch"


def test_a_custom_loop_traced_before_the_failure_trains_on_at_the_new_size(tmp_path):
    done = _ddlrun(
        tmp_path,
        "--min-np", "1", "-H", "localhost:2,127.0.0.1:1", "-np", "3",
        worker=WORKER.parent / "elastic_tf_loop.py",
        ELASTIC_KILL="2,10",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(tmp_path)
    assert sorted(results) == [0, 1]
    assert all(r["size"] == 2 and r["resets"] == [2] for r in results.values())
    assert np.array_equal(results[0]["weights"], results[1]["weights"])
    assert [b for _, size, b in results[0]["steps"] if size == 2][-1] == 29


def test_a_discovered_host_joins_at_a_commit_and_gets_the_state(tmp_path):
    script = discovery_script(tmp_path, "localhost:2\n")
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
        ELASTIC_GROW="127.0.0.1:2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(tmp_path)
    assert sorted(results) == [0, 1, 2, 3]
    assert {r["host"] for r in results.values()} == {"localhost", "127.0.0.1"}
    assert all(r["size"] == 4 for r in results.values())
    weights = [r["weights"] for r in results.values()]
    assert all(np.array_equal(weights[0], w) for w in weights[1:]), "newcomers out of step"
    assert "added=(('127.0.0.1', 2),)" in done.stderr
    # issue 45 (c): Horovod's state.epoch comes back wrong after a scale-up with fit. Here the
    # newcomers and the survivors train the same (epoch, batch) steps at 4 ranks, and every
    # rank ends after the 3 requested epochs, with state.epoch 3
    at_four = {
        rank: [(e, b) for _, size, e, b in r["steps"] if size == 4] for rank, r in results.items()
    }
    assert at_four[0] and at_four[0][-1] == (2, 15), at_four[0][-3:]
    assert all(steps == at_four[0] for steps in at_four.values()), "ranks disagree on epoch/batch"
    assert all(r["state"] == [3, 0] for r in results.values()), [
        r["state"] for r in results.values()
    ]
    assert all(e < 3 for r in results.values() for _, _, e, _ in r["steps"]), "trained past epoch 3"


def test_a_discovered_host_joins_without_pausing_the_training(tmp_path):
    """Issue 45 (b): the new ranks start (Python, TensorFlow, MPI_Init) while the job trains,
    and join at a commit after they are ready; nothing waits for them (ELASTIC_GROW_WAIT=0)."""
    script = discovery_script(tmp_path, "localhost:2\n")
    started = time.monotonic()
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
        ELASTIC_GROW="127.0.0.1:2", ELASTIC_GROW_AT="0,3", ELASTIC_GROW_WAIT="0",
        ELASTIC_SLEEP="0.05", ELASTIC_EPOCHS="20",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 2 * HANG_SECONDS
    assert "starting 2 rank(s) on 127.0.0.1:2 ahead, while the job trains on" in done.stderr
    assert "admitting the 2 rank(s) started ahead on 127.0.0.1:2" in done.stderr
    results = _results(tmp_path)
    assert sorted(results) == [0, 1, 2, 3], done.stderr[-3000:]
    assert all(r["size"] == 4 for r in results.values())
    weights = [r["weights"] for r in results.values()]
    assert all(np.array_equal(weights[0], w) for w in weights[1:]), "newcomers out of step"
    added = float((tmp_path / "added").read_text())
    steps = results[0]["steps"]
    first = min(t for t, size, _, _ in steps if size == 4)
    trained = [t for t, size, _, _ in steps if size == 2 and t > added]
    # the survivors kept training while the newcomers started: more than a step or two
    assert len(trained) >= 10 and max(trained) > added + 2.0, (len(trained), first - added)
    # ... and without a core spent waiting for them: the training (a tiny MLP, 0.05 s sleeps)
    # takes a few percent of a core; an MPI call polling in a background thread, 85-100%
    for rank in (0, 1):
        samples = [(t, c) for t, c in results[rank]["cpu"] if added <= t <= first]
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        assert (c1 - c0) / (t1 - t0) < 0.4, (rank, c1 - c0, t1 - t0)
    # every rank trains the same steps at 4 ranks, up to the end of the 20 epochs
    at_four = {r: [(e, b) for _, size, e, b in x["steps"] if size == 4] for r, x in results.items()}
    assert at_four[0][-1] == (19, 15) and all(s == at_four[0] for s in at_four.values())
    assert all(r["state"] == [20, 0] for r in results.values())


def test_ranks_started_ahead_leave_when_the_job_ends_before_they_join(tmp_path):
    """A host listed near the end: the job finishes at its size, and the ranks it started ahead
    are sent away once connected (status 0, nothing left running), not waited for by mpirun."""
    script = discovery_script(tmp_path, "localhost:2\n")
    started = time.monotonic()
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
        ELASTIC_GROW="127.0.0.1:2", ELASTIC_GROW_AT="2,0", ELASTIC_GROW_WAIT="0",
        ELASTIC_SLEEP="0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 2 * HANG_SECONDS
    results = _results(tmp_path)
    assert sorted(results) == [0, 1] and all(r["size"] == 2 for r in results.values())
    assert "elastic job finished on 2 rank(s) (localhost)" in done.stdout
    assert "starting 2 rank(s) on 127.0.0.1:2 ahead" in done.stderr
    assert (
        "the ranks started ahead on 127.0.0.1:2 leave: the job finished before they were "
        "admitted" in done.stderr
    ), done.stderr[-3000:]


def test_a_discovery_script_that_turns_to_garbage_ends_the_job_after_the_timeout(tmp_path):
    script = discovery_script(tmp_path, "localhost:2\n")
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "2",
        ELASTIC_GROW="this is not a host line", ELASTIC_SLEEP="0.1",
    )  # fmt: skip
    assert done.returncode != 0
    assert "host discovery line 2 is 'this is not a host line'" in done.stderr
    assert "failing for over 2 s, the --elastic-timeout; the job stops" in done.stderr


def test_sigterm_to_ddlrun_during_a_reset_ends_the_whole_job(tmp_path):
    mpirun_executable()
    job = subprocess.Popen(
        [str(DDLRUN), "--min-np", "1", "-H", "localhost:1,127.0.0.1:1", "-np", "2", str(WORKER)],
        cwd=tmp_path,
        env=mpi_env({"ELASTIC_OUT": str(tmp_path), "ELASTIC_KILL": "1,1,2"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HANG_SECONDS
        while not (tmp_path / "killed").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "killed").exists(), "the job never reached the kill"
        assert _ranks_of(tmp_path), "the surviving rank is running"
        job.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = job.communicate(timeout=HANG_SECONDS + PROCESS_MARGIN_SECONDS)
        assert time.monotonic() - start < HANG_SECONDS
        assert job.returncode == 128 + signal.SIGTERM, err[-2000:]
    finally:
        if job.poll() is None:
            job.kill()
    assert not _ranks_of(tmp_path), "ranks outlived ddlrun"


def _ranks_of(tmp_path: Path) -> list[int]:
    """Processes whose environment holds this test's ELASTIC_OUT (the job's ranks)."""
    marker = f"ELASTIC_OUT={tmp_path}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_too_few_slots_for_min_np_refuse_the_launch(tmp_path):
    script = discovery_script(tmp_path, "localhost:1\n")
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "2",
    )  # fmt: skip
    assert done.returncode == 3
    assert "fewer than --min-np 2, for 2 s (--elastic-timeout)" in done.stderr


def test_ddl_tf_run_returns_each_ranks_result_and_reports_a_failure(tmp_path, monkeypatch):
    import ddl_tf
    from ddl_tf.launch.api import RunError

    mpirun_executable()  # skips without an MPI
    for name, value in mpi_env().items():
        monkeypatch.setenv(name, value)

    def train(scale):
        import ddl_tf as hvd

        hvd.init()
        return hvd.rank() * scale, hvd.size()

    def host():  # an elastic job's status is its final membership's: the ranks init ddl_tf
        import os

        import ddl_tf as hvd

        hvd.init()
        return os.environ["HOROVOD_HOSTNAME"]

    assert ddl_tf.run(train, args=(10,), np=2) == [(0, 2), (10, 2)]
    hosts = ddl_tf.run(
        host,
        min_num_proc=1,
        hosts="localhost:1,127.0.0.1:1",
        num_proc=2,
    )
    assert hosts == ["localhost", "127.0.0.1"]
    with pytest.raises(RunError, match="the job failed \\(ddlrun exit code 1\\)"):
        ddl_tf.run(lambda: 1 / 0, np=2)
