"""Rehearsal cluster: real namespaces, shaped links, Open MPI across virtual nodes, teardown.

Needs root and iproute2 (``ip``, ``tc``) plus ``unshare``; otherwise every
test here is skipped with the reason. Each test checks that its cluster
left nothing behind: no namespace, no /etc/netns folder, no state file, no
process, and no change to the root namespace's interfaces.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddl_tf.cluster import (
    Cluster,
    ClusterSpec,
    NetemUnavailableError,
    cleanup,
    unavailable_reason,
)
from ddl_tf.cluster.counters import snapshot
from ddl_tf.cluster.netns import find_tools, list_namespaces, netem_available
from ddl_tf.cluster.probe import link_throughput
from ddl_tf.cluster.spec import STATE_DIR
from tests.harness import REPO, mpi_env

WORKERS = Path(__file__).parent / "workers"
REASON = unavailable_reason()

pytestmark = [
    pytest.mark.parallel,
    pytest.mark.skipif(REASON is not None, reason=f"rehearsal cluster unavailable: {REASON}"),
]


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def leftovers(prefix: str, pids=()) -> list[str]:
    """Everything cluster ``prefix`` might have left behind."""
    found = list_namespaces(find_tools(), prefix)
    found += [str(p) for p in Path("/etc/netns").glob(f"{prefix}-*")]
    found += [str(p) for p in STATE_DIR.glob(f"{prefix}*")] if STATE_DIR.exists() else []
    found += [f"pid {p}" for p in pids if alive(p)]
    return found


@pytest.fixture
def root_namespace():
    """Fails the test if the root namespace's interfaces changed."""
    before = root_links()
    yield
    assert root_links() == before, "the root network namespace changed"


def job_env(outdir: Path, **extra) -> dict:
    return mpi_env({"DDL_TEST_OUTDIR": str(outdir), "PYTHONPATH": str(REPO), **extra})


def rank_outputs(outdir: Path, n: int) -> list[dict]:
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(n)]


