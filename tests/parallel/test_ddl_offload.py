"""tflms's model-state offload (optimizer state, streamed weights) under ddl_tf, on real ranks."""

from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "workers" / "offload_train.py"

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


@pytest.mark.parametrize("np_", [2, 4])
def test_offloaded_and_streamed_training_equals_plain_on_every_rank(mpirun, tmp_path, np_):
    outputs = mpirun(WORKER, np=np_, args=(), timeout=400).check().rank_outputs
    assert len(outputs) == np_
    assert outputs[0]["moved"] > 0
    for way in ("plain", "optimizer", "streamed", "budget"):
        for rank, out in enumerate(outputs):
            assert out[way]["bitwise"], (way, rank, out[way])
            assert out[way]["iterations"] == 8, (way, rank)
        assert len({out[way]["digest"] for out in outputs}) == 1, way  # replicas agree
    for out in outputs:
        assert not out["plain"]["state_on_host"] and not out["plain"]["weights_on_host"]
        assert out["optimizer"]["state_on_host"] and not out["optimizer"]["weights_on_host"]
        assert out["streamed"]["state_on_host"] and out["streamed"]["weights_on_host"]
        assert out["streamed"]["streamed"] >= 4  # every kernel and bias streamed in
        assert out["budget"]["state_on_host"]  # the budget moved it by itself
