"""Horovod's elastic integration scenarios, run with ``ddlrun`` in the place of ``horovodrun``.

The scenarios and the records they expect are those of Horovod 0.28.1's
``test/integration/elastic_common.py``: hosts added and removed, one rank
failing by exception and by kill (with a discovery script, and with fixed
``-H`` hosts), every rank failing, every host blacklisted, the minimum-ranks
timeout, the reset limit, and a blacklisted host's cooldown. The training
script is ours (tests/parallel/workers/elastic_schedule.py); rank 0 logs one
record per epoch: its host, its rank at launch, the size and the rendezvous
count (how many times the training function was entered).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "parallel" / "workers" / "elastic_schedule.py"
DDLRUN = Path(sys.executable).parent / "ddlrun"

pytestmark = pytest.mark.parallel


def _discovery_script(path: Path, logfile: Path, schedule: list) -> Path:
    """A script printing each epoch's hosts, the epoch being the number of records logged."""
    lines = ["#!/bin/sh", "epoch=0", f"[ -f {logfile} ] && epoch=$(wc -l < {logfile})"]
    for epoch, hosts in schedule:
        prints = "; ".join(f"echo {host}" for host in hosts)
        if epoch is None:
            lines.append(prints)
        else:
            lines.append(f'if [ "$epoch" -eq {epoch} ]; then {prints}; exit 0; fi')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _run(
    tmp_path: Path,
    *,
    schedule: list | None = None,
    hosts: str | None = None,
    exits: dict | None = None,
    exit_mode: str = "exception",
    np_: int = 2,
    min_np: int = 2,
    max_np: int = 4,
    options: tuple[str, ...] = (),
    script_args: tuple[str, ...] = (),
    on_start=None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    mpirun_executable()  # skips without an MPI
    tmp_path.mkdir(parents=True, exist_ok=True)
    logfile = tmp_path / "records.jsonl"
    command = [str(DDLRUN), "-np", str(np_), "--min-np", str(min_np), *options]
    if hosts is not None:
        command += ["-H", hosts]
    else:
        assert schedule is not None
        script = _discovery_script(tmp_path / "discover.sh", logfile, schedule)
        command += ["--host-discovery-script", str(script), "--max-np", str(max_np)]
    command += [
        sys.executable, str(WORKER), "--logfile", str(logfile), "--out", str(tmp_path),
        "--discovery-schedule", json.dumps(schedule or []), *script_args,
    ]  # fmt: skip
    if exits:
        command += ["--exit-schedule", json.dumps(exits), "--exit-mode", exit_mode]
    try:
        job = subprocess.Popen(
            command,
            cwd=tmp_path,
            # Horovod's records assume the paused join: new hosts' ranks join at the commit
            # that sees them (growth without a pause is tested in test_ddl_elastic.py)
            env=mpi_env(
                {
                    "DDL_ELASTIC_DISCOVERY_INTERVAL": "0.1",
                    "DDL_ELASTIC_PRESTART": "0",
                    **(env or {}),
                }
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if on_start is not None:  # e.g. kill a node's daemon once training runs
                on_start(job, logfile)
            out, err = job.communicate(timeout=2 * HANG_SECONDS + PROCESS_MARGIN_SECONDS)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        done = subprocess.CompletedProcess(command, job.returncode, out, err)
    finally:
        left = _orphans(logfile)
        for pid in left:  # never leave a hung job behind for the rest of the suite
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks outlived ddlrun: {left}"
    records = (
        [json.loads(line) for line in logfile.read_text().splitlines()] if logfile.exists() else []
    )
    return done, records


def _orphans(logfile: Path) -> list[int]:
    """Ranks of the job still running after ddlrun returned (their command line names the log)."""
    time.sleep(0.2)  # a rank that is exiting right now is not an orphan
    found = subprocess.run(
        ["pgrep", "-f", "--", f"--logfile {logfile}"], capture_output=True, text=True, check=False
    )
    return [int(pid) for pid in found.stdout.split()]


def _weights(tmp_path: Path) -> list[list[float]]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("weights.*.json"))]


def _shape(records: list[dict]) -> list[tuple]:
    return [(r["start_rank"], r["size"], r["rendezvous"]) for r in records]


@pytest.mark.parametrize("slots", [2, 1])
def test_hosts_added_and_removed(tmp_path, slots):
    schedule = [
        (0, [f"localhost:{slots}"]),
        (1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]),
        (None, [f"127.0.0.1:{slots}"]),
    ]
    done, records = _run(tmp_path, schedule=schedule, np_=slots, min_np=slots, max_np=2 * slots)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shape(records) == [(0, slots, 1), (0, 2 * slots, 2), (slots, slots, 3)]
    assert [r["hostname"] for r in records] == ["localhost", "localhost", "127.0.0.1"]
    weights = _weights(tmp_path)
    assert len(weights) == slots and all(w == weights[0] for w in weights)


