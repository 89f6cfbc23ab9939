"""ZeRO sharding in elastic jobs: the shards re-form from the last commit when ranks leave or join.

The first tests run in one process (an elastic job of one rank: the job
flagged elastic); the last two run a real ``ddlrun --min-np ...`` job of
tests/ddl_tf/sharded_elastic_worker.py over Open MPI's fault tolerance;
``localhost`` and ``127.0.0.1`` are two hosts of this machine, as in the
elastic tests of tests/parallel/test_ddl_elastic.py. A lost rank is a real
``SIGKILL``. Each checks that nothing committed is lost (the state every
rank starts the new membership from is, digest for digest, the last commit
made before the change, gathered from the ranks as they were), and that
training then goes on bit for bit as a fresh job of the new size started
from that state does, sharded and replicated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import ddl_tf.keras as hvd
from ddl_tf.core import basics
from ddl_tf.errors import ConfigError
from ddl_tf.keras.elastic import sharded_of
from tests.harness import discovery_script, mpi_env, mpirun_executable
from tests.timing import HANG_SECONDS, PROCESS_MARGIN_SECONDS

WORKER = Path(__file__).resolve().parent / "sharded_elastic_worker.py"
DDLRUN = Path(sys.executable).parent / "ddlrun"
VARIABLES = 8  # the worker's model: four Dense layers


def _ddlrun(tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    mpirun_executable()  # skips without an MPI
    return subprocess.run(
        [str(DDLRUN), *options, str(WORKER)],
        cwd=tmp_path,
        env=mpi_env({"SHARDED_OUT": str(tmp_path), **env}),
        capture_output=True,
        text=True,
        timeout=3 * HANG_SECONDS + PROCESS_MARGIN_SECONDS,
        check=False,
    )


def _results(tmp_path: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}


def _log(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "commits.jsonl").read_text().splitlines()]


def _check_final(results: dict[int, dict], size: int) -> None:
    """Replicas equal, every variable owned once, and training equal to fresh jobs from the commit."""
    assert sorted(results) == list(range(size)), sorted(results)
    first = results[0]
    assert all(r["size"] == size for r in results.values())
    assert len({r["weights_digest"] for r in results.values()}) == 1, "replicas differ"
    assert all(r["owners"] == first["owners"] for r in results.values())
    assert sorted(i for r in results.values() for i in r["own"]) == list(range(VARIABLES))
    assert set(first["owners"]) == set(range(size)), first["owners"]  # every rank has a share
    for rank, result in results.items():
        for label in ("fresh_sharded", "replicated"):
            reference = result["references"][label]
            assert reference["weights"], (rank, label, "weights differ from a fresh job's")
            assert reference["state"], (rank, label, "optimizer state differs from a fresh job's")
            assert reference["iterations"] == result["iterations"], (rank, label)


def _entries(log: list[dict], size: int) -> list[dict]:
    return [r for r in log if r.get("entered") and r["size"] == size]


def _committed_digest(log: list[dict], commit: int, size: int) -> set[str]:
    return {
        r["digest"]
        for r in log
        if not r.get("entered") and r["commit"] == commit and r["size"] == size
    }


@pytest.fixture
def elastic_rank():
    """One rank whose job is flagged elastic (the checks read ``job().elastic``)."""
    hvd.init()
    job = basics.job()
    job.elastic = True
    yield hvd
    job.elastic = False
    hvd.shutdown()


def _sharded_model(sharding: str = "optimizer", width: int = 3) -> keras.Model:
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, name="a"), keras.layers.Dense(width, name="b")],
        name="m",
    )
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1), sharding=sharding),
        loss="mse",
    )
    return model


def _xy(width: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, width)).astype(
        "float32"
    )


def _everything(model: keras.Model) -> list[np.ndarray]:
    """The weights, then the whole optimizer state in its replicated layout."""
    values = sharded_of(model.optimizer).gathered_values()
    return [np.asarray(v) for v in model.get_weights()] + list(values)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_elastic_job_trains_a_sharded_optimizer_only_under_keras_state(elastic_rank):
    x, y = _xy()
    model = _sharded_model()
    with pytest.raises(ConfigError, match=r"hvd\.elastic\.KerasState\(model, \.\.\.\)"):
        model.fit(x, y, batch_size=4, verbose=0)
    tracked = _sharded_model()
    hvd.elastic.KerasState(tracked)
    tracked.fit(x, y, batch_size=4, verbose=0)
    assert int(tracked.optimizer.iterations) == 4


def test_sharding_over_a_process_set_is_refused_in_an_elastic_job():
    first = hvd.ProcessSet([0])
    hvd.init(process_sets=[first])
    basics.job().elastic = True
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = hvd.DistributedOptimizer(
            keras.optimizers.Adam(0.1), sharding="optimizer", process_set=first
        )
        with pytest.raises(ConfigError, match="Shard over the whole job \\(process_set=None\\)"):
            optimizer.build(model.trainable_variables)
    finally:
        basics.job().elastic = False
        hvd.shutdown()


@pytest.mark.parametrize("sharding", ["optimizer", "gradients"])
def test_commit_restore_reset_and_sync_keep_the_whole_sharded_state(elastic_rank, sharding):
    x, y = _xy()
    model = _sharded_model(sharding)
    state = hvd.elastic.KerasState(model, epoch=0)
    assert state.committed_optimizer_state() is None, "not whole before a commit or a sync"
    state.sync()
    model.fit(x, y, batch_size=4, verbose=0)
    state.epoch = 1
    state.commit()
    committed = _everything(model)
    assert sorted(state.committed_optimizer_state()) == sorted(
        sharded_of(model.optimizer).replicated_layout()
    )
    model.fit(x, y, batch_size=4, verbose=0)  # trained on, never committed
    state.epoch = 2
    state.restore()
    assert _same(committed, _everything(model)) and state.epoch == 1
    before = sharded_of(model.optimizer).shard_optimizer()
    state.on_reset()  # a re-form: the shards are built anew from the commit
    assert sharded_of(model.optimizer).shard_optimizer() is not before
    assert model.train_function is None, "Keras traces the step again"
    assert _same(committed, _everything(model))
    state.sync()
    assert _same(committed, _everything(model))
    # and training goes on as from the commit without any of it
    model.fit(x, y, batch_size=4, verbose=0)
    fresh = _sharded_model(sharding)
    hvd.elastic.KerasState(fresh)
    fresh.set_weights(committed[: len(fresh.get_weights())])
    sharded_of(fresh.optimizer).assign_from(committed[len(fresh.get_weights()) :])
    fresh.fit(x, y, batch_size=4, verbose=0)
    assert _same(_everything(fresh), _everything(model))


def test_the_loss_scale_optimizer_commits_and_re_forms_its_scale_and_the_shards(elastic_rank):
    x, y = _xy(1)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1, dtype="float32")]
        )
        optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.1), sharding="gradients")
        assert type(optimizer).__name__ == "DistributedLossScaleOptimizer"
        model.compile(optimizer=optimizer, loss="mse")
        state = hvd.elastic.KerasState(model)
        state.sync()
        model.fit(x, y, batch_size=4, verbose=0)
        state.commit()
        scale = [np.asarray(v) for v in optimizer._variables]  # the loss scale and its counter
        committed = _everything(model) + scale
        model.fit(x, y, batch_size=4, verbose=0)
        state.restore()
        state.on_reset()
        state.sync()
        assert _same(committed, _everything(model) + [np.asarray(v) for v in optimizer._variables])
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_relaunch_resumes_the_sharded_state_mirrored_in_host_memory(
    elastic_rank, tmp_path, monkeypatch
):
    from ddl_tf.membership import mirror

    monkeypatch.setenv("DDL_ELASTIC_MIRROR", str(tmp_path / "mirror"))
    x, y = _xy()
    crashed = _sharded_model()
    state = hvd.elastic.KerasState(crashed, epoch=0)
    state.sync()
    crashed.fit(x, y, batch_size=4, verbose=0)
    state.epoch = 1
    state.commit()
    mirror.write(state)  # what commit() does in an elastic job launched by ddlrun
    committed = _everything(crashed)
    crashed.fit(x, y, batch_size=4, verbose=0)  # lost in the crash

    relaunched = _sharded_model()
    fresh = hvd.elastic.KerasState(relaunched, epoch=0)
    monkeypatch.setenv("DDL_ELASTIC_RESUMED", "1")
    monkeypatch.setattr(mirror, "_resumed", False)
    assert mirror.resume(fresh)
    assert _same(committed, _everything(relaunched)) and fresh.epoch == 1

    # a commit of a replicated optimizer is not this sharded one's
    replicated = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    replicated.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    plain = hvd.elastic.KerasState(replicated)
    plain.commit()
    mirror.write(plain)
    monkeypatch.setattr(mirror, "_resumed", False)
    with pytest.raises(mirror.MirrorError):
        mirror.resume(hvd.elastic.KerasState(_sharded_model()))


@pytest.mark.parallel
@pytest.mark.slow
def test_a_killed_rank_owning_a_shard_its_share_comes_back_from_the_commit(tmp_path):
    """ZeRO-2 on 4 ranks; rank 3 (a share of its own) is killed, its host's rank 2 leaves."""
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2", "-np", "4",
        SHARDED_SHARDING="gradients", SHARDED_KILL="3,1,1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "without rank(s) [3] (host(s) 127.0.0.1 blacklisted)" in done.stderr, done.stderr[-3000:]
    log = _log(tmp_path)
    (start,) = {tuple(r["owners"]) for r in _entries(log, 4)}
    assert 3 in start and 2 in start, f"the ranks that leave owned no variable: {start}"
    lost = [i for i, owner in enumerate(start) if owner in (2, 3)]
    # no commit lost: both survivors start from the killed rank's last commit, whole
    after = _entries(log, 2)
    assert len(after) == 2 and len({(r["commit"], r["digest"]) for r in after}) == 1, after
    killed_commits = [r["commit"] for r in log if r["rank"] == 3 and not r.get("entered")]
    assert after[0]["commit"] == max(killed_commits), (after[0]["commit"], max(killed_commits))
    assert _committed_digest(log, after[0]["commit"], 4) == {after[0]["digest"]}
    # the lost ranks' variables have owners among the survivors
    assert {after[0]["owners"][i] for i in lost} <= {0, 1} and set(after[0]["owners"]) == {0, 1}
    results = _results(tmp_path)
    _check_final(results, 2)
    assert all(r["entered"] == {"epoch": 1, "size": 2} for r in results.values())
    # the epoch restarted from the commit: 3 epochs of 4 steps at 4 ranks were cut at (1, 1);
    # 1 + 2 epochs of 8 steps at 2 ranks follow
    assert results[0]["iterations"] == 4 + 2 + 2 * 8, results[0]["iterations"]


