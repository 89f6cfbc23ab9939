"""Rank of a 4-rank job: process sets (collectives on subsets), then ``join()`` with uneven data.

Process sets: ranks {1, 3} and {0, 2} are registered (``HOROVOD_DYNAMIC_PROCESS_SETS=1``);
each pair runs its own collectives (different counts per pair) while the other carries
on, every result is checked against numpy on the rank, and a Keras model trains with
``DistributedOptimizer(process_set=...)`` on one pair. A rank outside a set gets its
local gradients from ``DistributedGradientTape``/``DistributedOptimizer`` on that set
(Horovod's behaviour) and a ``tf.errors.InvalidArgumentError`` from its collectives;
removed sets lose their id, ids are reused, the global set cannot be added. Join: rank r has 2 + r batches;
each rank trains with ``DistributedGradientTape`` until its data runs out, calls
``join()``, and broadcasts from the last rank to join; the weights are checked
against Horovod's semantics computed in numpy (joined ranks contribute zero
gradients, Average divides by the job size).
"""

import keras
import numpy as np
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.core.process_sets import registered
from ddl_tf.errors import ConfigError
from tests.parallel.workers.common import report

LR = 0.1


def process_sets(rank: int, checks: dict) -> None:
    pair = hvd.add_process_set([1, 3])
    evens = hvd.add_process_set(hvd.ProcessSet([2, 0]))
    mine = pair if rank in (1, 3) else evens
    checks["set"] = [mine.process_set_id, mine.ranks, mine.size(), mine.rank()]
    checks["size_op"] = int(hvd.size_op(pair.process_set_id))
    checks["included_op"] = int(hvd.process_set_included_op(pair.process_set_id))
    members = mine.ranks
    # a different number of collectives per pair: the sets run independently
    for step in range(3 if mine is pair else 7):
        value = np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1) + step
        got = hvd.allreduce(value, op=hvd.Sum, process_set=mine, name=f"s{step}").numpy()
        want = sum(np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) + step for r in members)
        checks.setdefault("allreduce", []).append(bool(np.array_equal(got, want)))
    average = hvd.allreduce(tf.fill([4], float(rank)), process_set=mine).numpy()
    checks["average"] = bool(np.allclose(average, np.mean(members)))
    rows = hvd.allgather(tf.fill([rank + 1, 2], rank), process_set=mine).numpy()
    checks["allgather"] = bool(
        np.array_equal(rows, np.concatenate([np.full((r + 1, 2), r) for r in members]))
    )
    root = members[-1]  # a job rank, as in Horovod
    got = hvd.broadcast(tf.fill([3], rank), root_rank=root, process_set=mine).numpy()
    checks["broadcast"] = bool(np.array_equal(got, np.full(3, root)))
    checks["objects"] = hvd.allgather_object({"rank": rank}, process_set=mine) == [
        {"rank": r} for r in members
    ]
    try:  # a set this rank is not in: refused here, nobody waits
        hvd.allreduce(tf.ones(1), process_set=evens if mine is pair else pair)
        checks["outsider"] = "no error"
    except tf.errors.InvalidArgumentError as err:  # Horovod's type, and ddl_tf's ConfigError
        checks["outsider"] = isinstance(err, ConfigError) and "not in" in str(err)

    # Keras: DistributedOptimizer over the pair trains like one model on both shards
    checks["keras_error"] = keras_step_error(rank, mine, members)
    # outside a set: the tape and the optimizer give this rank's own gradients (Horovod)
    x = tf.constant(float(rank))
    with tf.GradientTape() as g:
        g.watch(x)
        y = x * x
    (dx,) = hvd.DistributedGradientTape(g, process_set=pair).gradient(y, [x])
    checks["tape_pair"] = float(dx)  # members: 2 * mean(1, 3); others: 2 * rank
    checks["keras_pair_error"] = keras_step_error(
        rank, pair, pair.ranks if mine is pair else [rank]
    )
    checks["removed"] = [hvd.remove_process_set(pair), hvd.remove_process_set(pair)]
    hvd.remove_process_set(evens)
    # the whole job is in step afterwards
    total = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum).numpy()
    checks["global_after"] = float(total[0])


