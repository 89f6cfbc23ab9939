"""Topology values from fake node layouts (no MPI): levels, steps, Horovod quantities, files."""

import json

import pytest

from ddl_tf.core.topology.layout import Topology, launcher_layout, pseudo_node_names
from ddl_tf.core.topology.topology_file import TopologySpec, load_topology_file
from ddl_tf.errors import ConfigError, TopologyError


def layout(*counts):
    return [f"n{i}" for i, c in enumerate(counts) for _ in range(c)]


def test_two_nodes_of_two_ranks():
    topos = [Topology.from_node_names(layout(2, 2), r) for r in range(4)]
    assert [(t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topos] == [
        (0, 2, 0, 2),
        (1, 2, 0, 2),
        (0, 2, 1, 2),
        (1, 2, 1, 2),
    ]
    steps = topos[0].steps()
    assert [(s.level, s.colors, s.size) for s in steps] == [
        ("node", (0, 0, 1, 1), 2),
        ("world", (0, 1, 0, 1), 2),
    ]
    assert topos[0].is_uniform and topos[0].is_homogeneous and topos[0].num_nodes == 2


def test_one_node_has_a_trivial_world_step_and_one_rank_per_node_skips_the_node_step():
    one_node = Topology.from_node_names(layout(4), 0)
    assert [(s.level, s.size) for s in one_node.steps()] == [("node", 4), ("world", 1)]
    spread = Topology.from_node_names(layout(1, 1, 1), 2)
    assert [(s.level, s.size) for s in spread.steps()] == [("world", 3)]
    assert (spread.local_rank, spread.cross_rank, spread.cross_size) == (0, 2, 3)


def test_uneven_nodes_are_not_uniform_and_cross_groups_follow_local_rank():
    topo = Topology.from_node_names(layout(3, 1), 3)
    assert not topo.is_uniform and not topo.is_homogeneous
    assert (topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size) == (0, 1, 1, 2)
    assert "unavailable" in topo.describe()


def test_socket_node_rack_levels_from_a_spec():
    spec = TopologySpec.from_dict(
        {
            "levels": ["socket", "node", "rack"],
            "split": {"socket": 2},
            "groups": {"rack": {"r0": ["n0", "n1"], "r1": ["n2", "n3"]}},
            "algorithms": {"socket": "ring", "world": "asa"},
        }
    )
    topo = Topology.from_node_names(layout(4, 4, 4, 4), 5, spec)
    steps = topo.steps()
    assert [(s.level, s.size, s.algorithm) for s in steps] == [
        ("socket", 2, "ring"),
        ("node", 2, None),
        ("rack", 2, None),
        ("world", 2, "asa"),
    ]
    # ranks sharing a step communicator hold the same shard from the steps below
    assert topo.ranks_in_group("socket") == (4, 5)
    assert [r for r in range(16) if steps[1].colors[r] == steps[1].colors[5]] == [5, 7]
    assert [r for r in range(16) if steps[3].colors[r] == steps[3].colors[5]] == [5, 13]
    assert topo.is_uniform


def test_spec_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(TopologyError, match="including 'node'"):
        TopologySpec.from_dict({"levels": ["rack"]})
    with pytest.raises(TopologyError, match="block count in 'split'"):
        TopologySpec.from_dict({"levels": ["socket", "node"]})
    with pytest.raises(TopologyError, match="unknown algorithm 'tree'"):
        TopologySpec.from_dict({"algorithms": {"node": "tree"}})
    with pytest.raises(TopologyError, match="unknown keys"):
        TopologySpec.from_dict({"levels": ["node"], "racks": {}})
    spec = TopologySpec.from_dict(
        {"levels": ["node", "rack"], "groups": {"rack": {"r0": ["n0"]}}}, source="t.json"
    )
    with pytest.raises(TopologyError, match="t.json: node 'n1' is not listed"):
        Topology.from_node_names(layout(1, 1), 0, spec)
    odd = TopologySpec.from_dict({"levels": ["socket", "node"], "split": {"socket": 2}})
    with pytest.raises(TopologyError, match="runs 3 ranks"):
        Topology.from_node_names(layout(3), 0, odd)
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{levels: node}")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load_topology_file(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"levels": ["node"]}))
    assert load_topology_file(good).source == str(good)


def test_nested_upper_levels_must_contain_whole_groups():
    spec = TopologySpec.from_dict(
        {
            "levels": ["node", "rack", "room"],
            "groups": {
                "rack": {"r0": ["n0", "n1"], "r1": ["n2", "n3"]},
                "room": {"a": ["n0", "n2"], "b": ["n1", "n3"]},
            },
        }
    )
    with pytest.raises(TopologyError, match="splits a group"):
        Topology.from_node_names(layout(1, 1, 1, 1), 0, spec)


def test_pseudo_nodes_by_count_or_by_name():
    assert pseudo_node_names("2", 4) == ["pseudo0", "pseudo0", "pseudo1", "pseudo1"]
    assert pseudo_node_names("3", 4) == ["pseudo0", "pseudo0", "pseudo1", "pseudo2"]
    assert pseudo_node_names("a, b", 2) == ["a", "b"]
    with pytest.raises(ConfigError, match="between 1 and the number of ranks"):
        pseudo_node_names("5", 4)
    with pytest.raises(ConfigError, match="lists 3 node names for 4 ranks"):
        pseudo_node_names("a,a,b", 4)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {
                "HOROVOD_RANK": "3",
                "HOROVOD_SIZE": "8",
                "HOROVOD_LOCAL_RANK": "1",
                "HOROVOD_LOCAL_SIZE": "4",
                "HOROVOD_CROSS_RANK": "0",
                "HOROVOD_CROSS_SIZE": "2",
                "HOROVOD_HOSTNAME": "node7",
                "OMPI_COMM_WORLD_RANK": "3",
            },
            {
                "launcher": "horovod",
                "rank": 3,
                "size": 8,
                "local_rank": 1,
                "local_size": 4,
                "cross_rank": 0,
                "cross_size": 2,
                "hostname": "node7",
            },
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "2",
                "SLURMD_NODENAME": "c12",
            },
            {
                "launcher": "slurm",
                "rank": 5,
                "size": 8,
                "local_rank": 1,
                "cross_rank": 2,
                "hostname": "c12",
            },
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            {"launcher": "mpich", "rank": 2, "size": 4, "local_rank": 0, "local_size": 2},
        ),
        ({}, {}),
    ],
)
def test_launcher_layouts(environ, expected):
    assert launcher_layout(environ) == expected