@pytest.mark.parallel
@pytest.mark.slow
def test_a_host_that_leaves_the_discovered_list_its_shares_move_at_the_commit(tmp_path):
    """ZeRO-1 from 4 ranks to 2: the job re-forms at a commit and goes on without a sync."""
    script = discovery_script(tmp_path, "localhost:2\n127.0.0.1:2\n")
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
        SHARDED_SHARDING="optimizer", SHARDED_SHRINK="127.0.0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "removed=('127.0.0.1',)" in done.stderr, done.stderr[-3000:]
    log = _log(tmp_path)
    (start,) = {tuple(r["owners"]) for r in _entries(log, 4)}
    assert set(start) == {0, 1, 2, 3}
    after = _entries(log, 2)
    assert len(after) == 2 and len({(r["commit"], r["digest"]) for r in after}) == 1, after
    newest = max(r["commit"] for r in log if r["size"] == 4 and not r.get("entered"))
    assert after[0]["commit"] == newest, (after[0]["commit"], newest)
    assert _committed_digest(log, newest, 4) == {after[0]["digest"]}
    _check_final(_results(tmp_path), 2)


@pytest.mark.parallel
@pytest.mark.slow
def test_ranks_that_join_receive_their_shares_of_the_commit(tmp_path):
    """ZeRO-1 from 2 ranks to 4: the new ranks own shares they never trained, from the commit."""
    script = discovery_script(tmp_path, "localhost:2\n")
    done = _ddlrun(
        tmp_path,
        "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
        SHARDED_SHARDING="optimizer", SHARDED_GROW="127.0.0.1:2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "added=(('127.0.0.1', 2),)" in done.stderr, done.stderr[-3000:]
    log = _log(tmp_path)
    (start,) = {tuple(r["owners"]) for r in _entries(log, 2)}
    assert set(start) == {0, 1}
    after = _entries(log, 4)
    assert len(after) == 4 and len({(r["commit"], r["digest"]) for r in after}) == 1, after
    # the admitting commit, made by the 2 ranks, is what all 4 start from
    assert _committed_digest(log, after[0]["commit"], 2) == {after[0]["digest"]}
    newest = max(r["commit"] for r in log if r["size"] == 2 and not r.get("entered"))
    assert after[0]["commit"] == newest, (after[0]["commit"], newest)
    results = _results(tmp_path)
    _check_final(results, 4)
    assert {r["host"] for r in results.values()} == {"localhost", "127.0.0.1"}
    for rank in (2, 3):  # the new ranks hold slots of their own share only
        assert results[rank]["own"] and results[rank]["own_slots"] == 2 + 2 * len(
            results[rank]["own"]
        ), results[rank]
