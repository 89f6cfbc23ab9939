"""Sharded optimizer state (ZeRO-1) and gradients (ZeRO-2) against replicated training, on real ranks.

``train``: for each element-wise Keras optimizer, and for each sharding,
the same model from the same weights trains on the same per-rank data with
``DistributedOptimizer(opt)`` (replicated) and with
``DistributedOptimizer(opt, sharding=...)``; the weights and the optimizer
state (gathered into the replicated layout) must be bitwise equal. Also:
``global_clipnorm``, ``mixed_float16`` (the loss-scale optimizer), fp16
compression (ddl_tf's, and a Horovod-style compressor of the user's), a
rank's share of the optimizer-state bytes, and a checkpoint written by
every rank (``hvd.save_model``) for ``load`` to read.

``differ`` (2 ranks): rank 1 builds a model with one layer wider, then one
layer more, than rank 0's; every rank must raise ``ConfigError`` at the
optimizer's build, naming the difference, and the next (same) model must
still train.

``set`` (3 ranks, a process set of ranks 0 and 1): sharded against replicated
``DistributedOptimizer(process_set=...)``, both shardings, and ZeRO-2 with a
global clip norm; the set's ranks share the variables, rank 2 owns all and trains alone.

``save0 callback|end`` (2 ranks): Horovod's habit of saving on rank 0 only,
with sharding: a ``ModelCheckpoint`` in rank 0's callbacks (rank 1 trains
on into the next epoch), or ``if rank == 0: model.save(path)`` before
``shutdown`` (rank 1 shuts down). Each rank reports the error it got, then
lets it end the job.

``load`` (any number of ranks): the checkpoint loads into a sharded
optimizer, each rank's state equals the saved replicated state by name, and
one more step equals the replicated optimizer's step from the same file.
"""

import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd
from ddl_tf.core import basics
from ddl_tf.errors import ConfigError
from ddl_tf.keras.shard_plan import gather_buckets
from tests.parallel.workers.common import report

FEATURES, BATCH, STEPS = 12, 8, 6

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "lion": lambda: keras.optimizers.Lion(0.001),
}


def make_model(wider=0, deeper=False):
    keras.utils.set_random_seed(0)
    extra = [keras.layers.Dense(8, activation="relu")] if deeper else []
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(32, activation="gelu"),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(24 + wider, activation="tanh"),
            keras.layers.Dense(16, activation="relu"),
            *extra,
            keras.layers.Dense(1),
        ]
    )


def make_stack():
    """Five equal hidden layers: whole variables of one size, dealt to the ranks in turn."""
    keras.utils.set_random_seed(0)
    hidden = [keras.layers.Dense(16, activation="tanh") for _ in range(5)]
    return keras.Sequential([keras.Input((FEATURES,)), *hidden, keras.layers.Dense(1)])


class CastToHalf:
    """A Horovod-style compressor of the user's own (``compress``/``decompress`` on tensors)."""

    def compress(self, tensor):
        return tf.cast(tensor, tf.float16), tensor.dtype

    def decompress(self, tensor, dtype):
        return tf.cast(tensor, dtype)


def data(rank):
    rng = np.random.default_rng(10 + rank)
    x = rng.normal(size=(BATCH * STEPS, FEATURES)).astype("float32")
    y = (np.sin(x[:, :1]) + 0.1 * rng.normal(size=(len(x), 1))).astype("float32")
    return x, y


def train(optimizer, rank, model=None, **options):
    model = model or make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer, **options), loss="mse")
    x, y = data(rank)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model


def state_of(optimizer):
    """The optimizer's variables in the replicated layout (a collective when sharded)."""
    inner = optimizer.inner_optimizer
    if isinstance(inner, hvd.ShardedOptimizer):
        return [np.asarray(v) for v in inner.gathered_values()]
    return [np.asarray(v) for v in inner.variables]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def worst(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x, "float64") - y))) for x, y in zip(a, b, strict=True)
    )


def compare(key, replicated, sharded):
    """Weights, gathered state and step count of a sharded run against the replicated one."""
    return {
        f"{key}_weights": same(replicated.get_weights(), sharded.get_weights()),
        f"{key}_diff": worst(replicated.get_weights(), sharded.get_weights()),
        f"{key}_state": same(state_of(replicated.optimizer), state_of(sharded.optimizer)),
        f"{key}_iterations": int(sharded.optimizer.iterations.numpy()),
    }


def state_bytes(optimizer):
    inner = optimizer.inner_optimizer
    if isinstance(inner, hvd.ShardedOptimizer):
        inner = inner.shard_optimizer()
    return int(sum(np.asarray(v).nbytes for v in inner.variables if len(v.shape)))


