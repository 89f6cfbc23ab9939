"""An elastic training loop driven by schedules, for the scenarios of Horovod's elastic tests.

Horovod 0.28.1's integration tests (``test/integration/elastic_common.py``)
run a script that trains a few epochs, logs one record per epoch from rank 0
(epoch, commits, host, rank at launch, size, rendezvous count; ours also the
time and ddlrun's relaunch count), makes ranks
exit at scheduled ``(epoch, batch)`` points (by exception or by kill) and has
a discovery script whose hosts change with the number of records. This is
our version of that script, on ddl_tf's framework-neutral elastic API
(:mod:`ddl_tf.membership.state`) and the core engine (numpy, no TensorFlow:
each rank starts in well under a second, so a dozen jobs fit in the suite).

Arguments as in Horovod's script: ``--logfile``, ``--epochs``,
``--batches-per-epoch``, ``--batches-per-commit``, ``--epoch-wait``,
``--discovery-schedule`` (JSON ``[[epoch or null, [host:slots, ...]], ...]``),
``--discovery-wait``, ``--exit-schedule`` (JSON ``{"(epoch, batch)": [ranks at
launch]}``), ``--exit-mode`` (``exception`` or ``kill``), plus ``--out``: a
folder for each final rank's weights. Ours only:

* ``--process-set``: every rank adds the process set of ranks 0 and 1 after
  ``init()`` (dynamic sets) and again in a reset callback, as docs/elastic.md
  says; each step also allreduces over it, and each record holds the average of
  rank + 1 over the set (``set_sum``: 1.5). Before adding it again, the callback uses
  the old set once and writes the error it raises to ``--out``/``stale_set.txt``;
* ``--newcomers-fail HOST:MODE``: ranks on ``HOST`` never join: before
  ``init()`` they exit with status 1 (``exit``) or sleep (``hang``), so the
  ranks that spawned them wait for a connection that never comes;
* ``--until-size N``: train on past ``--epochs`` (up to ``--max-epochs``, 40)
  until an epoch ends with N ranks, so that a test of a growth does not race
  the newcomers' start on a loaded machine (every rank decides alike, from the
  committed epoch and the job's size).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.process_sets import ProcessSet, add_process_set, engine_for
from ddl_tf.errors import ConfigError
from ddl_tf.membership.reform import membership
from ddl_tf.membership.state import ObjectState, run

parser = argparse.ArgumentParser()
parser.add_argument("--logfile", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=10)
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--epoch-wait", type=float, default=0.0)
parser.add_argument("--discovery-schedule", default="[]")
parser.add_argument("--discovery-wait", type=float, default=20.0)
parser.add_argument("--exit-schedule", default="{}")
parser.add_argument("--exit-mode", default="exception", choices=("exception", "kill"))
parser.add_argument("--process-set", action="store_true")
parser.add_argument("--static-set", action="store_true", help="the pair given to init() instead")
parser.add_argument("--newcomers-fail", default="")
parser.add_argument("--until-size", type=int, default=0)
parser.add_argument("--max-epochs", type=int, default=40)
args = parser.parse_args()

if args.newcomers_fail:
    bad_host, mode = args.newcomers_fail.split(":")
    if os.environ.get("HOROVOD_HOSTNAME") == bad_host:
        if mode == "exit":
            os._exit(1)
        time.sleep(600)  # bounded: the test's own timeout ends the job long before
        os._exit(1)

static_pair = ProcessSet([0, 1]) if args.static_set else None
basics.init(process_sets=[static_pair] if static_pair else "dynamic" if args.process_set else None)
hostname = os.environ.get("HOROVOD_HOSTNAME")
start_rank = int(os.environ.get("HOROVOD_RANK", "0"))
schedule = json.loads(args.discovery_schedule)
hosts_by_epoch = {epoch: hosts for epoch, hosts in schedule if epoch is not None}
default_hosts = schedule[-1][1] if schedule else []
exits = json.loads(args.exit_schedule)


def check_exit(epoch: int, batch: int) -> None:
    """Fail here if scheduled; once only (a newcomer can get the failed rank's number again)."""
    if start_rank in exits.get(str((epoch, batch)), []):
        fired = Path(args.out, f"exited.{epoch}.{batch}.{start_rank}")
        if fired.exists():
            return
        fired.touch()
        if args.exit_mode == "exception":
            raise RuntimeError(f"scheduled exit at epoch {epoch} batch {batch} (rank {start_rank})")
        os.kill(os.getpid(), signal.SIGKILL)


pair: ProcessSet | None = static_pair


def add_pair() -> None:
    """Register the process set of ranks 0 and 1 (collective over the job)."""
    global pair
    pair = add_process_set(ProcessSet([0, 1]))


def readd_pair() -> None:
    """Reset callback: use the set of the old membership once (it must be refused), add it again."""
    assert pair is not None
    try:
        engine_for(pair)
    except ConfigError as err:
        Path(args.out, "stale_set.txt").write_text(str(err))
    else:
        raise AssertionError(f"{pair!r} of the old membership was still usable after a reset")
    add_pair()


def set_sum() -> float | None:
    """The average of rank + 1 over the pair (1.5 on its members), None without ``--process-set``."""
    if pair is None or not pair.included():
        return None
    (mean,) = engine_for(pair).allreduce([np.full(1, basics.rank() + 1.0)], ReduceSpec())
    return float(mean[0])


def step(state) -> None:
    """One SGD step on a quadratic whose gradient differs per rank (so ranks must agree)."""
    target = np.arange(4.0) + basics.rank()
    (grad,) = basics.engine().allreduce([state.weights - target], ReduceSpec())
    state.weights = state.weights - 0.1 * grad
    set_sum()


def log_state(state, pair_sum: float | None) -> None:
    record = {
        "epoch": state.epoch,
        "batch": state.batch,
        "commits": state.commits,
        "hostname": hostname,
        "start_rank": start_rank,
        "rank": basics.rank(),
        "size": basics.size(),
        "rendezvous": state.rendezvous,
        "set_sum": pair_sum,
        "time": time.time(),
        "relaunch": int(os.environ.get("DDL_ELASTIC_RESUMED") or 0),
    }
    with open(args.logfile, "a") as log:
        log.write(json.dumps(record) + "\n")


def training(state) -> bool:
    """Whether another epoch runs: ``--epochs`` of them, then on while under ``--until-size``."""
    if state.epoch < args.epochs:
        return True
    return basics.size() < args.until_size and state.epoch < args.max_epochs


@run
def train(state) -> None:
    state.rendezvous += 1
    while training(state):
        while state.batch < args.batches_per_epoch:
            check_exit(state.epoch, state.batch)
            step(state)
            state.batch += 1
            if state.batch % args.batches_per_commit == 0:
                state.commits += 1
                state.commit()
        pair_sum = set_sum()  # on every rank: a collective of the pair
        if basics.rank() == 0:
            log_state(state, pair_sum)
            now = hosts_by_epoch.get(state.epoch, default_hosts)
            upcoming = hosts_by_epoch.get(state.epoch + 1, default_hosts)
            if args.discovery_wait > 0 and now != upcoming:
                deadline = time.monotonic() + args.discovery_wait
                while not membership().poll_hosts():
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the host change {now} -> {upcoming} was not discovered"
                        )
                    time.sleep(0.05)
        if args.epoch_wait > 0:
            time.sleep(args.epoch_wait)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


state = ObjectState(epoch=0, batch=0, commits=0, rendezvous=0, weights=np.zeros(4))
if args.process_set:
    add_pair()
if args.process_set or args.static_set:
    state.register_reset_callbacks([readd_pair])
train(state)
Path(args.out, f"weights.{basics.rank()}.json").write_text(json.dumps(state.weights.tolist()))
