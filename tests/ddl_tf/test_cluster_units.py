"""Rehearsal cluster pieces that need no root: spec, commands, agent, bound, ddlrun --rehearse."""

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
from ddl_tf.cluster.mpi import agent_script, mpirun_command
from ddl_tf.cluster.netns import Tools, hosts_file, setup_commands, shaping_commands
from ddl_tf.cluster.rehearse import rehearsal_hosts
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

    from ddl_tf.core.selection import DEFAULT_POLICY, load_policy

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
