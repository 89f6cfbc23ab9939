"""Learning the ``auto`` tables from benchmark rows: one rule set for both benchmarks."""

import json

import pytest

from benchmarks.policy_fit import (
    MARGIN,
    choose_per_size,
    costs_from_rows,
    fit_rules,
    fit_tables,
    regrets,
    rules_from,
    wire_bytes,
)
from ddl_tf.core.algorithms.selection import load_policy

MiB = 1 << 20


def row(size, algo, seconds, compression="none", **extra):
    return {"bytes": size, "algorithm": algo, "compression": compression, "seconds": seconds,
            **extra}  # fmt: skip


def test_learned_tables_do_not_follow_noise():
    # ring is 3-8 % "faster" at 2 of 4 sizes: within the margin, so flat (the default) stays
    noisy = {1: {"flat": 1.0, "ring": 0.97}, 2: {"flat": 1.0, "ring": 1.05},
             4: {"flat": 1.0, "ring": 0.92}, 8: {"flat": 1.0, "ring": 1.01}}  # fmt: skip
    assert set(choose_per_size(noisy).values()) == {"flat"}
    # a clear win switches, and the new choice stays while it is tied
    clear = {1: {"flat": 1.0, "hierarchical": 2.0}, 2: {"flat": 1.0, "hierarchical": 0.6},
             4: {"flat": 1.0, "hierarchical": 0.95}}  # fmt: skip
    assert choose_per_size(clear) == {1: "flat", 2: "hierarchical", 4: "hierarchical"}
    # the margin is a parameter: with none, every win counts
    assert choose_per_size(noisy, margin=0.0) == {1: "ring", 2: "flat", 4: "ring", 8: "flat"}
    assert MARGIN == 0.10


def test_among_tied_challengers_the_cheapest_wins():
    costs = {1: {"flat": 2.0, "ring": 1.05, "asa": 1.0}}
    assert choose_per_size(costs) == {1: "asa"}


def test_rules_merge_runs_and_split_at_geometric_midpoints():
    assert rules_from({1024: "flat", 4096: "ring", 16384: "ring"}) == [
        [2048, "flat"],
        [None, "ring"],
    ]
    assert rules_from({MiB: "ring"}) == [[None, "ring"]]
    assert rules_from({}) == []


def test_auto_rows_baselines_and_target_phases_do_not_compete():
    rows = [row(MiB, "flat", 1.0), row(MiB, "ring", 0.5), row(MiB, "auto", 0.1),
            row(MiB, "mpi4py", 0.1), row(MiB, "engine", 0.1),
            row(MiB, "asa", 0.01, phase="target"),
            row(4 * MiB, "flat", 4.0), row(4 * MiB, "ring", 2.0), row(4 * MiB, "auto", 0.1)]  # fmt: skip
    assert costs_from_rows(rows, "none") == {
        MiB: {"flat": 1.0, "ring": 0.5},
        4 * MiB: {"flat": 4.0, "ring": 2.0},
    }
    assert fit_tables([rows], {"multi_node@2x2": "none"}) == {"multi_node@2x2": [[None, "ring"]]}


def test_tables_are_keyed_by_bytes_on_the_wire():
    # bench_cluster_allreduce rows carry wire_bytes; bench_allreduce rows float32 bytes
    assert wire_bytes({"wire_bytes": 512, "bytes": 1024, "compression": "fp16"}) == 512
    assert wire_bytes(row(1024, "flat", 1.0, "bf16")) == 512
    assert wire_bytes(row(1024, "flat", 1.0, "fp16")) == 512
    assert wire_bytes(row(1024, "flat", 1.0)) == 1024
    rows = [row(MiB, "flat", 1.0, "bf16"), row(MiB, "ring", 2.0, "bf16"),
            row(4 * MiB, "flat", 2.0, "bf16"), row(4 * MiB, "ring", 1.0, "bf16")]  # fmt: skip
    assert fit_tables([rows], {"single_node/custom_op": "bf16"}) == {
        "single_node/custom_op": [[MiB, "flat"], [None, "ring"]]  # sqrt(0.5 MiB * 2 MiB)
    }


