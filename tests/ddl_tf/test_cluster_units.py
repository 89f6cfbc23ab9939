"""Rehearsal cluster pieces that need no root: spec, commands, agent, bound, ddlrun --rehearse, link bytes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddl_tf import ddlrun
from ddl_tf.cluster import ClusterError, ClusterSpec, allreduce_lower_bound, parse_rate
from ddl_tf.cluster import cli as cluster_cli
from ddl_tf.cluster.bounds import framing_overhead
from ddl_tf.cluster.cluster import Cluster
from ddl_tf.cluster.counters import (
    HEADER_BYTES,
    LinkCounters,
    describe_traffic,
    parse_ip_link,
    read_local,
)
from ddl_tf.cluster.mpi import TCP_EAGER_BYTES, agent_script, mpirun_command
from ddl_tf.cluster.netns import Tools, hosts_file, setup_commands
from ddl_tf.cluster.probe import LINK_BOUND_RATIO, halving_ratios, link_bound_rate
from ddl_tf.cluster.rehearse import rehearsal_hosts
from ddl_tf.cluster.shaping import (
    GSO_BURST_SECONDS,
    gso_max_segs,
    rate_commands,
    require_shaped,
    shaping_commands,
)
from ddl_tf.cluster.traffic import allgather_link_bytes, expected_link_bytes, minimum_link_bytes
from ddl_tf.errors import ConfigError, LaunchError

SCRIPT = str(Path(__file__).parent / "test_launch.py")
TOOLS = Tools(ip="/sbin/ip", tc="/sbin/tc", unshare="/usr/bin/unshare")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": 0}, "1 to 64 nodes"),
        ({"prefix": "Bad-Name"}, "lowercase letters/digits"),
        ({"link": "fast"}, "Cannot read the link rate 'fast'"),
        ({"link": "0gbit"}, "must be positive"),
        ({"latency": "soon"}, "Cannot read the latency"),
        ({"subnet": "8.8.8.0/24"}, "not a private range"),
        ({"subnet": "10.1.0.0/30", "nodes": 3}, "room for 2 nodes"),
        ({"mtu": 100}, "MTU must be"),
    ],
)
def test_spec_rejects_bad_values_with_the_fix(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClusterSpec(**kwargs)


def test_rates_and_names():
    assert parse_rate("1gbit") == parse_rate("125mbps") == 10**9
    assert parse_rate("2.5Gbit") == 2_500_000_000
    spec = ClusterSpec(nodes=3, prefix="ddlctest", subnet="192.168.7.0/24", latency="1ms")
    assert spec.namespaces == ("ddlctest-sw", "ddlctest-n0", "ddlctest-n1", "ddlctest-n2")
    assert spec.addresses == ("192.168.7.1", "192.168.7.2", "192.168.7.3")
    assert spec.latency_seconds == 0.001
    assert "192.168.7.3 node2" in hosts_file(spec)
    assert ClusterSpec().prefix != ClusterSpec().prefix  # fresh prefix per cluster


def test_every_interface_is_created_inside_the_cluster_namespaces():
    spec = ClusterSpec(nodes=2, prefix="ddlctest")
    cmds = setup_commands(spec, TOOLS)
    for cmd in cmds:
        if "link" in cmd and "add" in cmd:
            assert cmd[1:3] == ["-n", "ddlctest-sw"], cmd  # created in the switch ...
            if "veth" in cmd:
                assert cmd[-2:] in (["netns", "ddlctest-n0"], ["netns", "ddlctest-n1"])
        assert cmd[1] in ("netns", "-n"), cmd  # ... never in the root namespace
    added = [c[-1] for c in cmds if c[1:3] == ["netns", "add"]]
    assert added == list(spec.namespaces)


def test_shaping_covers_both_directions_and_latency_is_split_over_the_hops():
    spec = ClusterSpec(nodes=2, prefix="ddlctest", link="100mbit")
    cmds = [" ".join(c) for c in shaping_commands(spec, TOOLS, node=1)]
    assert any("netns exec ddlctest-n1 /sbin/tc class add dev eth0" in c for c in cmds)
    assert any("netns exec ddlctest-sw /sbin/tc class add dev p1" in c for c in cmds)
    assert all("netem" not in c for c in cmds)
    assert sum("rate 100000000bit" in c for c in cmds) == 2
    slow = ClusterSpec(nodes=2, prefix="ddlctest", link="1gbit", latency="100us")
    delays = [c for c in shaping_commands(slow, TOOLS, node=0) if "netem" in c]
    assert len(delays) == 2 and all("50.0us" in c for c in delays)
    assert shaping_commands(ClusterSpec(nodes=2, link=None), TOOLS, node=0) == []


def test_shaped_links_cap_gso_super_packets_to_half_a_millisecond_on_the_wire():
    # one htb queue drops a whole super-packet; at 62.5 Mbit/s 44-frame drops stalled TCP
    assert gso_max_segs(62_500_000, 1500) == 2  # 2 x 1514 B = 0.39 ms
    assert gso_max_segs(200_000_000, 1500) == 8
    assert gso_max_segs(10**9, 9000) == 6  # jumbo frames: fewer per burst
    assert gso_max_segs(1_000_000, 1500) == 1  # never below one frame
    assert gso_max_segs(None, 1500) == 65535  # unshaped: the kernel's default
    for bps in (62_500_000, 200_000_000, 10**9, 100 * 10**9):
        segs = gso_max_segs(bps, 1500)
        assert segs == 1 or segs * 1514 * 8 / bps <= GSO_BURST_SECONDS
        assert (segs + 1) * 1514 * 8 / bps > GSO_BURST_SECONDS or segs == 65535
    spec = ClusterSpec(nodes=2, prefix="ddlctest", link="200mbit")
    cmds = [" ".join(c) for c in shaping_commands(spec, TOOLS, node=1)]
    assert cmds[:2] == [
        "/sbin/ip -n ddlctest-n1 link set dev eth0 gso_max_segs 8",
        "/sbin/ip -n ddlctest-sw link set dev p1 gso_max_segs 8",
    ]
    latency_only = ClusterSpec(nodes=2, prefix="ddlctest", link=None, latency="100us")
    assert "gso_max_segs 65535" in " ".join(shaping_commands(latency_only, TOOLS, node=0)[0])


def test_agent_enters_the_node_namespaces_instead_of_ssh(tmp_path):
    spec = ClusterSpec(nodes=2, prefix="ddlctest")
    fake_ip = tmp_path / "ip"  # prints what it would run
    fake_ip.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    fake_ip.chmod(0o755)
    agent = tmp_path / "agent.sh"
    agent.write_text(agent_script(spec, Tools(ip=str(fake_ip), tc="tc", unshare="unshare")))
    agent.chmod(0o755)
    out = subprocess.run(
        [str(agent), "node1", "prted", "--flag", "x"], capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0, out.stderr
    args = out.stdout.split("|")
    assert args[:5] == ["netns", "exec", "ddlctest-n1", "unshare", "--uts"]
    assert args[-3:-1] == ["node1", "prted --flag x"]
    bad = subprocess.run([str(agent), "node7", "true"], capture_output=True, text=True, timeout=10)
    assert bad.returncode == 255 and "unknown host 'node7'" in bad.stderr


def test_mpirun_command_restricts_tcp_to_the_cluster_subnet():
    spec = ClusterSpec(nodes=4, prefix="ddlctest", subnet="10.99.0.0/24")
    cmd = mpirun_command(spec, ["python", "t.py"], ranks_per_node=2, mpirun="mpirun")
    text = " ".join(cmd)
    assert cmd[:5] == ["mpirun", "-np", "8", "--host", "node0:2,node1:2,node2:2,node3:2"]
    assert "--mca btl self,sm,tcp" in text
    assert "--mca btl_tcp_if_include 10.99.0.0/24" in text
    assert "--mca oob_tcp_if_include 10.99.0.0/24" in text
    assert "--mca plm_rsh_agent /run/ddl_tf_cluster/ddlctest/agent.sh" in text
    assert cmd[-2:] == ["python", "t.py"]


def test_tcp_messages_up_to_32_mib_go_eagerly():
    # the eager limit may not exceed the largest fragment: all three move together
    cmd = mpirun_command(ClusterSpec(nodes=2), ["true"], mpirun="mpirun")
    limits = {
        cmd[i + 1]: int(cmd[i + 2])
        for i, part in enumerate(cmd[:-2])
        if part == "--mca" and cmd[i + 1].startswith("btl_tcp_") and cmd[i + 2].isdigit()
    }
    eager = ("btl_tcp_eager_limit", "btl_tcp_rndv_eager_limit", "btl_tcp_max_send_size")
    assert {limits[name] for name in eager} == {TCP_EAGER_BYTES}
    assert TCP_EAGER_BYTES > 32 << 20  # room for the protocol header of a 32 MiB message


def test_bandwidth_lower_bound():
    # 2 (N-1)/N * bytes * 8 / B: 2 nodes move the whole buffer once each way
    assert allreduce_lower_bound(125_000_000, nodes=2, link_bps=10**9) == 1.0
    assert allreduce_lower_bound(125_000_000, nodes=4, link_bps=10**9) == 1.5
    assert allreduce_lower_bound(10, nodes=1, link_bps=10**9) == 0.0
    assert 1.04 < framing_overhead(1500) < 1.05 and framing_overhead(9000) < 1.01


def test_a_cluster_that_is_not_running_says_how_to_use_it():
    with pytest.raises(ClusterError, match="inside `with Cluster"):
        Cluster(ClusterSpec(nodes=2)).exec(0, ["true"])


def test_rehearsal_hosts_need_equal_ranks_per_node():
    assert [str(h) for h in rehearsal_hosts(4, 4)] == ["node0:1", "node1:1", "node2:1", "node3:1"]
    with pytest.raises(LaunchError, match="multiple of 2"):
        rehearsal_hosts(2, 3)


def run(capsys, *argv):
    code = ddlrun.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ddlrun_rehearse_dry_run_shows_the_cluster_and_its_mpirun(capsys):
    code, out, err = run(capsys, "--rehearse", "2", "-np", "4", "--dry-run", SCRIPT)
    assert code == 0, err
    assert "node node0: ranks 0-1" in out and "node node1: ranks 2-3" in out
    assert "rehearsal cluster ddlc" in out and "links 1gbit each direction" in out
    command = out.split("ddlrun: running: ")[1].split()
    assert command[command.index("-H") + 1] == "node0:2,node1:2"
    assert "plm_rsh_agent" in command and "btl_tcp_if_include" in command


def test_ddlrun_rehearse_argument_errors(capsys):
    code, _, err = run(capsys, "--rehearse", "2", "-np", "3", "--dry-run", SCRIPT)
    assert code == ddlrun.EXIT_PREFLIGHT and "multiple of 2" in err
    code, _, err = run(capsys, "--rehearse", "2", "-H", "a:2", SCRIPT)
    assert code == ddlrun.EXIT_USAGE
    code, _, err = run(capsys, "--rehearse", "2", "--link", "fast", "--dry-run", SCRIPT)
    assert code == ddlrun.EXIT_PREFLIGHT and "Cannot read the link rate 'fast'" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the message non-root users get")
def test_ddlrun_rehearse_without_root_says_why(capsys):
    code, _, err = run(capsys, "--rehearse", "2", SCRIPT)
    assert code == ddlrun.EXIT_PREFLIGHT and "needs root" in err


def test_cluster_cli_usage_errors(capsys):
    assert cluster_cli.main(["cleanup"]) == cluster_cli.EXIT_USAGE
    assert cluster_cli.main(["run", "--nodes", "0", "--", "true"]) == cluster_cli.EXIT_USAGE
    assert "1 to 64 nodes" in capsys.readouterr().err
    help_text = subprocess.run(
        [sys.executable, "-m", "ddl_tf.cluster", "--help"], capture_output=True, text=True
    ).stdout
    assert "cleanup" in help_text and "probe" in help_text


def test_cluster_policy_files_carry_layout_tables_and_steps(tmp_path):
    import json

    from ddl_tf.core.algorithms.selection import DEFAULT_POLICY, load_policy

    data = {
        **DEFAULT_POLICY.to_json(),
        "multi_node@2x2": [[1 << 20, "flat"], [None, "hierarchical"]],
        "multi_node@2x2/custom_op": [[None, "ring"]],
        "steps": {"multi_node@2x2": {"node": "ring", "world": "flat"}},
    }
    path = tmp_path / "cluster_auto_policy.json"
    path.write_text(json.dumps(data))
    policy = load_policy(path)
    kwargs = {"num_nodes": 2, "hierarchical_ok": True}
    assert policy.choose(64 << 20, custom_op=False, layout=(2, 2), **kwargs) == "hierarchical"
    assert policy.choose(64 << 10, custom_op=False, layout=(2, 2), **kwargs) == "flat"
    assert policy.choose(64 << 20, custom_op=True, layout=(2, 2), **kwargs) == "ring"
    # another layout, an uneven one (layout None) or one node: the general tables
    assert policy.choose(64 << 20, custom_op=False, layout=(4, 1), **kwargs) == "flat"
    assert policy.choose(64 << 20, custom_op=False, layout=None, **kwargs) == "flat"
    assert policy.step_algorithm("node", layout=(2, 2)) == "ring"
    assert policy.step_algorithm("node", layout=(2, 4)) is None
    assert load_policy(path).digest() == policy.digest() != DEFAULT_POLICY.digest()
    assert json.loads(json.dumps(policy.to_json())) == data
    path.write_text(json.dumps({"steps": {"multi_node@2x2": {"node": "tree"}}}))
    with pytest.raises(ConfigError, match="step algorithm 'tree'"):
        load_policy(path)
    path.write_text(json.dumps({"multi_node@2y2": [[None, "flat"]]}))
    with pytest.raises(ConfigError, match="unknown situation"):
        load_policy(path)


def test_ddlrun_auto_policy_option_sets_the_variable(capsys, tmp_path):
    policy = tmp_path / "p.json"
    policy.write_text('{"multi_node": [[null, "flat"]]}')
    code, out, err = run(capsys, "-np", "2", "--auto-policy", str(policy), "--dry-run", SCRIPT)
    assert code == 0, err
    assert f"DDL_AUTO_POLICY={policy}" in out and "-x DDL_AUTO_POLICY" in out
    code, _, err = run(capsys, "-np", "2", "--auto-policy", str(tmp_path / "no.json"), SCRIPT)
    assert code == ddlrun.EXIT_PREFLIGHT and "could not be read" in err


# --------------------------------------------------------------------------- link bytes


def test_link_counters_subtract_and_estimate_the_tcp_payload():
    before = LinkCounters(tx_bytes=10_000, rx_bytes=5_000, tx_packets=10, rx_packets=20)
    # 3 data packets of 1448 payload bytes each sent; 2 pure ACKs received
    after = LinkCounters(
        tx_bytes=10_000 + 3 * (1448 + HEADER_BYTES),
        rx_bytes=5_000 + 2 * HEADER_BYTES,
        tx_packets=13,
        rx_packets=22,
    )
    delta = after - before
    assert (delta.tx_packets, delta.rx_packets) == (3, 2)
    assert (delta.tx_payload, delta.rx_payload) == (3 * 1448, 0)
    assert delta + before == after
    assert delta.to_json()["tx_payload"] == 3 * 1448
    assert HEADER_BYTES == 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps
    # one GSO buffer: many segments behind one header, counted as one packet
    assert LinkCounters(tx_bytes=64_000 + HEADER_BYTES, tx_packets=1).tx_payload == 64_000
    with pytest.raises(ClusterError, match="must be an integer. Received tx_bytes='1'"):
        LinkCounters(tx_bytes="1")


def test_link_counters_read_from_sysfs_inside_a_node(tmp_path):
    stats = tmp_path / "eth0" / "statistics"
    stats.mkdir(parents=True)
    for name, value in [("tx_bytes", 100), ("rx_bytes", 200), ("tx_packets", 1), ("rx_packets", 2)]:
        (stats / name).write_text(f"{value}\n")
    assert read_local(sysfs=tmp_path) == LinkCounters(100, 200, 1, 2)
    with pytest.raises(ClusterError, match="interface 'eth7'.*read_node"):
        read_local("eth7", sysfs=tmp_path)


IP_LINK_JSON = """[{"ifindex":2,"ifname":"eth0","mtu":1500,"stats64":{
 "rx":{"bytes":1234,"packets":5,"errors":0,"dropped":0},
 "tx":{"bytes":5678,"packets":9,"errors":0,"dropped":0}}},
 {"ifindex":1,"ifname":"lo","stats64":{"rx":{"bytes":1,"packets":1},"tx":{"bytes":1,"packets":1}}}]"""


def test_link_counters_parsed_from_ip_json():
    assert parse_ip_link(IP_LINK_JSON) == LinkCounters(5678, 1234, 9, 5)
    older = IP_LINK_JSON.replace("stats64", "stats")  # iproute2 without 64-bit stats
    assert parse_ip_link(older, "lo") == LinkCounters(1, 1, 1, 1)
    with pytest.raises(ClusterError, match="interface 'eth1' is not in"):
        parse_ip_link(IP_LINK_JSON, "eth1")
    with pytest.raises(ClusterError, match="cannot read `ip -s -j link` output"):
        parse_ip_link("Device not found")


def test_traffic_lines_per_node():
    zero = {"node0": LinkCounters(), "node1": LinkCounters()}
    after = {
        "node0": LinkCounters(
            tx_bytes=(3 << 20) + 66, rx_bytes=(1 << 20) + 132, tx_packets=1, rx_packets=2
        ),
        "node1": LinkCounters(
            tx_bytes=(1 << 20) + 132, rx_bytes=(3 << 20) + 66, tx_packets=2, rx_packets=1
        ),
    }
    assert describe_traffic(zero, after) == [
        "node0: sent 3.0 MiB, received 1.0 MiB of TCP payload over its link (1 + 2 packets)",
        "node1: sent 1.0 MiB, received 3.0 MiB of TCP payload over its link (2 + 1 packets)",
    ]


def test_expected_link_bytes_per_algorithm_and_layout():
    w = 16 << 20
    assert minimum_link_bytes(w, nodes=2) == w and minimum_link_bytes(w, nodes=4) == 1.5 * w
    # by hand: 2 nodes x 2 ranks (P = 4)
    layout = {"nodes": 2, "ranks_per_node": 2}
    assert expected_link_bytes("hierarchical", w, **layout) == w
    assert expected_link_bytes("hierarchical[ring/flat]", w, **layout) == w
    assert expected_link_bytes("flat", w, **layout) == w
    assert expected_link_bytes("ring", w, **layout) == 2 * 3 / 4 * w
    assert expected_link_bytes("asa", w, **layout) == (2 * 1 / 2 + 3 / 4) * w
    # 2 x 4 (P = 8): ring 2 * 7/8; asa: alltoall 4 ranks x 4 off-node shards of W/8, ring allgather 7/8
    assert expected_link_bytes("ring", w, nodes=2, ranks_per_node=4) == 1.75 * w
    assert expected_link_bytes("asa", w, nodes=2, ranks_per_node=4) == (2 + 7 / 8) * w
    # 4 x 1: every rank is its own node, so ring and asa reach the minimum
    for algo in ("ring", "asa", "hierarchical"):
        assert expected_link_bytes(algo, w, nodes=4, ranks_per_node=1) == 1.5 * w
    assert expected_link_bytes("ring", w, nodes=1, ranks_per_node=4) == 0.0
    with pytest.raises(ConfigError, match="No traffic model for allreduce algorithm 'auto'"):
        expected_link_bytes("auto", w, **layout)
    with pytest.raises(ConfigError, match="Received nodes=0"):
        expected_link_bytes("flat", w, nodes=0, ranks_per_node=1)


@pytest.mark.parametrize(
    ("nodes", "rpn", "ring", "doubling", "bruck"),
    [
        # 2x2: ring 3 blocks of W/4; doubling crosses at distance 2 with 2 blocks per rank;
        # Bruck: rank 0 -> 3 (1 block), ranks 0,1 -> 2,3 (2 blocks each)
        (2, 2, 0.75, 1.0, 1.25),
        # 2x4: Bruck 1 + 2*2 + 4*4 = 21 blocks of W/8 (what Open MPI's Allgatherv moved here)
        (2, 4, 0.875, 2.0, 2.625),
        (4, 1, 0.75, 0.75, 0.75),
    ],
)
def test_allgather_schedules_cross_the_link_differently(nodes, rpn, ring, doubling, bruck):
    got = [
        allgather_link_bytes(1.0, nodes=nodes, ranks_per_node=rpn, schedule=s)
        for s in ("ring", "recursive_doubling", "bruck")
    ]
    assert got == [ring, doubling, bruck]


def test_allgather_schedule_errors_name_the_choices():
    with pytest.raises(ConfigError, match="Unknown allgather schedule 'tree'.*ring, bruck"):
        allgather_link_bytes(1.0, nodes=2, ranks_per_node=2, schedule="tree")
    with pytest.raises(ConfigError, match="power-of-2"):
        allgather_link_bytes(1.0, nodes=3, ranks_per_node=1, schedule="recursive_doubling")


def test_halving_the_rate_tells_links_from_cpus():
    gbit = 10**9
    # CPU-bound at 1 Gbit/s (half the rate: only 1.3x the time), link-bound below
    times = {gbit: 0.30, gbit // 2: 0.40, gbit // 4: 0.79, gbit // 8: 1.57}
    rows = halving_ratios(times)
    assert [r["rate_bps"] for r in rows] == [gbit, gbit // 2, gbit // 4]
    assert [r["link_bound"] for r in rows] == [False, True, True]
    assert rows[0]["half_seconds"] == 0.40 and round(rows[0]["ratio"], 3) == 1.333
    assert link_bound_rate(times) == gbit // 2
    # a slower pair that is not link-bound again: only rates below it could count
    assert link_bound_rate({**times, gbit // 16: 2.0}) is None
    assert link_bound_rate({gbit: 1.0}) is None  # no pair measured
    assert LINK_BOUND_RATIO == 1.85
    with pytest.raises(ClusterError, match="must be positive seconds"):
        halving_ratios({gbit: 0.0, gbit // 2: 1.0})


def test_link_rate_changes_in_place_at_both_ends():
    spec = ClusterSpec(nodes=2, prefix="ddlctest", link="50mbit")
    cmds = [" ".join(c) for c in rate_commands(spec, TOOLS, node=0)]
    assert cmds == [
        "/sbin/ip -n ddlctest-n0 link set dev eth0 gso_max_segs 2",
        "/sbin/ip -n ddlctest-sw link set dev p0 gso_max_segs 2",
        "/sbin/ip netns exec ddlctest-n0 /sbin/tc class change dev eth0 parent 1: classid 1:1 "
        "htb rate 50000000bit ceil 50000000bit quantum 65536",
        "/sbin/ip netns exec ddlctest-sw /sbin/tc class change dev p0 parent 1: classid 1:1 "
        "htb rate 50000000bit ceil 50000000bit quantum 65536",
    ]
    # the same class arguments as when the cluster was built
    built = [" ".join(c) for c in shaping_commands(spec, TOOLS, node=0) if "class" in c]
    assert [c.replace("class add", "class change") for c in built] == cmds[2:]
    assert require_shaped(spec, "10mbit") == "10mbit"
    with pytest.raises(ClusterError, match="a rate can only replace a rate"):
        require_shaped(ClusterSpec(nodes=2, link=None), "10mbit")
    with pytest.raises(ClusterError, match="not running"):
        Cluster(spec).set_link("10mbit")


def _row(algorithm, seconds, payload, *, nbytes=16 << 20, compression="none", chosen=None):
    wire = nbytes // 2 if compression == "fp16" else nbytes
    return {
        "bytes": nbytes,
        "wire_bytes": wire,
        "algorithm": algorithm,
        "chosen": chosen or algorithm,
        "compression": compression,
        "seconds": seconds,
        "link": {"tx_payload": [payload * wire] * 2, "rx_payload": [payload * wire] * 2},
    }


def test_cluster_benchmark_sets_link_bytes_against_the_model():
    from benchmarks.cluster_allreduce_report import annotate, evaluate, ladder_summary

    rate = 250 * 10**6
    bound = (16 << 20) * 8 / rate  # 2 nodes: the whole buffer once each way
    rows = [
        _row("hierarchical", 1.10 * bound, 1.001),
        _row("ring", 1.60 * bound, 1.5),
        _row("flat", 1.30 * bound, 1.09),  # 9 % more than MPI_Allreduce should move
        _row("asa", 2.5 * bound, 4.625),  # alltoall 2 W + Bruck allgather 21/8 W (2 nodes x 4)
        _row("hierarchical", 0.58 * bound, 1.0, compression="fp16"),
        _row("auto", 1.12 * bound, 1.0, chosen="hierarchical"),
    ]
    annotate(rows[:3] + rows[4:], nodes=2, rpn=2, link_bps=rate)
    annotate(rows[3:4], nodes=2, rpn=4, link_bps=rate)
    assert rows[0]["ratio_to_bound"] == 1.1 and rows[0]["expected_link_bytes"] == 16 << 20
    assert rows[1]["link_over_expected"] == [1.0, 1.0] and rows[1]["link_over_minimum"] == 1.5
    assert rows[3]["asa_allgather_matches"] == ["bruck"]
    assert rows[4]["ratio_to_fp32_bound"] == 0.58 and rows[4]["ratio_to_bound"] == 1.16
    targets = evaluate(rows, [])
    assert targets["hierarchical_ratio_to_bound_ge_16MiB"] == {str(16 << 20): 1.1}
    assert targets["hierarchical_within_1.15x_of_bound"]
    assert targets["fp32_over_fp16_ge_16MiB"][str(16 << 20)]["hierarchical"] == round(1.1 / 0.58, 3)
    assert targets["fp16_1.8x_faster_hierarchical"]
    assert targets["link_bytes_within_5pct"] == {
        "hierarchical": True,
        "ring": True,
        "flat": False,
        "asa": False,
    }
    # the ladder: the link-bound rate is where the hierarchical allreduce doubles its time at
    # half the rate in both wire formats; MPI_Allreduce's ratios are reported alongside
    ladder = [
        {
            "link": name,
            "link_bps": bps,
            "tcp_payload_Gbps": {"0->1": 0.95 * bps / 1e9},
            "rows": [
                {"algorithm": "hierarchical", "compression": "none", "seconds": h},
                {"algorithm": "hierarchical", "compression": "fp16", "seconds": h16},
                {"algorithm": "flat", "compression": "none", "seconds": f},
            ],
        }
        for name, bps, h, h16, f in [
            ("1gbit", 10**9, 0.20, 0.25, 0.35),
            ("500mbit", 5 * 10**8, 0.40, 0.30, 0.40),
            ("250mbit", 25 * 10**7, 0.80, 0.59, 0.62),
            ("125mbit", 125 * 10**6, 1.60, 1.17, 1.25),
        ]
    ]
    summary = ladder_summary(ladder)
    assert summary["hierarchical_link_bound_bps"] == 10**9
    assert summary["hierarchical/fp16_link_bound_bps"] == 5 * 10**8
    assert summary["flat_link_bound_bps"] == 25 * 10**7
    assert summary["link_bound_bps"] == 5 * 10**8
    assert all(r["link_bound"] for r in summary["tcp"])