def test_nodes_have_their_own_names_addresses_and_shaped_links(root_namespace):
    spec = ClusterSpec(nodes=3, link="200mbit")
    with Cluster(spec) as cluster:
        assert [cluster.exec(k, ["hostname"]).stdout.strip() for k in range(3)] == [
            "node0",
            "node1",
            "node2",
        ]
        addr = cluster.exec(2, ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
        assert "10.213.0.3/24" in addr
        hosts = cluster.exec(1, ["cat", "/etc/hosts"]).stdout
        assert "10.213.0.1 node0" in hosts
        for cmd in (["tc", "class", "show", "dev", "eth0"],):
            assert "rate 200Mbit" in cluster.exec(0, cmd).stdout
        switch = subprocess.run(
            ["ip", "netns", "exec", spec.switch_namespace, "tc", "class", "show", "dev", "p0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        assert "rate 200Mbit" in switch
        gbps = link_throughput(cluster, 0, 1, nbytes=8 << 20, timeout=30)
        assert set(gbps) == {"0->1", "1->0"}
        assert all(0.02 < v < 0.2 for v in gbps.values()), gbps  # at most the 0.2 Gbit/s link
    assert leftovers(spec.prefix) == []


def test_every_algorithm_is_correct_across_two_virtual_nodes(tmp_path, root_namespace):
    spec = ClusterSpec(nodes=2, link="1gbit")
    sizes = "0,1,2,3,7,1000,4099,65537,1048579"  # up to 8 MiB (float64) per allreduce
    with Cluster(spec) as cluster:
        result = cluster.mpirun(
            [sys.executable, str(WORKERS / "algorithms.py"), sizes],
            ranks_per_node=1,
            timeout=240,
            env=job_env(tmp_path),
        )
        assert result.returncode == 0, result.stderr[-4000:]
    outputs = rank_outputs(tmp_path, 2)
    assert [o["failures"] for o in outputs] == [[], []]
    assert len({o["digest"] for o in outputs}) == 1, "ranks ended with different bits"
    assert {"flat", "ring", "asa", "hierarchical"} <= set(outputs[0]["algorithms"])
    assert outputs[0]["checks"] > 1000
    assert leftovers(spec.prefix) == []


def test_shared_memory_inside_a_node_and_the_link_between_nodes(tmp_path, root_namespace):
    spec = ClusterSpec(nodes=2, link="1gbit")
    with Cluster(spec) as cluster:
        result = cluster.mpirun(
            [sys.executable, str(WORKERS / "cluster_traffic.py")],
            ranks_per_node=2,
            timeout=120,
            env=job_env(tmp_path),
        )
        assert result.returncode == 0, result.stderr[-4000:]
    outputs = rank_outputs(tmp_path, 4)
    assert [o["host"] for o in outputs] == ["node0", "node0", "node1", "node1"]
    assert [o["processor"] for o in outputs] == ["node0", "node0", "node1", "node1"]
    assert {(o["nodes"], o["local_size"], o["cross_size"]) for o in outputs} == {(2, 2, 2)}
    assert outputs[0]["source"] == "MPI shared-memory domains"
    assert all(o["sum_ok"] for o in outputs)
    for o in outputs:  # 3 x 4 MiB reduced inside the node: (almost) nothing on the link
        assert o["local_phase_tx"] < 256 << 10, o
        assert o["cross_phase_tx"] >= 4 << 20, o  # each node sends >= 2 (N-1)/N * 4 MiB
    assert leftovers(spec.prefix) == []


def test_ddlrun_rehearse_runs_a_job_on_virtual_nodes(tmp_path, root_namespace):
    before = set(list_namespaces(find_tools()))
    out = subprocess.run(
        [sys.executable, "-m", "ddl_tf.ddlrun", "--rehearse", "2", "-np", "4"]
        + [str(WORKERS / "hello.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=job_env(tmp_path),
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ddlrun: rehearsal cluster" in out.stdout
    assert "--mca plm_rsh_agent" in out.stdout
    outputs = rank_outputs(tmp_path, 4)
    assert [o["host"] for o in outputs] == ["node0", "node0", "node1", "node1"]
    assert {o["sum"] for o in outputs} == {6.0}
    assert set(list_namespaces(find_tools())) == before


@pytest.mark.parametrize("mode", ["raise", "rank-fails", "sigint", "sigterm", "sigkill"])
def test_a_failure_in_the_middle_still_tears_everything_down(tmp_path, mode, root_namespace):
    state = tmp_path / "state.json"
    # files, not pipes: after a SIGKILL the orphaned job would hold pipes open
    out_file, err_file = open(tmp_path / "owner.out", "w"), open(tmp_path / "owner.err", "w")
    owner = subprocess.Popen(
        [
            sys.executable,
            str(WORKERS / "cluster_owner.py"),
            "raise" if mode == "raise" else "rank-fails" if mode == "rank-fails" else "wait",
            str(state),
        ],
        stdout=out_file,
        stderr=err_file,
        env=job_env(tmp_path),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 90
        while not state.exists() and owner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state.exists(), (tmp_path / "owner.err").read_text()[-3000:]
        info = json.loads(state.read_text())
        prefix, pids = info["prefix"], info["pids"]
        assert len(pids) == 3 and all(alive(p) for p in pids[1:])
        assert len(list_namespaces(find_tools(), prefix)) == 3  # switch + 2 nodes
        if mode in ("sigint", "sigterm", "sigkill"):
            sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
            owner.send_signal(sig[mode])
        owner.wait(timeout=60)
        out, err = (tmp_path / "owner.out").read_text(), (tmp_path / "owner.err").read_text()
        if mode == "sigkill":  # no chance to clean up: the leftovers are found by owner pid
            assert list_namespaces(find_tools(), prefix), "SIGKILL should leave the cluster"
            cli = subprocess.run(
                [sys.executable, "-m", "ddl_tf.cluster", "cleanup", "--stale"],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=REPO,
            )
            assert cli.returncode == 0, cli.stderr
            assert f"{prefix}-n0" in json.loads(cli.stdout)["removed"]
        elif mode == "rank-fails":
            assert owner.returncode == 0, err
            assert json.loads(out.strip().splitlines()[-1])["job_exit_code"] != 0
        else:
            assert owner.returncode != 0
            if mode == "raise":
                assert "failure in the middle of a job" in err
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        out_file.close()
        err_file.close()
    deadline = time.monotonic() + 10  # killed processes may take a moment to be reaped
    while leftovers(prefix, pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(prefix, pids) == []
    cleanup(prefix)  # idempotent: nothing left to remove


def test_a_latency_is_applied_or_refused_never_faked(root_namespace):
    spec = ClusterSpec(nodes=2, link="1gbit", latency="100us")
    tools = find_tools()
    if netem_available_here(tools):
        with Cluster(spec) as cluster:
            shown = cluster.exec(0, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
            assert "netem" in shown and "delay 50us" in shown
    else:
        with pytest.raises(NetemUnavailableError, match="needs the kernel's netem qdisc"):
            with Cluster(spec):
                pass
    assert leftovers(spec.prefix) == []


def netem_available_here(tools) -> bool:
    probe = ClusterSpec(nodes=1, link=None)
    with Cluster(probe):
        return netem_available(tools, probe.switch_namespace)


def test_link_rate_changes_in_place_and_the_counters_see_the_bytes(root_namespace):
    spec = ClusterSpec(nodes=2, link="400mbit")
    nbytes = 6 << 20
    with Cluster(spec) as cluster:
        fast = link_throughput(cluster, 0, 1, nbytes=nbytes, both_directions=False, timeout=30)
        cluster.set_link("100mbit")
        assert cluster.spec.link == "100mbit"
        assert "rate 100Mbit" in cluster.exec(1, ["tc", "class", "show", "dev", "eth0"]).stdout
        # GSO super-packets follow the rate: <= 0.5 ms of wire time (4 frames at 100 Mbit/s)
        assert " gso_max_segs 4 " in cluster.exec(1, ["ip", "-d", "link", "show", "eth0"]).stdout
        before = snapshot(cluster)
        slow = link_throughput(cluster, 0, 1, nbytes=nbytes, both_directions=False, timeout=30)
        after = snapshot(cluster)
    # each rate caps its transfer (payload < rate), and 400 Mbit/s is more than 100 ever gives
    assert 0.05 < slow["0->1"] <= 0.1 < fast["0->1"] <= 0.4, (fast, slow)
    sent = after["node0"] - before["node0"]
    got = after["node1"] - before["node1"]
    # what node0 sent is what node1 received: the payload and a few connection packets
    for delta in (sent.tx_payload, got.rx_payload):
        assert nbytes <= delta < nbytes * 1.01, (sent, got)
    assert got.tx_payload < 4096 and sent.rx_payload < 4096  # the ACKs carry no payload
    assert leftovers(spec.prefix) == []