def train_mode(outdir, only=None):
    rank = hvd.rank()
    results = {}
    shardings = ("optimizer", "gradients")
    for label, make in OPTIMIZERS.items():
        if only and label not in only:
            continue
        replicated = train(make(), rank)
        for sharding in shardings:
            sharded = train(make(), rank, sharding=sharding)
            key = f"{label}_{sharding}"
            results.update(compare(key, replicated, sharded))
            if label == "adamw":
                results["bytes_replicated"] = state_bytes(replicated.optimizer)
                results[f"bytes_{sharding}"] = state_bytes(sharded.optimizer)
        results[f"{label}_moved"] = worst(replicated.get_weights(), make_model().get_weights())
    if only:  # the quick run: sharded against replicated only
        report(rank, results)
        return

    # ZeRO-2 in buckets of >= 1 KiB balanced between the owners: equal layers, several buckets
    replicated = train(keras.optimizers.Adam(0.01), rank, model=make_stack())
    hvd.collective_stats(reset=True)
    sharded = train(
        keras.optimizers.Adam(0.01),
        rank,
        model=make_stack(),
        sharding="gradients",
        bucket_bytes=1024,
    )
    stats = hvd.collective_stats()
    results["buckets_scatters_per_step"] = stats["reducescatter"]["calls"] / STEPS
    # the updated weights come back in fused messages, not as one copy of the whole model
    results["buckets_gathers_per_step"] = stats["allgather"]["calls"] / STEPS
    plan = sharded.optimizer.inner_optimizer.plan
    fusion = basics.engine().config.fusion_threshold_bytes  # the test sets DDL_FUSION_THRESHOLD
    results["buckets_gathers_planned"] = len(gather_buckets(plan, fusion))
    results["buckets_weights"] = same(replicated.get_weights(), sharded.get_weights())
    results["buckets_state"] = same(state_of(replicated.optimizer), state_of(sharded.optimizer))

    # global_clipnorm: the norm of every variable's reduced gradient, not of this rank's
    clipped = lambda: keras.optimizers.AdamW(0.05, global_clipnorm=0.05)  # noqa: E731
    replicated = train(clipped(), rank)
    unclipped = train(keras.optimizers.AdamW(0.05), rank)
    results["clip_changes_training"] = not same(replicated.get_weights(), unclipped.get_weights())
    for sharding in shardings:
        sharded = train(clipped(), rank, sharding=sharding)
        results[f"clip_{sharding}"] = same(replicated.get_weights(), sharded.get_weights())
        results[f"clip_{sharding}_diff"] = worst(replicated.get_weights(), sharded.get_weights())

    # fp16 on the wire: the same compressed reduction either way
    fp16 = hvd.Compression.fp16
    replicated = train(keras.optimizers.Adam(0.01), rank, compression=fp16)
    for sharding in shardings:
        sharded = train(keras.optimizers.Adam(0.01), rank, compression=fp16, sharding=sharding)
        results[f"fp16_{sharding}"] = same(replicated.get_weights(), sharded.get_weights())
        results[f"fp16_{sharding}_diff"] = worst(replicated.get_weights(), sharded.get_weights())

    # a user's Horovod-style compressor: it transforms whole tensors, so ZeRO-2 stacks its rows
    replicated = train(keras.optimizers.Adam(0.01), rank, compression=CastToHalf())
    for sharding in shardings:
        options = {"compression": CastToHalf(), "sharding": sharding}
        sharded = train(keras.optimizers.Adam(0.01), rank, **options)
        results[f"wrapped_{sharding}"] = same(replicated.get_weights(), sharded.get_weights())

    # mixed precision: the loss-scale optimizer, the finiteness agreed by every rank
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        replicated = train(keras.optimizers.Adam(0.01), rank)
        results["mixed_type"] = type(replicated.optimizer).__name__
        for sharding in shardings:
            sharded = train(keras.optimizers.Adam(0.01), rank, sharding=sharding)
            results[f"mixed_{sharding}"] = same(replicated.get_weights(), sharded.get_weights())
            results[f"mixed_{sharding}_scale"] = float(sharded.optimizer.dynamic_scale.numpy())
            results[f"mixed_{sharding}_state"] = same(
                state_of(replicated.optimizer), state_of(sharded.optimizer)
            )
    finally:
        keras.mixed_precision.set_global_policy("float32")

    # a checkpoint written by every rank (rank 0's file), and the state it must hold
    model = train(keras.optimizers.AdamW(0.01), rank, sharding="gradients")
    path = Path(outdir) / "sharded.keras"
    hvd.save_model(model, path)
    expected = state_of(train(keras.optimizers.AdamW(0.01), rank).optimizer)
    if rank == 0:
        np.savez(Path(outdir) / "expected.npz", *expected)
        results["saved"] = path.exists()
    report(rank, results)


def differ_mode():
    """Ranks that build different variables: refused on every rank, and the engine still works."""
    rank = hvd.rank()
    results = {}
    cases = {
        "wider": ("gradients", make_model(wider=rank)),
        "deeper": ("optimizer", make_model(deeper=rank == 1)),
    }
    for label, (sharding, model) in cases.items():
        try:
            train(keras.optimizers.Adam(0.01), rank, model=model, sharding=sharding)
            results[label] = "trained"
        except ConfigError as err:
            results[label] = str(err)
    model = train(keras.optimizers.Adam(0.01), rank, sharding="gradients")
    results["then_trains"] = worst(model.get_weights(), make_model().get_weights()) > 1e-3
    report(rank, results)


