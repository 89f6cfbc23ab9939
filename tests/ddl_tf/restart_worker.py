"""A KerasHub-like causal LM, and the rank program of the resume tests (tests/ddl_tf/test_restart.py).

KerasHub itself cannot be installed next to this TensorFlow (it pulls a
second TensorFlow wheel), so :class:`TinyCausalLM` behaves as its
``CausalLM`` does where checkpoints are concerned: a functional model
subclass whose ``__init__`` compiles it and whose ``compile(optimizer="auto",
...)`` picks ``Adam(2e-5)``; Keras's loader then skips the saved compile
settings. Dropout layers make the run depend on the random generators.

Run under mpirun (``DDL_TEST_OUTDIR`` set by tests/harness.py)::

    python restart_worker.py train DIR    # the uninterrupted run, and the first part with a checkpoint
    python restart_worker.py resume DIR   # rank 0 loads the checkpoint, every rank trains on

Each rank reports whether its final weights and optimizer state equal the
uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import os
import sys

import keras
import numpy as np

SEQ, VOCAB, WIDTH = 8, 50, 16
EPOCHS, RESUME_AT = 4, 2


@keras.saving.register_keras_serializable(package="ddl_tf_tests")
class TinyCausalLM(keras.Model):
    """Embedding, Dropout, Dense, Dropout, Dense: a causal LM's shape, KerasHub's compile."""

    def __init__(self, dropout: float = 0.3, compile: bool = True, **kwargs) -> None:  # noqa: A002
        tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
        x = keras.layers.Embedding(VOCAB, WIDTH)(tokens)
        x = keras.layers.Dropout(dropout)(x)
        x = keras.layers.Dense(WIDTH, activation="relu")(x)
        x = keras.layers.Dropout(dropout)(x)
        logits = keras.layers.Dense(VOCAB)(x)
        super().__init__(inputs=tokens, outputs=logits, **kwargs)
        self.dropout = dropout
        if compile:  # KerasHub's Task.__init__ compiles with the defaults
            self.compile()

    def compile(self, optimizer="auto", loss="auto", **kwargs) -> None:
        """KerasHub's ``CausalLM.compile``: ``"auto"`` means ``Adam(2e-5)`` and its LM loss."""
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(2e-5)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def get_config(self) -> dict:
        return {"dropout": self.dropout, "name": self.name}


def data(rank: int = 0, size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Next-token pairs, the same on every rank before each takes its shard."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, (128, SEQ + 1)).astype("int32")
    return tokens[rank::size, :-1], tokens[rank::size, 1:]


def steps_per_epoch(size: int = 1) -> int:
    """Optimizer steps per epoch on each of ``size`` ranks (batches of 16)."""
    return len(data(0, size)[0]) // 16


def fresh_model(distributed) -> TinyCausalLM:
    """The model every run starts from (same weights and Dropout seeds), compiled as trained."""
    keras.utils.set_random_seed(7)
    model = TinyCausalLM()
    model.compile(optimizer=distributed(keras.optimizers.AdamW(1e-2)), jit_compile=False)
    return model


def fit(model, hvd, first: int, last: int, callbacks=()) -> None:
    """Train epochs ``first..last-1`` on this rank's shard, in order (no shuffle)."""
    x, y = data(hvd.rank(), hvd.size())
    model.fit(
        x,
        y,
        batch_size=16,
        initial_epoch=first,
        epochs=last,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks],
    )


def state(model) -> list[np.ndarray]:
    """The weights, then the optimizer's variables (iterations and AdamW's moments)."""
    return [*model.get_weights(), *(np.asarray(v) for v in model.optimizer.variables)]


def main(phase: str, workdir: str) -> None:
    import ddl_tf.keras as hvd
    from tests.parallel.workers.common import report

    hvd.init()
    rank = hvd.rank()
    checkpoint = os.path.join(workdir, "checkpoint.keras")
    reference = os.path.join(workdir, f"uninterrupted_rank{rank}.npz")
    if phase == "train":
        whole = fresh_model(hvd.DistributedOptimizer)
        fit(whole, hvd, 0, EPOCHS)
        np.savez(reference, *state(whole))
        first = fresh_model(hvd.DistributedOptimizer)
        saves = [keras.callbacks.ModelCheckpoint(checkpoint)] if rank == 0 else []
        fit(first, hvd, 0, RESUME_AT, saves)
        report(rank, {"iterations": int(first.optimizer.iterations.numpy())})
        return
    # Horovod's recipe: rank 0 loads the checkpoint, the others build the model, and
    # BroadcastGlobalVariablesCallback hands them rank 0's weights, optimizer and random state
    if rank == 0:
        model = hvd.load_model(checkpoint)
    else:
        model = fresh_model(hvd.DistributedOptimizer)
    restored = (type(model.optimizer).__name__, int(model.optimizer.iterations.numpy()))
    fit(model, hvd, RESUME_AT, EPOCHS)
    expected = list(np.load(reference).values())
    got = state(model)
    report(
        rank,
        {
            "restored": restored,
            "arrays": [len(expected), len(got)],
            "equal": [bool(np.array_equal(a, b)) for a, b in zip(expected, got, strict=False)],
            "iterations": int(model.optimizer.iterations.numpy()),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