@pytest.mark.parametrize("exit_mode", ["exception", "kill"])
@pytest.mark.parametrize("discovered", [True, False], ids=["discovery", "fixed-hosts"])
def test_single_rank_failure(tmp_path, exit_mode, discovered):
    hosts = ["localhost:2", "127.0.0.1:2"]
    done, records = _run(
        tmp_path,
        schedule=[(None, hosts)] if discovered else None,
        hosts=None if discovered else ",".join(hosts),
        exits={str((1, 0)): [0]},
        exit_mode=exit_mode,
        np_=4,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shape(records) == [(0, 4, 1), (2, 2, 2), (2, 2, 2)]
    assert "rank 1 leaves the elastic job: its host localhost had a failed rank" in done.stderr
    weights = _weights(tmp_path)
    assert len(weights) == 2 and weights[0] == weights[1]


def test_all_ranks_failure(tmp_path):
    done, records = _run(
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0, 1, 2, 3]},
        np_=4,
    )
    assert done.returncode != 0
    assert len(records) == 1
    assert "rank 0 on host localhost ends the elastic job: RuntimeError" in done.stderr
    assert "the elastic job ended without its ranks finishing" in done.stderr


@pytest.mark.parametrize("exit_mode", ["exception", "kill"])
def test_all_hosts_blacklisted(tmp_path, exit_mode):
    done, _ = _run(
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0, 2]},
        exit_mode=exit_mode,
        np_=4,
    )
    assert done.returncode != 0
    assert "every host of the elastic job is blacklisted" in done.stderr


def test_min_hosts_timeout(tmp_path):
    done, _ = _run(
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0]},
        np_=4,
        min_np=4,
        options=("--elastic-timeout", "1"),
    )
    assert done.returncode != 0
    assert "below --min-np 4, and no host to grow to appeared within 1 s" in done.stderr


