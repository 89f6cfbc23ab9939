"""Model state on the host (tflms's offload) under ddl_tf's data parallelism, on real ranks.

Two logical CPU devices per rank stand in for a GPU (``CPU:1``) and its host
(``CPU:0``): both run the same kernels, so every way of training below must
give each rank plain training's weights bit for bit. Every rank trains the
same model from the same weights on its own data with
``DistributedOptimizer(AdamW)``:

* ``plain``: everything on the device, no LMS;
* ``optimizer``: ``LMSCallback(offload_optimizer=True)``: the state and the
  update on the host, the reduced gradients crossing to it;
* ``streamed``: the model built inside ``weights_on_host`` and
  ``LMSCallback(offload_weights=True)``: the weights streamed to the device
  ahead of each use, the state and the update next to them;
* ``budget``: ``LMSCallback(memory_budget=...)`` alone, too small for the
  weights, their gradients and the state on the device: the callback builds
  the state on the host by itself.

Each rank reports, per way, whether its weights equal plain training's, a
digest of them (the replicas must agree), where the optimizer state lives and
the plan's streamed weights.
"""

import hashlib

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.keras as hvd
import tflms
from tests.parallel.workers.common import report
from tflms.keras import weights_on_host

DEVICE, HOST = "/device:CPU:1", "/device:CPU:0"
FEATURES, BATCH, STEPS = 64, 8, 4


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(256, activation="gelu"),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def data(rank):
    rng = np.random.default_rng(10 + rank)
    x = rng.normal(size=(BATCH * STEPS, FEATURES)).astype("float32")
    return x, rng.normal(size=(BATCH * STEPS, 1)).astype("float32")


def train(rank, way):
    if way == "streamed":
        with weights_on_host(HOST):
            model = make_model()
    else:
        with tf.device(DEVICE):
            model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(0.01)), loss="mse")
    options = dict(device=DEVICE, host_device=HOST, batch_size=BATCH)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if way == "optimizer":
        callbacks.append(tflms.LMSCallback(offload_optimizer=True, **options))
    elif way == "streamed":
        callbacks.append(tflms.LMSCallback(offload_weights=True, **options))
    elif way == "budget":  # weights 0.35 MiB: with gradients and AdamW's state, 1.4 MiB
        callbacks.append(tflms.LMSCallback(memory_budget=1 << 20, safety_margin=0.0, **options))
    x, y = data(rank)
    with tf.device(DEVICE):
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return model, callbacks[-1]


def main():
    hvd.init()
    rank = hvd.rank()
    plain, _ = train(rank, "plain")
    weights = plain.get_weights()
    initial = make_model().get_weights()
    results = {
        "moved": float(max(np.abs(a - b).max() for a, b in zip(weights, initial, strict=True)))
    }
    for way in ("plain", "optimizer", "streamed", "budget"):
        model, callback = train(rank, way)
        mine = model.get_weights()
        state = [v for v in model.optimizer.variables if len(v.shape)]
        results[way] = {
            "bitwise": all(np.array_equal(a, b) for a, b in zip(weights, mine, strict=True)),
            "digest": hashlib.sha256(b"".join(w.tobytes() for w in mine)).hexdigest(),
            "state_on_host": all(v.value.device.endswith("CPU:0") for v in state),
            "weights_on_host": all(v.value.device.endswith("CPU:0") for v in model.weights),
            "iterations": int(model.optimizer.iterations.numpy()),
            "streamed": sum(1 for s in callback.plan.swaps if s.streamed)
            if isinstance(callback, tflms.LMSCallback)
            else 0,
        }
    report(rank, results)
    hvd.shutdown()


if __name__ == "__main__":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    main()