def keras_step_error(rank: int, process_set, members: list[int]) -> float:
    """One ``fit`` step with ``DistributedOptimizer(process_set=)``, against numpy SGD on the
    mean of ``members``' gradients (only this rank's own for a rank outside the set)."""
    x = np.random.default_rng(rank).normal(size=(8, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), process_set=process_set)
    model.compile(opt, "mse", jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    kernel = model.layers[0].kernel.numpy()
    grads = []
    for r in members:
        xr = np.random.default_rng(r).normal(size=(8, 3))
        yr = xr @ np.array([[1.0], [-2.0], [0.5]])
        grads.append(2.0 / 8 * xr.T @ (xr @ np.ones((3, 1)) - yr))
    want = np.ones((3, 1)) - LR * np.mean(grads, axis=0)
    return float(np.max(np.abs(kernel - want)))


def set_lifecycle(rank: int, size: int, checks: dict) -> None:
    """Horovod's dynamic-set rules: ids, removal, re-adding, the global set, str()."""
    a, b, c = (hvd.add_process_set(r) for r in ([0], [1, 2], [3]))
    checks["ids"] = [a.process_set_id, b.process_set_id, c.process_set_id]
    hvd.remove_process_set(b)
    checks["invalidated"] = b.process_set_id is None
    d = hvd.add_process_set([0, 3])
    checks["reused"] = d.process_set_id  # the lowest free id: b's
    hvd.add_process_set(b)  # the same object, added again
    checks["readded"] = b.process_set_id
    if b.included():
        checks["readded_sum"] = float(hvd.allreduce([1.0], op=hvd.Sum, process_set=b).numpy()[0])
    for dup, phrase in ((range(size), "ranks of the global process set"), ([2, 1], "already")):
        try:
            hvd.add_process_set(dup)
            checks.setdefault("duplicates", []).append("no error")
        except ValueError as err:
            checks.setdefault("duplicates", []).append(phrase in str(err))
    checks["registered"] = {str(k): v for k, v in registered().items()}
    checks["str"] = [str(hvd.global_process_set), repr(d)]
    checks["removed_all"] = [hvd.remove_process_set(s) for s in (a, b, c, d)]
    checks["registered_after"] = {str(k): v for k, v in registered().items()}


def batches(rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(100 + rank)
    out = []
    for _ in range(2 + rank):  # uneven: rank r has 2 + r batches
        x = rng.normal(size=(4, 2))
        out.append((x, x @ np.array([[0.5], [1.5]]) + 0.25))
    return out


def join(rank: int, size: int, checks: dict) -> None:
    w = tf.Variable(tf.zeros((2, 1), tf.float64))
    b = tf.Variable(tf.zeros((1,), tf.float64))
    for x, y in batches(rank):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w + b - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)
    last = int(hvd.join())
    hvd.broadcast_variables([w, b], root_rank=last)
    # Horovod's semantics in numpy: at step k the ranks with data contribute their
    # gradient, joined ranks zeros, and Average divides by the job size
    data = [batches(r) for r in range(size)]
    rw, rb = np.zeros((2, 1)), np.zeros(1)
    for k in range(max(len(d) for d in data)):
        gw, gb = np.zeros((2, 1)), np.zeros(1)
        for d in data:
            if k < len(d):
                x, y = d[k]
                err = x @ rw + rb - y
                gw += 2.0 / len(x) * x.T @ err
                gb += 2.0 / len(x) * err.sum(0)
        rw, rb = rw - LR * gw / size, rb - LR * gb / size
    checks["last"] = last
    checks["join_error"] = float(max(np.max(np.abs(w.numpy() - rw)), np.max(np.abs(b - rb))))


def join_refusal(rank: int, checks: dict) -> None:
    if rank == 0:
        checks["refusal_last"] = int(hvd.join())
        return
    try:
        hvd.broadcast(tf.ones(2), root_rank=1)
        checks["refusal"] = "no error"
    except Exception as err:  # noqa: BLE001 - the TF-typed class is what users see
        checks["refusal"] = "join()" in str(err)
    checks["refusal_last"] = int(hvd.join())


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checks: dict = {}
    process_sets(rank, checks)
    set_lifecycle(rank, size, checks)
    join(rank, size, checks)
    join_refusal(rank, checks)
    report(rank, checks)
    hvd.shutdown()


if __name__ == "__main__":
    main()
