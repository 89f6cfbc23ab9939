"""Fine-tune a GPT-2-style decoder with its model state off the device, on several ranks.

Everything that is not an activation leaves the GPU:

* the weights live on the host (``tflms.keras.weights_on_host``) and are
  streamed in ahead of each use (``LMSCallback(offload_weights=True)``);
* AdamW's state lives on the host and is updated there (``OffloadedOptimizer``);
* and it is sharded across the ranks (``DistributedOptimizer(...,
  sharding="optimizer")``, ZeRO-1): each rank's host holds 1/N of it.

Run::

    ddlrun -np 2 examples/model_state.py [--steps 8] [--layers 2 --dim 128]

Synthetic tokens, so nothing is downloaded. Without a GPU the CPU is split
into two logical devices, ``CPU:1`` standing in for the GPU and ``CPU:0`` for
its host (as the tests do); on a GPU node the device is ``GPU:0`` of each
rank's visible GPUs.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

HOST = "/device:CPU:0"
if tf.config.list_physical_devices("GPU"):
    DEVICE = "/device:GPU:0"
else:  # the stand-in: before anything starts TensorFlow's devices
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    DEVICE = "/device:CPU:1"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ddl_tf.keras as hvd  # noqa: E402
import tflms  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.keras import OffloadedOptimizer, weights_on_host  # noqa: E402
from tflms.utils.devices import same_device  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per rank")
    parser.add_argument("--batch-size", type=int, default=4, help="per rank")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--sharding", default="optimizer", choices=["optimizer", "gradients"])
    args = parser.parse_args()

    hvd.init()
    with weights_on_host(HOST):  # every weight is made on the host
        model = zoo.gpt2(
            vocab=args.vocab, seq=args.seq, dim=args.dim, heads=4, layers=args.layers, seed=1
        )
    optimizer = hvd.DistributedOptimizer(
        OffloadedOptimizer(keras.optimizers.AdamW(1e-3), host_device=HOST),
        sharding=args.sharding,
    )
    model.compile(optimizer=optimizer, loss=model.loss, jit_compile=False)

    rng = np.random.default_rng(hvd.rank())  # each rank its own shard of the data
    tokens = rng.integers(0, args.vocab, size=(args.steps * args.batch_size, args.seq + 1))
    x, y = tokens[:, :-1].astype("int32"), tokens[:, 1:].astype("int32")
    lms = tflms.LMSCallback(
        device=DEVICE, host_device=HOST, batch_size=args.batch_size, offload_weights=True
    )
    with tf.device(DEVICE):
        history = model.fit(
            x, y, batch_size=args.batch_size, epochs=2, shuffle=False, verbose=0, callbacks=[lms]
        )

    plan = lms.plan
    streams = [s for s in plan.swaps if s.streamed]
    state = sum(v.numpy().nbytes for v in optimizer.variables if len(v.shape))
    replicated = 8 * sum(int(np.prod(w.shape)) for w in model.trainable_weights)  # AdamW: m, v
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    gathered = hvd.allgather(weights[None, :]).numpy()
    states = hvd.allgather(np.array([[state]], dtype="int64")).numpy().ravel()
    if hvd.rank() == 0:
        on_host = all(same_device(w.value.device, HOST) for w in model.weights)
        print(f"ranks: {hvd.size()}, device {DEVICE}, host {HOST}")
        print(
            f"weights on the host: {on_host}; {len(streams)} streamed by the plan, "
            f"{sum(len(s.swap_ins) for s in streams)} copies in per step"
        )
        print(
            "AdamW state per rank (bytes, on the host): "
            + ", ".join(str(int(b)) for b in states)
            + f" of {replicated} replicated"
        )
        losses = history.history["loss"]
        print(f"loss per epoch ({args.steps} steps each): {losses[0]:.4f} -> {losses[-1]:.4f}")
        same = all(np.array_equal(gathered[0], w) for w in gathered)
        print(f"weights identical on all ranks: {same}")


if __name__ == "__main__":
    main()