def test_several_layouts_use_the_worst_case_regret():
    # ring wins big on 4 ranks but loses by 30 % on 2: flat's worst case (1.25) is better
    two = {MiB: {"flat": 1.0, "ring": 1.3}}
    four = {MiB: {"flat": 2.5, "ring": 2.0}}
    assert regrets([two, four]) == {MiB: {"flat": 1.25, "ring": 1.3}}
    assert fit_rules([two, four]) == [[None, "flat"]]
    # ring fastest on both layouts: ring
    assert fit_rules([{MiB: {"flat": 1.2, "ring": 1.0}}, four]) == [[None, "ring"]]


def test_sizes_and_algorithms_not_measured_everywhere_do_not_compete():
    # bench_allreduce times only flat (and auto) for large compressed messages
    a = {MiB: {"flat": 2.0, "ring": 1.0}, 64 * MiB: {"flat": 9.0}, 256 * MiB: {"flat": 1.0}}
    b = {MiB: {"flat": 2.0, "ring": 1.0}, 64 * MiB: {"flat": 9.0}}
    assert fit_rules([a, b]) == [[8 * MiB, "ring"], [None, "flat"]]
    # a layout that measured nothing for this case (the pseudo-node layout's
    # single-node rows) is left out rather than emptying the intersection
    assert fit_rules([a, {}]) == fit_rules([a])
    assert fit_rules([{}, {}]) is None and fit_rules([]) is None


def test_situations_without_rows_are_left_out():
    rows = [row(MiB, "flat", 1.0), row(MiB, "ring", 2.0)]
    tables = fit_tables([rows], {"single_node": "none", "single_node/custom_op": "bf16"})
    assert tables == {"single_node": [[None, "flat"]]}


def test_fitted_tables_make_a_valid_policy(tmp_path):
    measured = [(MiB, "flat", 1.0), (MiB, "hierarchical", 2.0)]
    measured += [(16 * MiB, "flat", 8.0), (16 * MiB, "hierarchical", 4.0)]
    tables = fit_tables([[row(*m) for m in measured]], {"multi_node@2x2": "none"})
    (tmp_path / "policy.json").write_text(json.dumps(tables))
    policy = load_policy(tmp_path / "policy.json")
    kwargs = {"num_nodes": 2, "hierarchical_ok": True, "custom_op": False, "layout": (2, 2)}
    assert policy.choose(MiB, **kwargs) == "flat"
    assert policy.choose(64 * MiB, **kwargs) == "hierarchical"


@pytest.mark.parametrize("module", ["bench_allreduce", "bench_cluster_allreduce"])
def test_both_benchmarks_learn_with_the_product_rules(module):
    import importlib

    bench = importlib.import_module(f"benchmarks.{module}")
    assert bench.fit_tables is fit_tables
    for name in ("choose_per_size", "rules_from", "derive_tables", "derive_general", "MARGIN"):
        assert not hasattr(bench, name), f"{module} has its own {name}"


def test_bench_allreduce_policy_per_situation():
    from benchmarks.bench_allreduce import derive_policy

    def layout(name, nodes, ring_seconds):
        rows = [row(MiB, "flat", 1.0), row(MiB, "ring", ring_seconds),
                row(MiB, "flat", 1.0, "bf16"), row(MiB, "ring", 2.0, "bf16"),
                row(MiB, "auto", 1.0, phase="target"), row(MiB, "mpi4py", 0.5, phase="target")]  # fmt: skip
        return {"layout": name, "rows": [{**r, "nodes": nodes} for r in rows]}

    layouts = [layout("2 ranks, 1 node", 1, 0.5), layout("4 ranks, 1 node", 1, 0.8),
               {"layout": "4 ranks, 2 pseudo-nodes", "rows": [
                   {**row(MiB, "flat", 1.0), "nodes": 2},
                   {**row(MiB, "hierarchical", 3.0), "nodes": 2}]}]  # fmt: skip
    assert derive_policy(layouts) == {
        "single_node": [[None, "ring"]],
        "single_node/custom_op": [[None, "flat"]],
        "multi_node": [[None, "flat"]],
    }
