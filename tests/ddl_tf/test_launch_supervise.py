"""The supervisor under ddlrun: whole sessions killed, stop signals forwarded, no hang (no MPI)."""

import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from ddl_tf.launch import supervise


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(path, timeout=10.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def test_kill_session_ends_orphans_too(tmp_path):
    pids = tmp_path / "pids"
    # a 'launcher' with two children, each in its session; the launcher dies first
    leader = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & sleep 60 & echo $! > {pids}; wait"], start_new_session=True
    )
    child = int(_wait_for(pids))
    leader.kill()
    leader.wait()
    orphans = supervise.session_processes(leader.pid)
    assert child in {p.pid for p in orphans} and len(orphans) == 2
    supervise.kill_session(leader.pid)
    assert supervise.session_processes(leader.pid) == [] and _gone(child)
    supervise.kill_session(leader.pid)  # nothing left: no error, no wait


def test_a_stop_signal_ends_a_job_that_ignores_it_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "STOP_GRACE_S", 0.5)
    pids = tmp_path / "pids"
    said: list[str] = []
    # mpirun's stand-in ignores SIGTERM, as does the rank it started
    command = ["sh", "-c", f"trap '' TERM; sleep 60 & echo $! > {pids}; wait; wait"]
    stopper = threading.Thread(
        target=lambda: (_wait_for(pids), os.kill(os.getpid(), signal.SIGTERM)), daemon=True
    )
    stopper.start()
    before = signal.getsignal(signal.SIGTERM)
    start = time.monotonic()
    code = supervise.run_job(command, dict(os.environ), report=said.append)
    took = time.monotonic() - start
    stopper.join(timeout=10)
    assert code == 128 + signal.SIGTERM
    assert said == ["ddlrun: SIGTERM received; stopping the job"]
    assert took < 10, took
    assert _gone(int(pids.read_text()))
    assert signal.getsignal(signal.SIGTERM) is before  # the forwarding handler is removed


@pytest.mark.parametrize(("status", "expected"), [(0, 0), (3, 3), (-9, 137)])
def test_exit_codes_say_when_a_job_failed(status, expected):
    said: list[str] = []
    assert supervise.exit_code(status, report=said.append) == expected
    assert said == ([f"ddlrun: job failed with exit code {status}"] if status > 0 else [])


def test_the_elastic_watch_reads_the_finished_line_and_a_lost_daemon():
    said: list[str] = []
    watch = supervise.FinishedWatch(said.append)
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb") as out:
        out.write(b"A daemon failed to report back\n  Remote host: node1\n")
    sink = _Sink()
    with os.fdopen(reader, "rb") as stream:
        watch(stream, sink)
    assert sink.buffer.getvalue().endswith(b"Remote host: node1\n")
    assert watch.status(0) == 1 and "lost its daemon on host node1" in said[0]
    done = supervise.FinishedWatch(said.append)
    done.finished.set()
    assert done.status(5) == 0 and done.status(143) == 143


@pytest.mark.parametrize(
    "report",
    [
        b"A daemon failed to report back\n  Local host:    node0\n  Remote host:   node1\n",
        b"PRTE has lost communication with a remote daemon.\n  HNP daemon   : [prterun-node0-1@0,0]"
        b" on node node0\n  Remote daemon: [prterun-node0-1@0,1] on node node1\n",
    ],
)
def test_a_lost_daemon_names_its_host_and_makes_the_job_relaunchable(report):
    watch, _ = _watched(report)
    assert watch.daemon_lost and watch.lost_hosts == ["node1"]
    assert watch.relaunchable(1) and watch.relaunchable(128 + signal.SIGSEGV)
    assert not watch.relaunchable(128 + signal.SIGTERM), "ddlrun's own stop is never relaunched"
    watch.finished.set()
    assert not watch.relaunchable(1), "a finished job is not relaunched"
    watch.reset()
    assert not watch.daemon_lost and watch.lost_hosts == [] and not watch.relaunchable(1)


def test_run_elastic_relaunches_after_a_lost_daemon_until_the_job_finishes(tmp_path):
    """The relaunch loop, with a shell command in mpirun's place (no MPI)."""
    lost = "echo 'A daemon failed to report back' >&2; echo '  Remote host: node1' >&2; exit 1"
    finish = "echo 'ddl_tf: elastic job finished on 2 rank(s) (node0)'; exit 0"
    asked: list[list[str]] = []

    def again(watch):
        asked.append(list(watch.lost_hosts))
        return (["sh", "-c", finish], dict(os.environ)) if len(asked) == 1 else None

    said: list[str] = []
    code = supervise.run_elastic(
        ["sh", "-c", lost], dict(os.environ), report=said.append, again=again
    )
    assert code == 0 and asked == [["node1"]] and said == []


_DEFECT = (
    b"[node0:30259] PMIX ERROR: PMIX_ERROR in file /openmpi-5.0.11/3rd-party/prrte/src/prted/"
    b"pmix/pmix_server_dyn.c at line 1113\n"
)


def _watched(*lines: bytes) -> tuple[supervise.FinishedWatch, list[str]]:
    """A watch that read ``lines`` of mpirun's output, and the list it reports into."""
    said: list[str] = []
    watch = supervise.FinishedWatch(said.append)
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb") as out:
        out.write(b"".join(lines))
    with os.fdopen(reader, "rb") as stream:
        watch(stream, _Sink())
    return watch, said


@pytest.mark.parametrize("crash", [signal.SIGSEGV, signal.SIGABRT])
def test_mpirun_crashing_of_the_prrte_defect_after_the_job_finished_ends_0_with_a_warning(crash):
    watch, said = _watched(_DEFECT, b"ddl_tf: elastic job finished on 4 rank(s) (node0, node2)\n")
    assert watch.status(128 + crash) == 0
    assert len(said) == 1 and f"mpirun died of {crash.name} after" in said[0]
    assert "pmix_server_dyn.c" in said[0] and "warning" in said[0]


