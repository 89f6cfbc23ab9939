"""A Horovod Keras training script, written the way Horovod's Keras guide says to.

This file imports Horovod and is never run as is (Horovod does not build on
TensorFlow 2.21). The test replaces exactly its import line with
``import ddl_tf.keras as hvd`` and runs the result under ``ddlrun`` and under
plain ``mpirun``. The recipe: init, pin a GPU per local rank, shard the data
by rank, scale the learning rate by the number of workers, wrap the optimizer,
broadcast initial variables from rank 0, average metrics, warm up the
learning rate, checkpoint on rank 0 only, resume from the last checkpoint.
"""

import argparse
import json
import os

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="Keras synthetic classification with Horovod")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--base-lr", type=float, default=0.01)
parser.add_argument("--warmup-epochs", type=float, default=2)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
parser.add_argument("--summary", default=None, help="write a JSON summary per rank here")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Synthetic data (the same on every worker), then each worker takes its shard.
rng = np.random.default_rng(42)
centers = rng.normal(size=(10, 20)) * 3
labels = rng.integers(0, 10, size=512)
features = (centers[labels] + rng.normal(size=(512, 20))).astype("float32")
x_train = features[hvd.rank() :: hvd.size()]
y_train = labels[hvd.rank() :: hvd.size()]

checkpoint_format = os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")

# If set > 0, will resume training from a given checkpoint.
resume_from_epoch = 0
for try_epoch in range(args.epochs, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break

# Horovod: broadcast resume_from_epoch from rank 0 (which will have
# checkpoints) to other ranks.
resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))

# Horovod: print logs on the first worker.
verbose = 2 if hvd.rank() == 0 else 0

# Restore from a previous checkpoint, if initial_epoch is specified.
# Horovod: restore on the first worker which will broadcast weights to other workers.
if resume_from_epoch > 0 and hvd.rank() == 0:
    model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch))
else:
    model = keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    # Horovod: adjust learning rate based on number of workers.
    opt = keras.optimizers.SGD(learning_rate=args.base_lr * hvd.size(), momentum=0.9)
    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    # Note: This callback must be in the list before the ReduceLROnPlateau,
    # TensorBoard, or other metrics-based callbacks.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first few epochs.
    hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=args.base_lr * hvd.size(), warmup_epochs=args.warmup_epochs, verbose=verbose
    ),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))

history = model.fit(
    x_train,
    y_train,
    batch_size=args.batch_size,
    callbacks=callbacks,
    epochs=args.epochs,
    initial_epoch=resume_from_epoch,
    verbose=verbose,
)

# Horovod: average the evaluation over workers.
score = hvd.allreduce(model.evaluate(x_train, y_train, verbose=0))
if verbose:
    print("Test loss:", float(score[0]), "accuracy:", float(score[1]))

if args.summary:
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    os.makedirs(args.summary, exist_ok=True)
    with open(os.path.join(args.summary, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(
            {
                "rank": hvd.rank(),
                "size": hvd.size(),
                "resumed_from": resume_from_epoch,
                "checkpointing": hvd.rank() == 0,
                "history": history.history,
                "score": [float(s) for s in np.asarray(score)],
                "weights": weights.tolist(),
            },
            f,
        )
