"""The rank program of tests/ddl_tf/test_sharding_elastic.py: a sharded elastic Keras job.

Horovod's elastic recipe (``KerasState``, the three callbacks,
``elastic.run``) around ``DistributedOptimizer(Adam, sharding=...)``, each
rank training on its own slice of the data (``x[rank::size]``, taken again
whenever the job re-forms). Run under ``ddlrun --min-np ...``; settings come
from the environment:

* ``SHARDED_OUT``: folder for the reports;
* ``SHARDED_SHARDING``: ``optimizer`` (default) or ``gradients``;
* ``SHARDED_KILL``: ``launch_rank,epoch,batch``: that rank SIGKILLs itself
  after that batch's commit (a short pause first, so that every rank has
  the commit whole);
* ``SHARDED_GROW``: ``host:slots``: rank 0 appends it to the ``hosts`` file
  the discovery script prints after ``SHARDED_GROW_AT`` (``epoch,batch``,
  default ``1,1``), and waits until the new ranks are ready to join;
* ``SHARDED_SHRINK``: ``host``: rank 0 takes it out of the ``hosts`` file at
  ``SHARDED_GROW_AT``, and waits until the change is discovered (its ranks
  leave at the next commit, which the job re-forms at, without a sync).

Every rank appends to ``commits.jsonl``, before each commit, the commit's
number and a digest of the values it commits (the weights and the whole
optimizer state, gathered from the ranks as they are); on entering the
training function, the number and digest it starts from, and its
membership. After ``elastic.run`` returns, each rank trains two references
from the last state it entered with, on the same data slices: a fresh
sharded model (the job a restart of the new size from that commit would
run) and a replicated one (``sharding=None``). It writes ``rank<rank>.json``:
its final weights and whole optimizer state, the references', and the
owners of the variables.
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

EPOCHS, BATCH, SAMPLES, FEATURES = 3, 4, 64, 8


def make_model() -> keras.Model:
    """Four Dense layers: eight variables of several sizes, spread over up to four ranks."""
    keras.utils.set_random_seed(3)
    # named: the references' variables (and their slots) have the trained model's paths
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="tanh", name="hidden0"),
            keras.layers.Dense(16, activation="tanh", name="hidden1"),
            keras.layers.Dense(8, activation="tanh", name="hidden2"),
            keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )


def data() -> tuple[np.ndarray, np.ndarray]:
    """The whole data set, the same on every rank (each trains on its slice)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    return x, np.sin(x[:, :2].sum(axis=1, keepdims=True)).astype("float32")


def compiled(hvd, sharding: str | None) -> keras.Model:
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), sharding=sharding),
        loss="mse",
        jit_compile=False,
    )
    return model