def test_mpirun_crashing_before_the_job_finished_or_for_another_cause_keeps_its_status():
    lost, said = _watched(_DEFECT)  # crashed during the job: its work is lost
    assert lost.status(128 + signal.SIGSEGV) == 139
    assert len(said) == 1 and "before the elastic job finished" in said[0]
    assert "pmix_server_dyn.c" in said[0] and "Restart it" in said[0]
    finished = b"ddl_tf: elastic job finished on 2 rank(s) (a)\n"
    other, said = _watched(finished)  # no trace of the defect: the crash is not explained
    assert other.status(128 + signal.SIGSEGV) == 139 and said == []
    stopped, said = _watched(_DEFECT, finished)
    assert stopped.status(128 + signal.SIGTERM) == 143 and said == []  # ddlrun's own stop


class _Sink:
    def __init__(self) -> None:
        import io

        self.buffer = io.BytesIO()

    def flush(self) -> None:
        pass


_LISTENER = (
    "echo '--------------------------------------------------------------------------' >&2; "
    'echo "The PMIx server\'s listener thread failed to start. We cannot" >&2; '
    "echo 'continue.' >&2; exit 1"
)


def test_a_launch_whose_pmix_listener_failed_to_start_is_launched_again(tmp_path):
    """Open MPI's intermittent start-up failure (seen once in CI): mpirun ends before any rank
    runs; run_elastic launches the same command again, says so, and the job finishes."""
    tries = tmp_path / "tries"
    script = (
        f"echo x >> {tries}; if [ $(wc -l < {tries}) -lt 2 ]; then {_LISTENER}; fi; "
        "echo 'ddl_tf: elastic job finished on 2 rank(s) (localhost)'; exit 0"
    )
    said: list[str] = []
    code = supervise.run_elastic(["sh", "-c", script], dict(os.environ), report=said.append)
    assert code == 0 and len(tries.read_text().split()) == 2
    assert len(said) == 1 and "failed at start-up, before any rank ran" in said[0], said
    assert "retry 1 of 2" in said[0]


def test_start_up_retries_are_bounded_and_never_repeat_a_job_that_finished(tmp_path):
    tries = tmp_path / "tries"
    said: list[str] = []
    code = supervise.run_elastic(
        ["sh", "-c", f"echo x >> {tries}; {_LISTENER}"], dict(os.environ), report=said.append
    )
    assert code == 1 and len(tries.read_text().split()) == 1 + supervise.FinishedWatch.START_RETRIES
    assert "ended without its ranks finishing" in said[-1]
    # the message after the job finished (or with mpirun's status 0) is not a start-up failure
    watch, _ = _watched(
        b"ddl_tf: elastic job finished on 2 rank(s) (localhost)\n",
        b"The PMIx server's listener thread failed to start. We cannot\n",
    )
    assert not watch.retry_start(1)
    watch, _ = _watched(b"The PMIx server's listener thread failed to start. We cannot\n")
    assert not watch.retry_start(0) and not watch.retry_start(143) and watch.retry_start(1)


def test_a_fixed_size_job_that_failed_to_start_is_launched_again_but_never_one_that_ran(tmp_path):
    """run_fixed (ddlrun's fixed-size jobs): the same retry as run_elastic's, except after a
    rank ran (it reached ddlrun's start-up check): that job's effects must not happen twice."""
    tries = tmp_path / "tries"
    script = f"echo x >> {tries}; if [ $(wc -l < {tries}) -lt 2 ]; then {_LISTENER}; fi; exit 0"
    said: list[str] = []
    assert supervise.run_fixed(["sh", "-c", script], dict(os.environ), report=said.append) == 0
    assert len(tries.read_text().split()) == 2 and len(said) == 1, said
    assert "before any rank ran (exit code 1;" in said[0] and "retry 1 of 2, attempt 2" in said[0]
    tries.unlink()
    said.clear()
    code = supervise.run_fixed(
        ["sh", "-c", script], dict(os.environ), report=said.append, ran=lambda: True
    )
    assert code == 1 and len(tries.read_text().split()) == 1
    assert said == ["ddlrun: job failed with exit code 1"]


def test_a_stop_signal_while_waiting_to_launch_again_ends_the_job_with_its_status(tmp_path):
    said: list[str] = []

    def stop_soon(line: str) -> None:  # the signal comes during the pause that follows the line
        said.append(line)
        if "launching the job again" in line:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()

    before = signal.getsignal(signal.SIGTERM)
    code = supervise.run_fixed(["sh", "-c", _LISTENER], dict(os.environ), report=stop_soon)
    assert code == 143 and signal.getsignal(signal.SIGTERM) == before
    assert said[-1] == "ddlrun: SIGTERM received; the job is not launched again", said


def test_the_start_watch_passes_output_on_as_it_comes_and_finds_the_line_across_reads():
    line = supervise.StartWatch.START_FAILED

    class Chunks:
        def __init__(self, *chunks: bytes) -> None:
            self.chunks = list(chunks)

        def read1(self, _size: int) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    watch, sink = supervise.StartWatch(print), _Sink()
    watch(Chunks(b"epoch 1 10%\r", b"epoch 1 20%\r" + line[:9], line[9:] + b". We"), sink)
    assert (
        watch.start_failed
        and sink.buffer.getvalue() == b"epoch 1 10%\repoch 1 20%\r" + line + b". We"
    )
    quiet = supervise.StartWatch(print)
    quiet(Chunks(line[:-1], b"\n" + line[-1:]), _Sink())
    assert not quiet.start_failed