def set_mode(pair):
    """Sharding over a process set: the set's ranks share the variables, the others train alone."""
    rank = hvd.rank()
    results = {"included": pair.included()}
    runs = {  # the clip norm's squares are gathered over the set under "gradients" only
        "adam": (lambda: keras.optimizers.Adam(0.01), ("optimizer", "gradients")),
        "clip": (lambda: keras.optimizers.AdamW(0.05, global_clipnorm=0.05), ("gradients",)),
    }
    for label, (make, shardings) in runs.items():
        replicated = train(make(), rank, process_set=pair)
        results[f"{label}_weights"] = [w.tolist() for w in replicated.get_weights()[-2:]]
        for sharding in shardings:
            sharded = train(make(), rank, process_set=pair, sharding=sharding)
            key = f"{label}_{sharding}"
            results.update(compare(key, replicated, sharded))
            if label == "adam":
                share = state_bytes(sharded.optimizer) / state_bytes(replicated.optimizer)
                results[f"share_{sharding}"] = share
    report(rank, results)


def save0_mode(outdir, then):
    """Save on rank 0 alone with sharding: every rank must fail at once, rank 0 naming the fix."""
    rank = hvd.rank()
    path = Path(outdir) / "rank0.keras"
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), sharding="gradients"),
        loss="mse",
    )
    x, y = data(rank)
    try:
        if then == "callback":
            callbacks = [keras.callbacks.ModelCheckpoint(path)] if rank == 0 else []
            model.fit(
                x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks
            )
        else:
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            if rank == 0:
                model.save(path)
            hvd.shutdown()
    except Exception as err:
        report(rank, {"error": type(err).__name__, "message": str(err)})
        raise
    report(rank, {"error": None})


def load_mode(outdir):
    rank = hvd.rank()
    results = {}
    path = Path(outdir) / "sharded.keras"
    saved = np.load(Path(outdir) / "expected.npz")
    expected = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    model = keras.models.load_model(path)
    optimizer = model.optimizer
    results["sharding"] = optimizer.sharding
    inner = optimizer.inner_optimizer
    layout = inner.replicated_layout()
    mine = {v.path.rsplit("/", 1)[-1]: np.asarray(v) for v in inner.shard_optimizer().variables}
    results["own_state_matches"] = all(
        np.array_equal(mine[p], expected[layout.index(p)]) for p in mine
    )
    results["own_variables"] = len(mine)
    results["gathered_matches"] = same(state_of(optimizer), expected)
    # one more step from the file, sharded and replicated, must agree
    x, y = data(rank)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    plain = keras.models.load_model(path, compile=False)
    plain.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(0.01)), loss="mse")
    plain.optimizer.build(plain.trainable_variables)
    for variable, value in zip(plain.optimizer.inner_optimizer.variables, expected, strict=True):
        variable.assign(value)
    plain.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    results["step_after_load"] = same(model.get_weights(), plain.get_weights())
    results["step_after_load_diff"] = worst(model.get_weights(), plain.get_weights())
    report(rank, results)


def offload_mode():
    """Sharding and offload together: each rank's share of the state on its host device.

    Two logical CPU devices per rank stand in for a GPU (``CPU:1``, the
    weights) and its host (``CPU:0``, this rank's share of AdamW's slots).
    """
    from tflms.keras import OffloadedOptimizer

    rank = hvd.rank()
    results = {}
    clipped = lambda: keras.optimizers.AdamW(0.01, global_clipnorm=0.05)  # noqa: E731
    with tf.device("/device:CPU:1"):
        replicated = train(clipped(), rank, model=make_model())
        for sharding in ("optimizer", "gradients"):
            offloaded = OffloadedOptimizer(clipped(), host_device="/device:CPU:0")
            model = train(offloaded, rank, model=make_model(), sharding=sharding)
            shard = model.optimizer.inner_optimizer.shard_optimizer()
            slots = [v for v in shard.variables if len(v.shape)]
            results[f"{sharding}_weights"] = same(replicated.get_weights(), model.get_weights())
            results[f"{sharding}_state"] = same(
                state_of(replicated.optimizer), state_of(model.optimizer)
            )
            results[f"{sharding}_slots_on_host"] = all(
                v.value.device.endswith("CPU:0") for v in slots
            )
            results[f"{sharding}_weights_on_device"] = all(
                v.value.device.endswith("CPU:1") for v in model.trainable_variables
            )
            results[f"{sharding}_share"] = state_bytes(model.optimizer) / state_bytes(
                replicated.optimizer
            )
    report(rank, results)


if __name__ == "__main__":
    mode, outdir, only = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "offload":  # a device and its host: two logical CPUs, before TensorFlow starts
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
        )
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair] if mode == "set" else None)
    if mode == "set":
        set_mode(pair)
    elif mode == "train":
        train_mode(outdir, only)
    elif mode == "save0":
        save0_mode(outdir, only[0])
    elif mode == "differ":
        differ_mode()
    elif mode == "offload":
        offload_mode()
    else:
        load_mode(outdir)
    hvd.shutdown()
