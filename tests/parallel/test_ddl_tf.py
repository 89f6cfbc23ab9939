"""TensorFlow bridge: eager and tf.function collectives, gradients, and program-order execution."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


# The worker is written for any size (expected values computed from hvd.size()); what
# differs between sizes is the engine's algorithm, checked against numpy on 2, 3, 4 and 8
# ranks by test_ddl_algorithms.py. 3 ranks (uneven shards, no power of two) stays in
# `make test`; 2 ranks is a benchmark-tier repeat (`make bench`).
@pytest.mark.parametrize("np_", [pytest.param(2, marks=pytest.mark.bench), 3])
def test_tf_collectives_gradients_and_ordering(mpirun, np_):
    result = mpirun(WORKERS / "tf_ops.py", np=np_, timeout=240).check()
    assert [o["failures"] for o in result.rank_outputs] == [[]] * np_
