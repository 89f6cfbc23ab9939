"""Keras 3 parity: callbacks on unbuilt models, local layers and variables, elastic state, SyncBN."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd
import ddl_tf.keras as hvd_keras


def same_on_every_rank(arrays) -> bool:
    mine = [np.asarray(a).tobytes() for a in arrays]
    everyone = hvd.allgather_object(mine)
    return all(theirs == everyone[0] for theirs in everyone)


def data(rank: int, n: int = 32):
    rng = np.random.default_rng(100 + rank)  # every rank its own shard
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x @ np.arange(6.0)[:, None] > 0).astype("float32")


def test_broadcast_callback_on_a_model_built_in_its_first_step(rank, size):
    keras.utils.set_random_seed(rank)  # different initial weights on every rank
    model = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    assert not model.built
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)
    x, y = data(rank)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert callback.broadcast_done
    assert same_on_every_rank(model.get_weights())
    assert same_on_every_rank([v.numpy() for v in model.optimizer.variables])


def test_partial_optimizer_and_local_variables_keep_a_layer_per_rank(rank, size):
    keras.utils.set_random_seed(rank)
    local = keras.layers.Dense(4, name="local")
    model = keras.Sequential([keras.Input((6,)), local, keras.layers.Dense(1, name="shared")])
    opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[local])
    model.compile(optimizer=opt, loss="mse")
    initial_local = [w.numpy().copy() for w in local.trainable_weights]
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
        0, local_variables=local.trainable_weights
    )
    x, y = data(rank)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    shared = model.get_layer("shared").get_weights()
    assert same_on_every_rank(shared), "shared layer: averaged gradients from equal weights"
    assert not same_on_every_rank(local.get_weights()), "local layer: each rank its own"
    moved = [
        not np.allclose(a, w.numpy())
        for a, w in zip(initial_local, local.trainable_weights, strict=True)
    ]
    assert all(moved), "local weights were trained, not overwritten by the broadcast"


def test_partial_distributed_optimizer_scales_local_gradients_by_size(rank, size):
    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    layer.build((None, 1))
    opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=layer)
    grad = tf.constant([[float(rank + 1)]])
    opt.apply([grad], layer.trainable_weights)
    np.testing.assert_allclose(layer.kernel.numpy(), [[-(rank + 1) / size]])
    with pytest.raises(ValueError, match="Keras layers"):
        hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[object()])


def test_partial_distributed_gradient_tape_splits_local_and_global(rank, size):
    keras.utils.set_random_seed(rank)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    x, y = data(rank, 8)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    plain = tape.gradient(loss, model.trainable_variables)
    wrapped = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[0])
    local, shared = wrapped.get_local_and_global_gradients(loss, model.trainable_variables)
    assert [v.path for v, _ in local] == [v.path for v in model.layers[0].trainable_weights]
    for (_, grad), mine in zip(local, plain[:2], strict=True):
        np.testing.assert_allclose(grad.numpy(), mine.numpy() / size, rtol=1e-6)
    assert same_on_every_rank([g.numpy() for _, g in shared])
    grads = wrapped.gradient(loss, model.trainable_variables, use_generic_names=True)
    assert len(grads) == 4


def test_elastic_tensorflow_state_commit_restore_sync(rank, size):
    variables = [tf.Variable(np.full((2, 2), float(rank + 1))), tf.Variable([rank, rank])]
    state = hvd.elastic.TensorFlowState(variables, batch=10 + rank, epoch=rank)
    state.sync()
    assert (state.batch, state.epoch) == (10, 0)
    np.testing.assert_array_equal(variables[0].numpy(), np.ones((2, 2)))
    variables[0].assign(np.full((2, 2), 7.0))
    state.batch = 11
    state.restore()
    assert state.batch == 10 and variables[0].numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    variables[0].assign(np.full((2, 2), 5.0))
    state.batch = 12
    state.commit()
    state.restore()
    assert state.batch == 12 and float(variables[0][0, 0]) == 5.0

    calls = []

    @hvd.elastic.run
    def train(state, step):
        calls.append((state.batch, step))
        return step * 2

    assert train(state, 3) == 6 and calls == [(12, 3)]


def test_keras_elastic_state_and_callbacks(rank, size):
    keras.utils.set_random_seed(rank)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    state = hvd_keras.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()
    assert same_on_every_rank(model.get_weights())
    callbacks = [
        hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=2),
        hvd_keras.elastic.UpdateBatchStateCallback(state),
        hvd_keras.elastic.UpdateEpochStateCallback(state),
    ]
    x, y = data(rank)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
    assert (state.epoch, state.batch) == (2, 0)
    trained = model.get_weights()
    model.set_weights([np.zeros_like(w) for w in trained])
    state.restore()  # the last commit was at the end of epoch 2
    for a, b in zip(model.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="built model"):
        hvd_keras.elastic.KerasState(keras.Sequential([keras.layers.Dense(1)]))


def test_sync_batch_norm_uses_the_global_batch_statistics(rank, size):
    rng = np.random.default_rng(7)
    full = rng.normal(size=(4 * size, 3)).astype("float32") * 3 + 1
    mine = full[4 * rank : 4 * (rank + 1)]
    reference = keras.layers.BatchNormalization(axis=1)
    synced = hvd.SyncBatchNormalization(axis=1)
    expected = reference(full, training=True).numpy()[4 * rank : 4 * (rank + 1)]
    got = synced(mine, training=True).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        synced.moving_mean.numpy(), reference.moving_mean.numpy(), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        synced.moving_variance.numpy(), reference.moving_variance.numpy(), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=True)