def fit(hvd, model: keras.Model, epochs: int, callbacks=()) -> None:
    """``epochs`` epochs on this rank's slice of the data, in order."""
    x, y = data()
    rank, size = hvd.rank(), hvd.size()
    model.fit(
        x[rank::size],
        y[rank::size],
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


def whole_state(optimizer, name: str) -> dict[str, np.ndarray]:
    """The whole optimizer state by path: gathered from the ranks' shares (a collective), or the replicated one's."""
    from ddl_tf.keras.elastic import sharded_of
    from ddl_tf.keras.sharding import _slot_key

    sharded = sharded_of(optimizer)
    if sharded is not None:
        return sharded.gather_shards(name=name)
    return {_slot_key(v): v.numpy() for v in optimizer.inner_optimizer.variables}


def digest(weights: list[np.ndarray], state: dict[str, np.ndarray]) -> str:
    values = [*weights, *(state[k] for k in sorted(state))]
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()


def main() -> None:
    import ddl_tf.keras as hvd
    from ddl_tf.keras.elastic import sharded_of
    from ddl_tf.membership.reform import membership

    out = Path(os.environ["SHARDED_OUT"])
    sharding = os.environ.get("SHARDED_SHARDING", "optimizer")
    kill = os.environ.get("SHARDED_KILL")
    grow = os.environ.get("SHARDED_GROW")
    shrink = os.environ.get("SHARDED_SHRINK")
    grow_at = tuple(int(v) for v in os.environ.get("SHARDED_GROW_AT", "1,1").split(","))
    launch_rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))

    hvd.init()
    model = compiled(hvd, sharding)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    entered: dict = {}

    def log(**fields) -> None:
        record = {"pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(), **fields}
        with open(out / "commits.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")

    class CommitLog(keras.callbacks.Callback):
        """Before each commit: its number and the digest of the values it commits."""

        def _log(self) -> None:
            gathered = whole_state(model.optimizer, "test.commit_log")
            log(commit=state.commit_count + 1, digest=digest(model.get_weights(), gathered))

        def on_train_batch_end(self, batch, logs=None):
            self._log()

        def on_epoch_end(self, epoch, logs=None):
            self._log()

    class Scenario(keras.callbacks.Callback):
        waiting = False

        def on_train_batch_end(self, batch, logs=None):
            at = (state.epoch, batch)
            if kill:
                who, epoch, when = (int(v) for v in kill.split(","))
                if launch_rank == who and at == (epoch, when):
                    time.sleep(0.3)  # every rank has this commit whole
                    (out / "killed").write_text(str(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
            if grow and hvd.rank() == 0 and at == grow_at and not (out / "added").exists():
                with open(out / "hosts", "a") as hosts:
                    hosts.write(grow + "\n")
                (out / "added").write_text(str(time.time()))
                deadline = time.monotonic() + 60
                while not membership().poll_hosts() and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.waiting = True
            elif shrink and hvd.rank() == 0 and at == grow_at and not (out / "removed").exists():
                hosts = out / "hosts"
                kept = [h for h in hosts.read_text().splitlines() if h.split(":")[0] != shrink]
                hosts.write_text("".join(h + "\n" for h in kept))
                (out / "removed").write_text(str(time.time()))
                deadline = time.monotonic() + 60
                while not membership().poll_hosts().removed and time.monotonic() < deadline:
                    time.sleep(0.05)
            elif self.waiting and hvd.rank() == 0:  # the new ranks join at a commit once ready
                deadline = time.monotonic() + 60
                while not membership().poll_hosts().added and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.waiting = False

    def train(state) -> None:
        gathered = whole_state(model.optimizer, "test.entry")
        weights = model.get_weights()
        sharded = sharded_of(model.optimizer)
        entered.update(
            epoch=state.epoch, weights=weights, state=gathered, size=hvd.size(), rank=hvd.rank()
        )
        log(
            entered=True,
            commit=state.commit_count,
            digest=digest(weights, gathered),
            owners=list(sharded.plan.owners),
            own=sharded.plan.mine(),
            epoch=state.epoch,
        )
        fit(
            hvd,
            model,
            EPOCHS - state.epoch,
            [
                CommitLog(),
                hvd.elastic.CommitStateCallback(state, batches_per_commit=1),
                hvd.elastic.UpdateBatchStateCallback(state),
                hvd.elastic.UpdateEpochStateCallback(state),
                Scenario(),
            ],
        )

    hvd.elastic.run(train)(state)
    final_weights = model.get_weights()
    final_state = whole_state(model.optimizer, "test.final")

    # the references: a fresh job of this size from the state the last membership started with
    references = {}
    for label, kind in (("fresh_sharded", sharding), ("replicated", None)):
        reference = compiled(hvd, kind)
        reference.set_weights(entered["weights"])
        keras_state = hvd.elastic.KerasState(reference)  # builds the optimizer; marks it tracked
        del keras_state
        inner = sharded_of(reference.optimizer)
        if inner is not None:
            inner.assign_state(entered["state"])
        else:
            from ddl_tf.keras.sharding import _slot_key

            for v in reference.optimizer.inner_optimizer.variables:
                v.assign(entered["state"][_slot_key(v)])
        fit(hvd, reference, EPOCHS - entered["epoch"])
        got = whole_state(reference.optimizer, f"test.reference_{label}")
        references[label] = {
            "weights": all(
                np.array_equal(a, b)
                for a, b in zip(final_weights, reference.get_weights(), strict=True)
            ),
            "state": sorted(got) == sorted(final_state)
            and all(np.array_equal(got[k], final_state[k]) for k in got),
            "iterations": int(np.asarray(got["iteration"])),
        }
    sharded = sharded_of(model.optimizer)
    result = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "launch_rank": launch_rank,
        "host": os.environ.get("HOROVOD_HOSTNAME"),
        "weights_digest": digest(final_weights, final_state),
        "iterations": int(np.asarray(final_state["iteration"])),
        "entered": {"epoch": entered["epoch"], "size": entered["size"]},
        "owners": list(sharded.plan.owners),
        "own": sharded.plan.mine(),
        "own_slots": len(sharded.shard_optimizer().variables),
        "references": references,
        "state": [state.epoch, state.batch],
    }
    (out / f"rank{hvd.rank()}.json").write_text(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
