"""The Keras elastic state in one process: a commit is a snapshot that later training leaves alone."""

from __future__ import annotations

import keras
import numpy as np

import ddl_tf.keras as hvd


def test_restore_brings_back_the_committed_model_and_optimizer_after_more_training():
    hvd.init()
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
        x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
        model.fit(x, y, verbose=0)
        state = hvd.elastic.KerasState(model, batch=0)
        state.commit()
        weights = [np.array(w) for w in model.get_weights()]
        slots = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
        model.fit(x, y, verbose=0, epochs=3)
        assert not all(
            np.array_equal(a, b) for a, b in zip(weights, model.get_weights(), strict=True)
        )
        state.restore()
        assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights(), strict=True))
        assert all(
            np.array_equal(a, np.array(b))
            for a, b in zip(slots, model.optimizer.variables, strict=True)
        )
    finally:
        hvd.shutdown()


def test_a_new_ranks_unbuilt_optimizer_is_built_before_its_slots_are_synced():
    hvd.init()
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
        assert not model.optimizer.built
        state = hvd.elastic.KerasState(model)
        state.sync()
        assert model.optimizer.built and len(model.optimizer.variables) > 2
    finally:
        hvd.shutdown()
