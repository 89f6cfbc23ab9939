"""Every allreduce algorithm x dtype x op x size against numpy, on real ranks and pseudo-node layouts."""

import json
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel

RACKS = {
    "levels": ["node", "rack"],
    "groups": {"rack": {"r0": ["n0", "n1"], "r1": ["n2", "n3"]}},
    "algorithms": {"node": "ring", "rack": "asa", "world": "ring"},
}


@pytest.mark.parametrize(
    ("np_", "env", "steps"),
    [
        pytest.param(2, {}, ["node", "world"], id="2-ranks"),
        pytest.param(3, {}, ["node", "world"], id="3-ranks-one-node"),
        pytest.param(4, {"DDL_PSEUDO_NODES": "2"}, ["node", "world"], id="4-ranks-2x2-pseudo"),
        pytest.param(
            8,
            {"DDL_PSEUDO_NODES": "n0,n0,n1,n1,n2,n2,n3,n3", "DDL_TOPOLOGY_FILE": "racks.json"},
            ["node", "rack", "world"],
            id="8-ranks-node-rack-world",
        ),
    ],
)
def test_algorithms_match_numpy_and_agree_bitwise(mpirun, tmp_path, np_, env, steps):
    if "DDL_TOPOLOGY_FILE" in env:
        (tmp_path / "racks.json").write_text(json.dumps(RACKS))
        env = {**env, "DDL_TOPOLOGY_FILE": str(tmp_path / "racks.json")}
    args = ["0,1,2,7,1000,4099"] if np_ == 8 else []
    result = mpirun(WORKERS / "algorithms.py", np=np_, env=env, args=args, timeout=300).check()
    outputs = result.rank_outputs
    assert len(outputs) == np_
    assert [o["failures"] for o in outputs] == [[]] * np_
    assert len({o["digest"] for o in outputs}) == 1, "ranks ended with different bits"
    assert outputs[0]["steps"] == steps
    names = outputs[0]["algorithms"]
    assert {"flat", "ring", "asa", "hierarchical"} <= set(names)
    assert sum(name.startswith("hierarchical[") for name in names) == 9
    assert outputs[0]["checks"] > 900


def test_uneven_nodes_have_no_hierarchical_allreduce(mpirun):
    result = mpirun(
        WORKERS / "algorithms.py",
        np=4,
        env={"DDL_PSEUDO_NODES": "a,a,a,b"},
        args=["0,1,5,1000"],
        timeout=180,
    ).check()
    outputs = result.rank_outputs
    assert [o["failures"] for o in outputs] == [[]] * 4
    assert outputs[0]["algorithms"] == ["asa", "flat", "ring"]


def test_forcing_hierarchical_on_uneven_nodes_fails_at_init_with_the_fix(mpirun):
    result = mpirun(
        WORKERS / "algorithms.py",
        np=4,
        env={"DDL_PSEUDO_NODES": "a,a,a,b", "DDL_ALLREDUCE_ALGO": "hierarchical"},
        timeout=120,
    )
    assert result.returncode != 0
    assert "needs groups of equal size" in result.stderr
    assert "DDL_ALLREDUCE_ALGO=auto" in result.stderr
