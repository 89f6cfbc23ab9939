"""The Keras elastic state in one process: a commit is a snapshot that later training leaves alone."""

from __future__ import annotations

import keras
import numpy as np
import pytest

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


def _value(variable) -> np.ndarray:
    return keras.ops.convert_to_numpy(variable)


def _mlp(width: int = 3) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    return model


def test_a_relaunched_process_resumes_bitwise_from_the_commit_mirrored_in_host_memory(
    tmp_path, monkeypatch
):
    from ddl_tf.membership import mirror

    monkeypatch.setenv("DDL_ELASTIC_MIRROR", str(tmp_path / "mirror"))
    hvd.init()
    try:
        x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
        crashed = _mlp()
        crashed.fit(x, y, verbose=0)
        state = hvd.elastic.KerasState(crashed, batch=5, epoch=1)
        state.commit_count = 6
        mirror.write(state)  # what commit() does in a job launched by ddlrun
        committed = [_value(v) for v in crashed.variables + crashed.optimizer.variables]
        crashed.fit(x, y, verbose=0, epochs=2)  # trained on, never committed: lost in the crash
        (file,) = (tmp_path / "mirror").iterdir()
        assert file.name.endswith(".0.commit"), file.name  # host, index on it

        relaunched = _mlp()  # a new process builds the model again, optimizer unbuilt
        fresh = hvd.elastic.KerasState(relaunched, batch=0, epoch=0)
        assert not mirror.resume(fresh), "not a relaunch: nothing is resumed"
        monkeypatch.setenv("DDL_ELASTIC_RESUMED", "1")
        monkeypatch.setattr(mirror, "_resumed", False)
        assert mirror.resume(fresh)
        values = [_value(v) for v in relaunched.variables + relaunched.optimizer.variables]
        assert len(values) == len(committed)
        assert all(np.array_equal(a, b) for a, b in zip(committed, values, strict=True))
        assert (fresh.batch, fresh.epoch, fresh.commit_count) == (5, 1, 6)
        assert not mirror.resume(fresh), "once per process"

        monkeypatch.setattr(mirror, "_resumed", False)
        other = hvd.elastic.KerasState(_mlp(width=5), batch=0)
        with pytest.raises(mirror.MirrorError, match="must build the same model and optimizer"):
            mirror.resume(other)
    finally:
        hvd.shutdown()


def test_a_state_without_a_mirror_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    from ddl_tf.membership import mirror
    from ddl_tf.membership.state import State

    class Opaque(State):
        def save(self): ...
        def restore(self): ...
        def sync(self): ...

    monkeypatch.setenv("DDL_ELASTIC_MIRROR", str(tmp_path / "mirror"))
    hvd.init()
    try:
        mirror.write(Opaque(bcast_object=lambda o: o, get_rank=lambda: 0))
        assert not (tmp_path / "mirror").exists()
        assert "cannot be mirrored in host memory" in caplog.text
    finally:
        hvd.shutdown()
