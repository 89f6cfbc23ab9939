"""Data-parallel Keras 3 training with ddl_tf (the Horovod recipe, one import changed).

Run it on 4 ranks, pretending they sit on 2 nodes so that the hierarchical
allreduce has two levels even on one machine::

    ddlrun -np 4 --pseudo-nodes 2 --algo hierarchical examples/ddl_tf_keras.py

Synthetic data, so nothing is downloaded.
"""

import argparse
import logging

import keras
import numpy as np

import ddl_tf.keras as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.01)
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("ddl_tf").setLevel(logging.INFO)

    hvd.init()

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 32)) * 2
    labels = rng.integers(0, 10, size=4096)
    features = (centers[labels] + rng.normal(size=(4096, 32))).astype("float32")
    x, y = features[hvd.rank() :: hvd.size()], labels[hvd.rank() :: hvd.size()]

    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=args.base_lr * hvd.size(), momentum=0.9)
    )
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=args.base_lr * hvd.size(), warmup_epochs=1
        ),
    ]
    history = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    gathered = hvd.allgather(weights[None, :]).numpy()
    if hvd.rank() == 0:
        same = all(np.array_equal(gathered[0], w) for w in gathered)
        print(
            f"ranks: {hvd.size()}, final loss {history.history['loss'][-1]:.4f}, weights identical on all ranks: {same}"
        )


if __name__ == "__main__":
    main()
