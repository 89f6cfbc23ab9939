"""Keras 3 data-parallel training on real ranks, checked against one process on the global batches.

Each rank starts from different random weights (so the broadcast callback
matters), trains on its shard with ``DistributedOptimizer(SGD)``; afterwards
the weights must be bitwise identical on all ranks, and rank 0 retrains a
fresh copy of the initial model in a single process on the concatenated
batches (rank 0's batch k followed by rank 1's batch k, ...): with SGD the
results agree up to float summation order. The same holds for a custom loop
with ``DistributedGradientTape``, for ``optimizer.apply_gradients`` inside
``tf.function``, and for ``backward_passes_per_step=2``.
"""

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd
from tests.parallel.workers.common import report

N, FEATURES, BATCH, EPOCHS, LR = 64, 8, 4, 2, 0.05


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1 * rng.normal(size=(N, 1))).astype("float32")
    return x, y


def shard(array, rank, size):
    per = len(array) // size
    return array[rank * per : (rank + 1) * per]


def global_batches(array, size, per_step):
    """Concatenate, per step, ``per_step`` consecutive local batches of every rank."""
    shards = [shard(array, r, size) for r in range(size)]
    steps = len(shards[0]) // (BATCH * per_step)
    out = []
    for k in range(steps):
        for p in range(per_step):
            for r in range(size):
                i = (k * per_step + p) * BATCH
                out.append(shards[r][i : i + BATCH])
    return np.concatenate(out)


def reference(initial, size, per_step=1):
    x, y = dataset()
    model = make_model(0)
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(
        global_batches(x, size, per_step),
        global_batches(y, size, per_step),
        batch_size=BATCH * size * per_step,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return model.get_weights()


def flat(weights):
    return np.concatenate([w.ravel() for w in weights])


def compare(label, model, size, rank, results, per_step=1):
    weights = flat(model.get_weights())
    everyone = hvd.allgather(weights[None, :]).numpy()
    results[f"{label}_identical"] = bool(all(np.array_equal(everyone[0], w) for w in everyone))
    return weights


def main():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    x, y = dataset()
    xs, ys = shard(x, rank, size), shard(y, rank, size)
    results = {}
    initial = make_model(0).get_weights()  # rank 0's initial weights (the broadcast source)

    # 1. compile/fit with DistributedOptimizer and the broadcast callback
    model = make_model(100 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    if rank == 0:
        model.set_weights(initial)
    model.fit(
        xs,
        ys,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    fit_weights = compare("fit", model, size, rank, results)
    expected = flat(reference(initial, size)) if rank == 0 else None
    if rank == 0:
        results["fit_max_diff"] = float(np.abs(fit_weights - expected).max())
        results["fit_moved"] = float(np.abs(fit_weights - flat(initial)).max())

    # 2. custom loop: DistributedGradientTape + plain optimizer, broadcast_variables
    model = make_model(200 + rank)
    optimizer = keras.optimizers.SGD(LR)
    if rank == 0:
        model.set_weights(initial)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def tape_step(bx, by):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.mean_squared_error(by, model(bx)))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(EPOCHS):
        for i in range(0, len(xs), BATCH):
            tape_step(xs[i : i + BATCH], ys[i : i + BATCH])
    tape_weights = compare("tape", model, size, rank, results)
    if rank == 0:
        results["tape_max_diff"] = float(np.abs(tape_weights - expected).max())

    # 3. custom loop: DistributedOptimizer.apply_gradients inside tf.function
    model = make_model(300 + rank)
    model.set_weights(initial)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))

    @tf.function
    def opt_step(bx, by):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.mean_squared_error(by, model(bx)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for _ in range(EPOCHS):
        for i in range(0, len(xs), BATCH):
            opt_step(xs[i : i + BATCH], ys[i : i + BATCH])
    opt_weights = compare("apply", model, size, rank, results)
    if rank == 0:
        results["apply_max_diff"] = float(np.abs(opt_weights - expected).max())

    # 4. backward_passes_per_step=2 (averaged) == one process on batches of 2 passes x ranks
    model = make_model(400 + rank)
    model.set_weights(initial)
    model.compile(
        optimizer=hvd.DistributedOptimizer(
            keras.optimizers.SGD(LR), backward_passes_per_step=2, average_aggregated_gradients=True
        ),
        loss="mse",
    )
    model.fit(xs, ys, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    bpps_weights = compare("bpps", model, size, rank, results)
    if rank == 0:
        ref = flat(reference(initial, size, per_step=2))
        results["bpps_max_diff"] = float(np.abs(bpps_weights - ref).max())
        results["bpps_iterations"] = int(model.optimizer.iterations.numpy())
    report(rank, results)
    hvd.shutdown()


if __name__ == "__main__":
    main()
