"""An elastic Keras job (Horovod's recipe: KerasState, the three callbacks, elastic.run).

Launched by ``ddlrun --min-np ...`` from tests/parallel/test_ddl_elastic.py and
benchmarks/bench_elastic.py. Settings come from the environment:

* ``ELASTIC_OUT``: folder for ``rank<launch rank>.json`` (weights, steps, sizes);
* ``ELASTIC_KILL``: ``launch_rank,epoch,batch``: that rank SIGKILLs itself
  after that batch (writing ``killed`` with the time first);
* ``ELASTIC_KILL_HOST=1``: that rank kills every rank of its host instead
  (a lost node), after taking the host out of the ``hosts`` file;
* ``ELASTIC_KILL_NODE=1``: that rank kills every process of its network
  namespace, its Open MPI daemon included (a virtual node crashing whole, on
  the rehearsal cluster);
* ``ELASTIC_COMMIT_LOG=1``: each rank appends to ``commits.jsonl``, before each
  commit, the commit's number and a digest of the values it commits, and, on
  entering the training function, the number and digest it starts from;
* ``ELASTIC_GROW``: ``host:slots``: rank 0 appends it to the ``hosts`` file
  the discovery script prints, after batch 3 of epoch 1, or at
  ``ELASTIC_GROW_AT`` (``epoch,batch``) (writing ``added``);
* ``ELASTIC_GROW_WAIT=0``: rank 0 trains on after that write instead of waiting
  until the change is discovered and the new ranks are ready (growth without a pause);
* ``ELASTIC_SLEEP``: seconds each batch sleeps after it ends (a slower step);
* ``ELASTIC_COMMIT``: batches per commit (default 1); ``ELASTIC_FIXED=1`` runs
  the same training without elastic state (the cost comparison);
* ``ELASTIC_EPOCHS``, ``ELASTIC_STEPS``, ``ELASTIC_MODEL`` (``mlp`` or
  ``mobilenet``);
* ``ELASTIC_UNTIL_SIZE``: train on past ``ELASTIC_EPOCHS`` (up to
  ``ELASTIC_MAX_EPOCHS``, default 40) until the job has this many ranks at the end of
  an epoch (a growth test's newcomers join however slowly the machine imports TensorFlow;
  every rank decides alike, from the committed epoch and the size).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import keras
import numpy as np

import ddl_tf.keras as hvd
from ddl_tf.membership.discovery import DiscoveryError, parse_hosts
from ddl_tf.membership.reform import membership

out = Path(os.environ["ELASTIC_OUT"])
launch_rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
kill = os.environ.get("ELASTIC_KILL")
pause = float(os.environ.get("ELASTIC_SLEEP", "0"))
grow = os.environ.get("ELASTIC_GROW")
grow_wait = os.environ.get("ELASTIC_GROW_WAIT", "1") != "0"
grow_at = tuple(int(v) for v in os.environ.get("ELASTIC_GROW_AT", "1,3").split(","))
kill_host = os.environ.get("ELASTIC_KILL_HOST") == "1"
kill_node = os.environ.get("ELASTIC_KILL_NODE") == "1"
commit_log = os.environ.get("ELASTIC_COMMIT_LOG") == "1"
relaunch = int(os.environ.get("DDL_ELASTIC_RESUMED", "0"))
commit_every = int(os.environ.get("ELASTIC_COMMIT", "1"))
fixed = os.environ.get("ELASTIC_FIXED") == "1"
epochs = int(os.environ.get("ELASTIC_EPOCHS", "3"))
steps = int(os.environ.get("ELASTIC_STEPS", "16"))
kind = os.environ.get("ELASTIC_MODEL", "mlp")
until_size = int(os.environ.get("ELASTIC_UNTIL_SIZE", "0"))
max_epochs = int(os.environ.get("ELASTIC_MAX_EPOCHS", "40")) if until_size else epochs

hvd.init()
keras.utils.set_random_seed(7)
rng = np.random.default_rng(0)
if kind == "mobilenet":
    x = rng.normal(size=(steps * 8, 64, 64, 3)).astype("float32")
    y = rng.integers(0, 10, size=(steps * 8,))
    model = keras.applications.MobileNetV2(input_shape=(64, 64, 3), weights=None, classes=10)
    loss, batch_size = "sparse_categorical_crossentropy", 8
else:
    x = rng.normal(size=(steps * 16, 32)).astype("float32")
    y = rng.normal(size=(steps * 16, 1)).astype("float32")
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)]
    )
    loss, batch_size = "mse", 16
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss)
steps_log: list[tuple[float, int, int, int]] = []
cpu_log: list[tuple[float, float]] = []  # (time, this process's CPU seconds) after each batch
state = None if fixed else hvd.elastic.KerasState(model, batch=0, epoch=0)


def _valid(line: str) -> bool:
    try:
        return bool(parse_hosts(line))
    except DiscoveryError:  # the garbage test: nothing will ever be discovered
        return False


def _kill_my_host() -> None:
    """Take this host out of discovery and SIGKILL the other ranks on it (a lost node)."""
    host = os.environ["HOROVOD_HOSTNAME"]
    hosts = out / "hosts"
    if hosts.exists():
        kept = [line for line in hosts.read_text().splitlines() if line.split(":")[0] != host]
        hosts.write_text("".join(line + "\n" for line in kept))
    mine = {f"ELASTIC_OUT={out}".encode(), f"HOROVOD_HOSTNAME={host}".encode()}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if mine <= set((proc / "environ").read_bytes().split(b"\0")):
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                continue


def _kill_my_node() -> None:
    """SIGKILL every process in this process's network namespace, this one last (a node crash)."""
    mine = os.readlink("/proc/self/ns/net")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if os.readlink(proc / "ns" / "net") == mine:
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                continue


