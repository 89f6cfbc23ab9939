"""An elastic custom training loop, as Horovod's ``tensorflow2_mnist_elastic.py`` writes it.

A ``tf.function`` step traced once at module level (before ``elastic.run``),
``DistributedGradientTape``, ``TensorFlowKerasState`` committed every batch,
a reset callback. ``ELASTIC_OUT`` and ``ELASTIC_KILL`` (``launch_rank,batch``)
as in elastic_keras.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import ddl_tf.tensorflow as hvd

out = Path(os.environ["ELASTIC_OUT"])
launch_rank = int(os.environ.get("HOROVOD_RANK", "0"))
kill = os.environ.get("ELASTIC_KILL")
hvd.init()
keras.utils.set_random_seed(11)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
)
opt = keras.optimizers.Adam(0.001)
rng = np.random.default_rng(hvd.rank())  # each rank its own data, as in Horovod's example
x = tf.constant(rng.normal(size=(64, 8)), tf.float32)
y = tf.constant(rng.normal(size=(64, 1)), tf.float32)


@tf.function
def training_step(allreduce=True):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
    if allreduce:
        tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


training_step(allreduce=False)  # builds the optimizer's slots before the state is made
resets = []
sizes = []


@hvd.elastic.run
def train(state):
    for batch in range(state.batch, 30):  # Horovod writes `for state.batch in range(...)`
        state.batch = batch
        training_step()
        sizes.append((time.time(), hvd.size(), state.batch))
        if (
            kill
            and launch_rank == int(kill.split(",")[0])
            and state.batch == int(kill.split(",")[1])
        ):
            (out / "killed").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        state.commit()


state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
train(state)
weights = np.concatenate([np.asarray(v).ravel() for v in model.get_weights()])
(out / f"rank{launch_rank}.json").write_text(
    json.dumps({"size": hvd.size(), "weights": weights.tolist(), "resets": resets, "steps": sizes})
)
