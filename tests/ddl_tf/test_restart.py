"""Restarting loses nothing: the saved optimizer and the random state come back (issue 45).

The model is KerasHub-like (tests/ddl_tf/restart_worker.py): its class
compiles itself with ``Adam(2e-5)``, so ``keras.models.load_model`` skips the
saved compile settings and drops the optimizer's variables.
"""

import warnings
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest

import ddl_tf.keras as hvd
from ddl_tf.errors import RestoreError
from ddl_tf.keras.random_state import random_state_variables
from tests.ddl_tf.restart_worker import (
    EPOCHS,
    RESUME_AT,
    TinyCausalLM,
    fit,
    fresh_model,
    state,
    steps_per_epoch,
)

WORKER = Path(__file__).parent / "restart_worker.py"


@pytest.fixture
def ddl():
    hvd.init()
    yield hvd
    hvd.shutdown()


def _checkpointed(tmp_path, epochs=RESUME_AT) -> tuple[keras.Model, Path]:
    model = fresh_model(hvd.DistributedOptimizer)
    path = tmp_path / "checkpoint.keras"
    fit(model, hvd, 0, epochs, [keras.callbacks.ModelCheckpoint(path)])
    return model, path


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_keras_alone_loses_the_optimizer_of_a_model_that_compiles_itself(ddl, tmp_path):
    trained, path = _checkpointed(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = keras.models.load_model(path)
    assert type(plain.optimizer).__name__ == "Adam" and int(plain.optimizer.iterations) == 0
    assert any("Skipping variable loading" in str(w.message) for w in caught)
    # the file does hold the state: config.json names the optimizer, the weights hold its variables
    with zipfile.ZipFile(path) as archive:
        assert b'"DistributedOptimizer"' in archive.read("config.json")
    assert int(trained.optimizer.iterations) == RESUME_AT * steps_per_epoch()


def test_load_model_restores_the_saved_optimizer_with_its_state(ddl, tmp_path):
    trained, path = _checkpointed(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = hvd.load_model(path)
    optimizer = loaded.optimizer
    assert isinstance(optimizer, hvd.DistributedOptimizer)
    assert isinstance(optimizer.inner_optimizer, keras.optimizers.AdamW)
    assert optimizer.inner_optimizer.get_config() == trained.optimizer.inner_optimizer.get_config()
    assert int(optimizer.iterations) == RESUME_AT * steps_per_epoch()
    assert _same(state(loaded), state(trained))  # weights, iterations, both moments
    assert _same(  # and the Dropout generators' state
        [np.asarray(v) for v in random_state_variables(loaded)],
        [np.asarray(v) for v in random_state_variables(trained)],
    )
    # Keras's warnings about the optimizer it dropped are not passed on: it was restored
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]


def test_a_resumed_run_equals_the_uninterrupted_one_bitwise_dropout_included(ddl, tmp_path):
    whole = fresh_model(hvd.DistributedOptimizer)
    fit(whole, hvd, 0, EPOCHS)
    _, path = _checkpointed(tmp_path)
    resumed = hvd.load_model(path)
    fit(resumed, hvd, RESUME_AT, EPOCHS)
    assert _same(state(resumed), state(whole))
    # the same resume with the generators started afresh (what a checkpoint without the
    # random state gives) is another run: Dropout's masks are part of what must be restored
    again = hvd.load_model(path)
    for variable in random_state_variables(again):
        variable.assign(np.asarray([12345, 0], dtype=variable.dtype))
    fit(again, hvd, RESUME_AT, EPOCHS)
    assert not _same(again.get_weights(), whole.get_weights())


class IgnoresTheOptimizer(TinyCausalLM):
    """A compile that always uses its own optimizer: the saved one cannot be put back."""

    def compile(self, optimizer="auto", loss="auto", **kwargs) -> None:
        super().compile(optimizer="auto", loss=loss, **kwargs)


class NarrowCompile(TinyCausalLM):
    """A compile that takes none of Keras's arguments."""

    def compile(self, learning_rate: float = 2e-5) -> None:  # type: ignore[override]
        keras.Model.compile(
            self,
            keras.optimizers.Adam(learning_rate),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (
            IgnoresTheOptimizer,
            "made Adam(learning_rate=2e-05) instead of the optimizer it was given",
        ),
        (NarrowCompile, "does not take the saved compile arguments"),
    ],
)
def test_a_model_the_saved_optimizer_cannot_be_restored_into_is_refused_with_the_route(
    ddl, tmp_path, cls, why
):
    keras.utils.set_random_seed(7)
    model = cls()
    keras.Model.compile(
        model,
        optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(1e-2)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    path = tmp_path / "model.keras"
    fit(model, hvd, 0, 1, [keras.callbacks.ModelCheckpoint(path)])
    objects = {cls.__name__: cls}
    with pytest.raises(RestoreError) as refused:
        hvd.load_model(path, custom_objects=objects)
    message = str(refused.value)
    assert "was saved with DistributedOptimizer(AdamW(learning_rate=0.01))" in message
    assert why in message and "model.load_weights(" in message and "optimizer.build" in message
    # the route the message gives restores everything
    rebuilt = hvd.load_model(path, custom_objects=objects, compile=False)
    keras.Model.compile(
        rebuilt,
        optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(1e-2)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    rebuilt.optimizer.build(rebuilt.trainable_variables)
    hvd.keep_random_state(rebuilt)
    rebuilt.load_weights(path)
    assert _same(state(rebuilt), state(model))
    assert _same(
        [np.asarray(v) for v in random_state_variables(rebuilt)],
        [np.asarray(v) for v in random_state_variables(model)],
    )


def test_a_file_saved_by_plain_keras_code_still_loads_everywhere(ddl, tmp_path):
    # the random state is a plain Keras saving hook: Keras alone loads such a file
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dropout(0.5), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=1, verbose=0)
    hvd.save_model(model, tmp_path / "m.keras")
    plain = keras.models.load_model(tmp_path / "m.keras")
    assert int(plain.optimizer.iterations) == 1
    loaded = hvd.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, hvd.DistributedOptimizer)
    assert _same(
        [np.asarray(v) for v in random_state_variables(loaded)],
        [np.asarray(v) for v in random_state_variables(model)],
    )


@pytest.mark.parallel
def test_a_resumed_two_rank_run_equals_the_uninterrupted_one_bitwise(mpirun, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    mpirun(WORKER, np=2, args=["train", str(workdir)], timeout=240).check()
    result = mpirun(WORKER, np=2, args=["resume", str(workdir)], timeout=240).check()
    rank0, rank1 = result.rank_outputs
    assert rank0["restored"] == ["DistributedOptimizer", RESUME_AT * steps_per_epoch(2)], rank0
    steps = EPOCHS * steps_per_epoch(2)
    for out in (rank0, rank1):
        assert out["iterations"] == steps, out
        assert out["arrays"][0] == out["arrays"][1] and all(out["equal"]), out