def test_reset_limit(tmp_path):
    schedule = [
        (0, ["localhost:2"]),
        (1, ["localhost:2", "127.0.0.1:2"]),
        (None, ["127.0.0.1:2"]),
    ]
    failed, _ = _run(tmp_path / "1", schedule=schedule, options=("--reset-limit", "1"))
    assert failed.returncode != 0
    assert "over --reset-limit 1" in failed.stderr
    done, records = _run(tmp_path / "2", schedule=schedule, options=("--reset-limit", "2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(records) == 3


def test_a_blacklisted_host_comes_back_after_its_cooldown(tmp_path):
    done, records = _run(
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [3]},
        np_=4,
        options=("--blacklist-cooldown-range", "2", "4"),
        # the 8 epochs left ~3.5 s after the failure: a 4 s cooldown, discovery's poll and the
        # newcomers' start outlasted them once in CI (a9be3a7, sizes [4, 2, 2, 2, 2, 2, 2, 2]);
        # train on until an epoch ends with 4 ranks (40 epochs at most)
        script_args=("--epochs", "8", "--epoch-wait", "0.5", "--until-size", "4"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = [r["size"] for r in records]
    assert sizes[:2] == [4, 2], sizes  # 127.0.0.1 out after its rank 3 failed
    assert 4 in sizes[2:], f"127.0.0.1 never came back after its 2 s cooldown: {sizes}"
    back = sizes.index(4, 2)
    assert all(r["rendezvous"] == 3 for r in records[back:])


def test_survivors_below_min_np_wait_for_discovery_and_grow_back(tmp_path):
    """Issue 45 (a): below --min-np the survivors wait for discovery (no deadlock) and grow back.

    127.0.0.1's rank fails, so its host leaves and 2 ranks remain, under
    ``--min-np 4``; the host's 1 s cooldown ends within the 60 s
    ``--elastic-timeout``, discovery lists it again, and the job grows back
    to 4 ranks before it trains on. (The timeout's end is
    test_min_hosts_timeout.)
    """
    done, records = _run(
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [3]},
        np_=4,
        min_np=4,
        options=("--elastic-timeout", "60", "--blacklist-cooldown-range", "1", "1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["size"] for r in records] == [4, 4, 4], records
    assert "without rank(s) [3] (host(s) 127.0.0.1 blacklisted): 2 rank(s)" in done.stderr
    assert "added=(('127.0.0.1', 2),)" in done.stderr, done.stderr[-3000:]
    weights = _weights(tmp_path)
    assert len(weights) == 4 and len(set(map(tuple, weights))) == 1, "replicas differ"


@pytest.mark.parametrize("change", ["failure", "growth", "static"])
def test_process_sets_are_refused_after_a_reset_and_work_once_added_again(tmp_path, change):
    """Issue 45 (b): a set of the old membership is refused with a message naming the fix,
    and the set added again in a reset callback (newcomers add it after init) runs collectives.
    A set given to ``init(process_sets=[...])`` (no dynamic sets) may be added again too
    (``static``: newcomers give it to their ``init``).
    """
    flags = ("--static-set",) if change == "static" else ("--process-set",)
    if change in ("failure", "static"):
        kwargs: dict = {"schedule": [(None, ["localhost:3", "127.0.0.1:1"])], "np_": 4}
        kwargs["exits"] = {str((1, 0)): [3]}
        expected = [(0, 4, 1), (0, 3, 2), (0, 3, 2)]
    else:
        kwargs = {"schedule": [(0, ["localhost:3"]), (None, ["localhost:3", "127.0.0.1:1"])]}
        kwargs.update(np_=3, min_np=3)
        expected = [(0, 3, 1), (0, 4, 2), (0, 4, 2)]
    done, records = _run(tmp_path, script_args=flags, **kwargs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shape(records) == expected
    assert [r["set_sum"] for r in records] == [1.5, 1.5, 1.5], "the pair's allreduce"
    stale = (tmp_path / "stale_set.txt").read_text()
    assert "is not registered with this job" in stale
    assert "add its sets again, e.g. in a reset callback" in stale


SPAWN_TIMEOUT = 5
"""DDL_ELASTIC_SPAWN_TIMEOUT of the tests below (seconds)."""

RELAUNCH_SECONDS = 30
"""What a relaunch of the schedule worker may take on top of the spawn timeout, from the spawn
to the first record after the relaunch (measured here: 0.7 to 2.1 s; docs/elastic.md)."""


@pytest.mark.parametrize("prestart", ["0", "1"])
@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_new_host_whose_ranks_never_connect_is_dropped_and_the_job_goes_on(
    tmp_path, mode, prestart
):
    """Issue 45 (d), point 3: ranks spawned onto a new host that never join (they exit, or
    hang, before ``init()``) hold the job up for DDL_ELASTIC_SPAWN_TIMEOUT at most. The
    spawning ranks then end themselves (``MPI_Comm_spawn`` cannot be interrupted: measured, it
    still waits 60 s after the new ranks exited), ddlrun ends what is left (the hung ranks
    included), names the host as dropped and relaunches the job without it; the relaunched
    ranks resume from the commit the ranks mirrored in host memory and the job finishes at
    its old size, replicas equal. Both with the spawn in the commit (``DDL_ELASTIC_PRESTART=0``)
    and started ahead in the background (``1``, the default: the job trains on meanwhile).
    The new host is an alias of this machine (mpirun spawns there itself).
    """
    _dropped_and_trained_on(tmp_path, mode, prestart, survivor="localhost", new="127.0.0.1")


def _dropped_and_trained_on(
    tmp_path: Path, mode: str, prestart: str, *, survivor: str, new: str, options=()
) -> None:
    """Run a 2-rank job on ``survivor`` whose 2 ranks spawned onto ``new`` never join (``mode``:
    they exit or hang), and check that ``new`` is dropped and the job finishes without it."""
    epochs = 4 if prestart == "0" else 8
    wait = 0 if prestart == "0" else 1  # seconds between epochs
    start = time.monotonic()
    done, records = _run(
        tmp_path,
        schedule=[(0, [f"{survivor}:2"]), (None, [f"{survivor}:2", f"{new}:2"])],
        # started ahead, the spawn runs while the job trains: train past its timeout
        script_args=("--newcomers-fail", f"{new}:{mode}", "--epochs", str(epochs))
        + ("--epoch-wait", str(wait)),
        options=tuple(options),
        env={"DDL_ELASTIC_SPAWN_TIMEOUT": str(SPAWN_TIMEOUT), "DDL_ELASTIC_PRESTART": prestart},
    )
    assert time.monotonic() - start < HANG_SECONDS, "the job hung after the failed spawn"
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"the new ranks on {new}:2 did not connect within {SPAWN_TIMEOUT} s" in done.stderr
    assert (
        f"ddlrun: the ranks spawned onto the new host {new} never connected within "
        "DDL_ELASTIC_SPAWN_TIMEOUT" in done.stderr
    ), done.stderr[-3000:]
    assert "that host is dropped" in done.stderr
    assert f"and the job goes on without it; relaunching the elastic job on {survivor}:2" in (
        done.stderr
    )
    assert f"elastic job finished on 2 rank(s) ({survivor})" in done.stdout, done.stdout[-2000:]
    # at the old size throughout, to the last epoch, relaunched once (no second spawn)
    assert {r["size"] for r in records} == {2}, records
    assert records[-1]["epoch"] == epochs - 1, records
    assert [r["relaunch"] for r in records] == sorted(r["relaunch"] for r in records)
    assert {r["relaunch"] for r in records} == {0, 1}, records
    # from the spawn (at the commit that ends epoch 0, after the wait that follows its
    # record) to the first record of the relaunched job: the spawn timeout, the relaunch,
    # and an epoch at most
    spawned = records[0]["time"] + wait
    resumed = min(r["time"] for r in records if r["relaunch"] == 1)
    print(f"spawn to the relaunched job's first epoch: {resumed - spawned:.1f} s")
    assert SPAWN_TIMEOUT <= resumed - spawned < SPAWN_TIMEOUT + RELAUNCH_SECONDS
    # the relaunch resumed from a commit: no epoch skipped (one logged before the end-of-epoch
    # commit may be logged again)
    assert {r["epoch"] for r in records} == set(range(epochs)), records
    weights = _weights(tmp_path)
    assert len(weights) == 2 and weights[0] == weights[1], "replicas differ"


# ---------------------------------------------------------------- the rehearsal cluster
# ``ddlrun --rehearse 2``: two virtual nodes (network namespaces joined by
# shaped links, each with its own Open MPI daemon) are the hosts ``node0`` and
# ``node1``; a rank that joins ``node1`` is spawned through that node's daemon.


def _rehearsal_unavailable() -> str | None:
    from ddl_tf.cluster.netns import unavailable_reason

    return unavailable_reason()


def _cluster_namespaces() -> set[str]:
    from ddl_tf.cluster.netns import find_tools, list_namespaces

    return set(list_namespaces(find_tools(), "ddlc"))


rehearsal = pytest.mark.skipif(
    _rehearsal_unavailable() is not None,
    reason=f"rehearsal cluster unavailable: {_rehearsal_unavailable()}",
)


MPIRUN_CRASHED = (128 + signal.SIGSEGV, 128 + signal.SIGABRT)
"""ddlrun's status when mpirun itself died of SIGSEGV or SIGABRT before the job finished."""


def _run_growing(tmp_path: Path, **kwargs) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """:func:`_run` for a job that grows onto a new virtual node, once more if mpirun crashed.

    Growing onto another host sets off a defect of Open MPI 5.0.11's runtime
    (PRRTE 3.0's ``connect_release``, a ``PMIX ERROR`` naming
    ``pmix_server_dyn.c``) that corrupts mpirun's heap (docs/elastic.md).
    Measured under load (a CPU burner on the second core): 11 crashes in 75
    runs of the replacement test; 5 after the job finished (ddlrun then exits
    0 with a warning), 6 during the growth, losing the job (mpirun 4 times,
    the new node's daemon twice: ddlrun reports a lost daemon, and now relaunches the job
    without that node). Only a job lost to the defect, or relaunched after it, is run
    again, once; a second one in a row fails.
    """
    done, records = _run(tmp_path / "1", **kwargs)
    lost = done.returncode in MPIRUN_CRASHED or "Open MPI lost its daemon" in done.stderr
    # a daemon lost to the defect is now survived by a relaunch: the job finishes, in
    # another shape than the schedule's
    relaunched = "relaunching the elastic job" in done.stderr
    unfinished = "elastic job finished" not in done.stdout or relaunched
    if lost and unfinished and "pmix_server_dyn.c" in done.stderr:
        done, records = _run(tmp_path / "2", **kwargs)
    return done, records


@pytest.fixture
def no_cluster_left():
    before = _cluster_namespaces()
    yield
    assert _cluster_namespaces() <= before, "ddlrun left a virtual node behind"


@rehearsal
def test_rehearsal_hosts_added_and_removed_across_virtual_nodes(tmp_path, no_cluster_left):
    schedule = [(0, ["node0:1"]), (1, ["node0:1", "node1:1"]), (None, ["node1:1"])]
    done, records = _run_growing(
        tmp_path, schedule=schedule, np_=1, min_np=1, max_np=2, options=("--rehearse", "2")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shape(records) == [(0, 1, 1), (0, 2, 2), (1, 1, 3)]
    assert [r["hostname"] for r in records] == ["node0", "node0", "node1"]


@rehearsal
def test_rehearsal_a_node_whose_ranks_die_is_replaced_by_a_fresh_one(tmp_path, no_cluster_left):
    hosts = ["node0:2", "node1:2"]
    done, records = _run_growing(
        tmp_path,
        schedule=[(0, hosts), (1, hosts), (None, [*hosts, "node2:2"])],
        exits={str((1, 0)): [2, 3]},  # both ranks of node1 (a lost node)
        exit_mode="kill",
        np_=4,
        options=("--rehearse", "3", "--link", "1gbit", "--blacklist-cooldown-range", "0", "0"),
        script_args=("--epochs", "4"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shape(records) == [(0, 4, 1), (0, 2, 2), (0, 4, 3), (0, 4, 3)]
    # node1's cooldown is over at once, but Open MPI cannot start ranks there again
    assert "host node1 is listed again, but it had ranks of this job before" in done.stderr
    weights = _weights(tmp_path / "2") or _weights(tmp_path / "1")
    assert len(weights) == 4 and len(set(map(tuple, weights))) == 1, "replicas differ"


@rehearsal
@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_rehearsal_a_new_node_whose_ranks_never_connect_is_dropped(tmp_path, no_cluster_left, mode):
    """Issue 45 (d), point 3, on virtual nodes: the 2 ranks started ahead on node1 (through
    node1's Open MPI daemon) never join; after DDL_ELASTIC_SPAWN_TIMEOUT node1 is dropped
    (its hung ranks and the daemon killed with the launch), and the job is relaunched on node0
    and finishes at 2 ranks, replicas equal."""
    _dropped_and_trained_on(
        tmp_path, mode, "1", survivor="node0", new="node1", options=("--rehearse", "2")
    )


def _kill_node1_daemon(job: subprocess.Popen, logfile: Path) -> None:
    """Once rank 0 logged an epoch, SIGKILL Open MPI's daemon on node1 (a node crash)."""
    deadline = time.monotonic() + HANG_SECONDS
    while not (logfile.exists() and logfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _descendants(job.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode()).name == "prted":
            os.kill(pid, signal.SIGKILL)
            return
    raise AssertionError("no Open MPI daemon of node1 found under ddlrun")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@rehearsal
def test_rehearsal_a_lost_node_daemon_relaunches_the_job_on_the_survivors(
    tmp_path, no_cluster_left
):
    """Only node1's Open MPI daemon is killed: its ranks die with it (within a second, measured),
    Open MPI's runtime ends the rest, and ddlrun relaunches the job on node0 from the commit
    its ranks mirrored in host memory (numpy state of the schedule worker)."""
    start = time.monotonic()
    done, records = _run(
        tmp_path,
        schedule=[(None, ["node0:2", "node1:2"])],
        np_=4,
        options=("--rehearse", "2"),
        script_args=("--epochs", "8", "--epoch-wait", "0.3"),
        on_start=_kill_node1_daemon,
    )
    assert time.monotonic() - start < HANG_SECONDS
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ddlrun: Open MPI lost its daemon on host node1" in done.stderr, done.stderr[-3000:]
    assert "relaunching the elastic job on node0:2" in done.stderr
    assert "elastic job finished on 2 rank(s) (node0)" in done.stdout
    assert records[0]["size"] == 4 and records[-1]["size"] == 2, records
    assert records[-1]["epoch"] == 7, "the relaunched job trained to the last epoch"
    weights = _weights(tmp_path)
    assert len(weights) == 2 and weights[0] == weights[1], "replicas differ"


KERAS_WORKER = REPO / "tests" / "parallel" / "workers" / "elastic_keras.py"


@rehearsal
def test_rehearsal_a_node_crashing_whole_costs_only_its_ranks(tmp_path, no_cluster_left):
    """Every process of node1 (both ranks and its Open MPI daemon) SIGKILLed at once.

    Open MPI 5.0's runtime ends node0's ranks too; ddlrun relaunches the job on
    node0, and the new ranks resume from the newest commit node0's ranks had
    mirrored in host memory (/dev/shm). The Keras worker logs each commit's
    number and a digest of its values before committing, and what it starts
    from after the relaunch.
    """
    mpirun_executable()  # skips without an MPI
    options = ["--rehearse", "2", "--link", "1gbit", "-np", "4", "--min-np", "2"]
    # slow steps after the crash (0.1 s each, 4 s of training left): Open MPI's runtime ends
    # node0's ranks (0.2 to 0.8 s here) before they could finish the job at 2 ranks
    variables = {
        "ELASTIC_KILL": "3,0,8",
        "ELASTIC_KILL_NODE": "1",
        "ELASTIC_COMMIT_LOG": "1",
        "ELASTIC_SLEEP": "0.1",
    }
    done = subprocess.run(
        [str(DDLRUN), *options, str(KERAS_WORKER)],
        cwd=tmp_path,
        env=mpi_env({"ELASTIC_OUT": str(tmp_path), **variables}),
        capture_output=True,
        text=True,
        timeout=2 * HANG_SECONDS + PROCESS_MARGIN_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ddlrun: Open MPI lost its daemon on host node1" in done.stderr, done.stderr[-3000:]
    assert "relaunching the elastic job on node0:2" in done.stderr
    assert "elastic job finished on 2 rank(s) (node0)" in done.stdout
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(results) == [0, 1], "node1's ranks are gone; node0's two were relaunched"
    assert all(
        r["relaunch"] == 1 and r["size"] == 2 and r["host"] == "node0" for r in results.values()
    )
    assert results[0]["weights"] == results[1]["weights"], "replicas differ after the relaunch"
    assert (2, 15) in {(e, b) for _, _, e, b in results[0]["steps"]}, "training did not finish"
    # nothing lost beyond the last commit: the relaunch starts from the newest commit a
    # survivor logged (or the one before it, if the crash came while that one was written)
    log = [json.loads(line) for line in (tmp_path / "commits.jsonl").read_text().splitlines()]
    entered = [r for r in log if r["relaunch"] == 1 and r.get("entered")]
    assert len(entered) == 2 and len({(r["commit"], r["digest"]) for r in entered}) == 1, entered
    before = [r for r in log if r["relaunch"] == 0 and r["host"] == "node0" and "entered" not in r]
    newest = max(r["commit"] for r in before)
    resumed = entered[0]["commit"]
    assert newest - 1 <= resumed <= newest, (resumed, newest)
    committed = [r["digest"] for r in before if r["commit"] == resumed]
    assert committed and entered[0]["digest"] == committed[-1], "not the committed values"
    killed = float((tmp_path / "killed").read_text())
    first = min(t for t, _, _, _ in results[0]["steps"])
    assert first - killed < HANG_SECONDS, "the survivors never trained on"
    # this job's mirror (other tests' jobs may mirror theirs meanwhile: the other worker)
    mirror = results[0]["mirror"]
    assert mirror and Path(mirror).parent == Path("/dev/shm"), mirror
    assert not Path(mirror).exists(), "the commits' mirror was left"


def _keras_job(folder: Path, options: list[str], **variables: str) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("node0:2\n")
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {folder / 'hosts'}\n")
    script.chmod(0o755)
    return subprocess.run(
        [str(DDLRUN), *options, "--host-discovery-script", str(script), str(KERAS_WORKER)],
        cwd=folder,
        env=mpi_env({"ELASTIC_OUT": str(folder), **variables}),
        capture_output=True,
        text=True,
        timeout=2 * HANG_SECONDS + PROCESS_MARGIN_SECONDS,
        check=False,
    )


@rehearsal
def test_rehearsal_a_listed_node_joins_without_pausing_the_training(tmp_path, no_cluster_left):
    """Issue 45 (b) on virtual nodes: node1 is listed while node0's ranks train; its 2 ranks
    start through node1's daemon (import TensorFlow, connect) while training goes on, and join
    at a commit after they are ready. Run again (at most three tries) only if lost to PRRTE's
    connect defect (see :func:`_run_growing`)."""
    mpirun_executable()  # skips without an MPI
    options = ["--rehearse", "2", "--link", "1gbit", "--min-np", "2", "--max-np", "4"]
    variables = {
        "ELASTIC_GROW": "node1:2",
        "ELASTIC_GROW_AT": "1,3",
        "ELASTIC_GROW_WAIT": "0",
        "ELASTIC_SLEEP": "0.1",
        "ELASTIC_EPOCHS": "8",
        # CI's loaded machine imported TensorFlow on node1 slower than the 8 epochs' ~11 s
        # after the growth, three tries in a row ("the job finished before they were
        # admitted"): train on until an epoch ends with the 4 ranks (40 epochs at most)
        "ELASTIC_UNTIL_SIZE": "4",
    }
    # the defect either ends the job, or leaves the new ranks unconnected until the job ends at
    # 2 ranks; up to three tries
    for attempt in (1, 2, 3):
        folder = tmp_path / str(attempt)
        done = _keras_job(folder, options, **variables)
        if "pmix_server_dyn.c" not in done.stderr or (
            done.returncode == 0 and "before they were admitted" not in done.stderr
        ):
            break
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting 2 rank(s) on node1:2 ahead" in done.stderr, done.stderr[-3000:]
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}
    assert sorted(results) == [0, 1, 2, 3], done.stderr[-3000:]
    assert {r["host"] for r in results.values()} == {"node0", "node1"}
    weights = [r["weights"] for r in results.values()]
    assert all(w == weights[0] for w in weights[1:]), "replicas differ after the growth"
    added = float((folder / "added").read_text())
    steps = results[0]["steps"]
    first = min(t for t, size, _, _ in steps if size == 4)
    assert sum(1 for t, size, _, _ in steps if size == 2 and t > added) >= 10, "training paused"
    assert first - added < HANG_SECONDS, "the new node's ranks never trained"
