"""TensorFlow bridge: eager and tf.function collectives, gradients, and program-order execution."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("np_", [2, 3])
def test_tf_collectives_gradients_and_ordering(mpirun, np_):
    result = mpirun(WORKERS / "tf_ops.py", np=np_, timeout=240).check()
    assert [o["failures"] for o in result.rank_outputs] == [[]] * np_