def _digest() -> str:
    values = [np.asarray(v) for v in model.variables + model.optimizer.variables]
    return hashlib.sha256(b"".join(v.tobytes() for v in values)).hexdigest()


def _log_commit(**fields) -> None:
    record = {"pid": os.getpid(), "host": os.environ.get("HOROVOD_HOSTNAME"), **fields}
    with open(out / "commits.jsonl", "a") as log:
        log.write(json.dumps({"relaunch": relaunch, "time": time.time(), **record}) + "\n")


class CommitLog(keras.callbacks.Callback):
    """Before each commit of CommitStateCallback (every batch): its number and values' digest."""

    def on_train_batch_end(self, batch, logs=None):
        _log_commit(commit=state.commit_count + 1, digest=_digest())

    def on_epoch_end(self, epoch, logs=None):
        _log_commit(commit=state.commit_count + 1, digest=_digest())


class Recorder(keras.callbacks.Callback):
    keras_epoch = 0
    awaiting = False  # rank 0: ranks started ahead for the grown host are not in yet

    def on_epoch_begin(self, epoch, logs=None):
        self.keras_epoch = epoch  # the fixed job's epoch (it has no state)

    def on_epoch_end(self, epoch, logs=None):
        # state.epoch is already the next one (UpdateEpochStateCallback runs first)
        if until_size and state is not None and state.epoch >= epochs and hvd.size() >= until_size:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        epoch = state.epoch if state is not None else self.keras_epoch
        steps_log.append((time.time(), hvd.size(), epoch, batch))
        cpu_log.append((time.time(), time.process_time()))
        time.sleep(pause)
        if kill:
            who, at_epoch, at_batch = (int(v) for v in kill.split(","))
            if launch_rank == who and (epoch, batch) == (at_epoch, at_batch):
                (out / "killed").write_text(str(time.time()))
                if kill_host:
                    _kill_my_host()
                if kill_node:
                    _kill_my_node()
                os.kill(os.getpid(), signal.SIGKILL)
        if grow and hvd.rank() == 0 and (epoch, batch) == grow_at and not (out / "added").exists():
            with open(out / "hosts", "a") as hosts:
                hosts.write(grow + "\n")
            (out / "added").write_text(str(time.time()))
            # as Horovod's elastic test script does: wait until the change is discovered, so
            # that a fast job does not finish before its next commit can see it
            deadline = time.monotonic() + (60 if _valid(grow) and grow_wait else 0)
            while not (change := membership().poll_hosts()) and time.monotonic() < deadline:
                time.sleep(0.05)
            # started ahead (the default): the next commit starts the new ranks; wait at the
            # batches after it until they are ready, so that they join before the job ends
            self.awaiting = bool(change.ahead) and grow_wait
        elif self.awaiting and hvd.rank() == 0:
            deadline = time.monotonic() + 60
            while not membership().poll_hosts().added and time.monotonic() < deadline:
                time.sleep(0.05)
            self.awaiting = False


def train(state) -> None:
    callbacks = [Recorder()]
    if state is not None and commit_log:
        assert commit_every == 1, "the commit log counts one commit per batch"
        _log_commit(entered=True, commit=state.commit_count, digest=_digest(), size=hvd.size())
        callbacks.insert(0, CommitLog())
    if state is not None:
        callbacks = [
            *callbacks[:-1],
            hvd.elastic.CommitStateCallback(state, batches_per_commit=commit_every),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            callbacks[-1],
        ]
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=max_epochs - (state.epoch if state is not None else 0),  # Horovod's recipe
        steps_per_epoch=steps,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


if fixed:
    hvd.broadcast_variables(model.variables, root_rank=0)
    train(None)
else:
    hvd.elastic.run(train)(state)
weights = np.concatenate([np.asarray(v).ravel() for v in model.get_weights()])
result = {
    "launch_rank": launch_rank,
    "rank": hvd.rank(),
    "size": hvd.size(),
    "host": os.environ.get("HOROVOD_HOSTNAME"),
    "weights": weights.tolist(),
    "steps": steps_log,
    "cpu": cpu_log,
    "state": None if state is None else [state.epoch, state.batch],
    "relaunch": relaunch,
    "mirror": os.environ.get("DDL_ELASTIC_MIRROR"),  # where ddlrun had the commits mirrored
}
(out / f"rank{launch_rank}.json").write_text(json.dumps(result))
print(f"rank {hvd.rank()} (launched as {launch_rank}) finished at size {hvd.size()}", flush=True)
sys.exit(0)
