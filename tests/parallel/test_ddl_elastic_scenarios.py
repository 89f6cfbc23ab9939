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
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=mpi_env({"DDL_ELASTIC_DISCOVERY_INTERVAL": "0.1"}),
            capture_output=True,
            text=True,
            timeout=2 * HANG_SECONDS + PROCESS_MARGIN_SECONDS,
            check=False,
        )
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
        script_args=("--epochs", "8", "--epoch-wait", "0.5"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = [r["size"] for r in records]
    assert sizes[:2] == [4, 2], sizes  # 127.0.0.1 out after its rank 3 failed
    assert 4 in sizes[2:], f"127.0.0.1 never came back after its 2 s cooldown: {sizes}"
    back = sizes.index(4, 2)
    assert all(r["rendezvous"] == 3 for r in records[back:])
