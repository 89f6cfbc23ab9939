"""Adasum under real mpirun: the engine against a numpy reference of the tree (2, 4, 8 ranks,
float16/32/64, fp16 compression, process sets, the hierarchical form), then the TensorFlow
and Keras API on 4 ranks (op=hvd.Adasum, DistributedGradientTape, DistributedOptimizer) and
convergence of a small model next to Average."""

from pathlib import Path

import numpy as np
import pytest

from tests.tolerances import EPS16, EPS32, EPS64

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def bound(eps: float, size: int) -> float:
    """Relative error allowed: each of the log2(size) levels rounds the combined tensor to the
    dtype once and its coefficients (float64) carry the dtype's rounding of the inputs' dot
    products; 8 roundings per level of up to eps/2, on values of the reference's magnitude."""
    return 8 * max(1, int(np.log2(size))) * eps


@pytest.mark.parametrize("np_", [2, 4, 8])
def test_adasum_matches_a_numpy_tree_on_every_rank(mpirun, np_):
    result = mpirun(WORKERS / "adasum_core.py", np=np_, args=["flat"], timeout=240).check()
    out = result.rank_outputs
    assert len(out) == np_
    for dtype, eps in (("float16", EPS16), ("float32", EPS32), ("float64", EPS64)):
        for o in out:
            assert o[dtype]["error"] <= bound(eps, np_), (dtype, o[dtype])
            assert o[dtype]["dtypes"] == [dtype] and o[dtype]["shapes"], o[dtype]
        assert len({o[dtype]["digest"] for o in out}) == 1, dtype  # bitwise equal on all ranks
    for o in out:
        assert o["fp16_compression"]["dtype"] == "float32", o
        assert o["fp16_compression"]["error"] <= bound(EPS16, np_), o
        assert o["orthogonal_sum"], o  # orthogonal tensors: the sum
        assert np.allclose(o["parallel"], 2 + (np_ - 1) / 2, rtol=1e-12), o  # parallel: mean
    if np_ == 4:
        for o in out:
            assert o["set_error"] <= bound(EPS64, 2), o
        assert [o.get("three") for o in out] == [True, True, True, None]


def test_hierarchical_adasum_averages_in_nodes_then_combines_across(mpirun):
    env = {"DDL_PSEUDO_NODES": "2", "DDL_ALLREDUCE_ALGO": "hierarchical"}
    result = mpirun(
        WORKERS / "adasum_core.py", np=4, args=["hierarchical"], env=env, timeout=240
    ).check()
    out = result.rank_outputs
    assert [(o["form"], o["nodes"]) for o in out] == [("HierarchicalAdasum", 2)] * 4
    for dtype, eps in (("float32", EPS32), ("float64", EPS64)):
        for o in out:
            assert o[dtype]["error"] <= bound(eps, 4), (dtype, o[dtype])
        assert len({o[dtype]["digest"] for o in out}) == 1, dtype


def test_adasum_through_the_tensorflow_and_keras_api(mpirun):
    result = mpirun(WORKERS / "adasum_tf.py", np=4, timeout=300).check()
    out = result.rank_outputs
    assert len(out) == 4
    for o in out:
        assert o["eager"] <= bound(EPS32, 4) and o["traced"] <= bound(EPS32, 4), o
        assert o["fp16"][0] == "float32" and o["fp16"][1] <= bound(EPS16, 4), o
        assert o["first_step"] <= 1e-12, o  # the tape's gradients: the numpy tree of every rank's
        assert o["set_tape"] <= 1e-12, o  # members of {1, 3}: their Adasum; 0 and 2: their own
        losses = o["losses"]
        # convergence next to Average: both reach under 2% of the starting loss
        assert losses["adasum"] < 0.02 * losses["initial"], losses
        assert losses["average"] < 0.02 * losses["initial"], losses
        assert o["keras_loss"][-1] < o["keras_loss"][0], o
    assert len({o["weights"] for o in out}) == 1 and len({o["keras_weights"] for o in out}) == 1
    print("adasum vs average losses:", out[0]["losses"])
