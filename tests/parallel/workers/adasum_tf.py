"""Rank of a 4-rank job: ``op=hvd.Adasum`` through the TensorFlow and Keras API.

* ``hvd.allreduce``/``grouped_allreduce`` with Adasum, eagerly and inside
  ``tf.function``, with and without ``Compression.fp16``, against the numpy tree
  of ``adasum_core.reference``;
* ``DistributedGradientTape(op=Adasum)``: the first step's gradients against the
  numpy tree of every rank's own gradients, then a linear regression trained
  by gradient descent with Adasum and, from the same start, with Average
  (each rank has its own shard): both losses on the whole data set are reported;
* ``DistributedGradientTape(op=Adasum, process_set={1, 3})``: the members combine
  their gradients, ranks 0 and 2 keep their own;
* ``DistributedOptimizer(op=Adasum)`` in ``model.fit``: every rank ends with the
  same weights.
"""

import hashlib

import keras
import numpy as np
import tensorflow as tf

import ddl_tf as hvd
from tests.parallel.workers.adasum_core import reference
from tests.parallel.workers.common import report

DIM, ROWS, STEPS, LR = 8, 64, 40, 0.05


def shard(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s data: inputs from a distribution of its own, one true model for all."""
    rng = np.random.default_rng(rank)
    x = rng.normal(loc=0.5 * rank, size=(ROWS, DIM))
    w = np.linspace(-1.0, 1.0, DIM)[:, None]
    return x, x @ w + 0.1 * rng.normal(size=(ROWS, 1))


def full_loss(w: np.ndarray, size: int) -> float:
    return float(np.mean([np.mean((x @ w - y) ** 2) for x, y in map(shard, range(size))]))


def local_grad(w: tf.Variable, rank: int, op, process_set=None):
    x, y = shard(rank)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((x @ w - y) ** 2)
    tape = hvd.DistributedGradientTape(tape, op=op, process_set=process_set)
    return tape.gradient(loss, [w])[0]


def collectives(rank: int, size: int, checks: dict) -> None:
    rng = np.random.default_rng(3)
    per_rank = [[rng.random((2, 2)), rng.random((5,))] for _ in range(size)]
    want = reference(per_rank)
    mine = [tf.constant(t, tf.float32) for t in per_rank[rank]]
    eager = hvd.grouped_allreduce(mine, op=hvd.Adasum)
    traced = tf.function(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Adasum))(*mine)
    fp16 = hvd.allreduce(mine[1], op=hvd.Adasum, compression=hvd.Compression.fp16)
    want16 = reference([[t.astype(np.float16) for t in ts] for ts in per_rank])
    checks["eager"] = max(
        float(np.max(np.abs(g.numpy() - w))) for g, w in zip(eager, want, strict=True)
    )
    checks["traced"] = max(
        float(np.max(np.abs(g.numpy() - w))) for g, w in zip(traced, want, strict=True)
    )
    checks["fp16"] = [fp16.dtype.name, float(np.max(np.abs(fp16.numpy() - want16[1])))]


def training(rank: int, size: int, checks: dict) -> None:
    start = np.zeros((DIM, 1))
    w = tf.Variable(start)
    first = local_grad(w, rank, hvd.Adasum).numpy()
    own = []
    for r in range(size):
        x, y = shard(r)
        own.append([2.0 / ROWS * x.T @ (x @ start - y)])
    checks["first_step"] = float(np.max(np.abs(first - reference(own)[0])))
    losses = {}
    for name, op in (("adasum", hvd.Adasum), ("average", hvd.Average)):
        w.assign(start)
        for _ in range(STEPS):
            w.assign_sub(LR * local_grad(w, rank, op))
        losses[name] = full_loss(w.numpy(), size)
    checks["losses"] = {"initial": full_loss(start, size), **losses}
    checks["weights"] = hashlib.sha256(w.numpy().tobytes()).hexdigest()


def process_set(rank: int, checks: dict) -> None:
    pair = hvd.add_process_set([1, 3])
    w = tf.Variable(np.zeros((DIM, 1)))
    got = local_grad(w, rank, hvd.Adasum, process_set=pair).numpy()
    grads = {}
    for r in range(4):
        x, y = shard(r)
        grads[r] = [2.0 / ROWS * x.T @ (x @ np.zeros((DIM, 1)) - y)]
    want = reference([grads[1], grads[3]])[0] if rank in (1, 3) else grads[rank][0]
    checks["set_tape"] = float(np.max(np.abs(got - want)))
    hvd.remove_process_set(pair)


def keras_fit(rank: int, checks: dict) -> None:
    x, y = shard(rank)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Adasum)
    model.compile(opt, "mse", jit_compile=False)
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    kernel = model.layers[0].kernel.numpy()
    checks["keras_weights"] = hashlib.sha256(kernel.tobytes()).hexdigest()
    checks["keras_loss"] = [history.history["loss"][0], history.history["loss"][-1]]


def main() -> None:
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    checks: dict = {}
    collectives(rank, size, checks)
    training(rank, size, checks)
    process_set(rank, checks)
    keras_fit(rank, checks)
    report(rank, checks)
    hvd.shutdown()


if __name__ == "__main__":
    main()
