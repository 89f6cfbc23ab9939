"""Elastic jobs without MPI: discovery, blacklist, host changes, settings and ddlrun's launch."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from ddl_tf import ddlrun, env
from ddl_tf.errors import ConfigError, LaunchError
from ddl_tf.launch.command import LaunchPlan
from ddl_tf.launch.elastic import ULFM_ARGS, find_hosts, make_elastic, physical_hosts
from ddl_tf.launch.hosts import Host
from ddl_tf.launch.worker import host_of_rank
from ddl_tf.membership.discovery import Blacklist, DiscoveryError, parse_hosts, run_discovery
from ddl_tf.membership.reform import HostChange, plan_change
from ddl_tf.membership.settings import ElasticSettings


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_discovery_lines_give_hosts_and_slots_in_order():
    assert parse_hosts("b:2\n# comment\n\na:1\n") == {"b": 2, "a": 1}
    assert parse_hosts("node-1\n", slots_per_host=3) == {"node-1": 3}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("node1 slots=2\n", "not 'host' or 'host:slots'"),
        ("node1\n", "gives no slots; print 'host:slots' or pass --slots-per-host"),
        ("node1:0\n", "gives 0 slots"),
    ],
)
def test_discovery_garbage_is_refused_naming_the_line(text, problem):
    with pytest.raises(DiscoveryError, match=problem):
        parse_hosts(text)


def test_a_failing_hanging_or_missing_discovery_script_raises(tmp_path):
    with pytest.raises(DiscoveryError, match="exited with 3: boom"):
        run_discovery(_script(tmp_path, "echo boom >&2; exit 3"))
    with pytest.raises(DiscoveryError, match="did not finish within 0.5 s"):
        run_discovery(_script(tmp_path, "sleep 30"), timeout=0.5)
    with pytest.raises(DiscoveryError, match="cannot run the host discovery script"):
        run_discovery(str(tmp_path / "absent.sh"))
    assert run_discovery(_script(tmp_path, "echo localhost:2")) == {"localhost": 2}


def test_a_failed_host_stays_out_for_good_or_for_a_growing_cooldown():
    forever = Blacklist()
    forever.add("a", now=0.0)
    assert forever.blocked("a", now=1e9) and not forever.blocked("b", now=0.0)
    cooling = Blacklist(cooldown=(2.0, 5.0))
    cooling.add("a", now=0.0)
    assert cooling.blocked("a", now=1.9) and not cooling.blocked("a", now=2.1)
    cooling.add("a", now=10.0)  # second failure: 4 s
    assert cooling.blocked("a", now=13.9) and not cooling.blocked("a", now=14.1)
    cooling.add("a", now=20.0)  # third: 8 s, capped at 5
    assert not cooling.blocked("a", now=25.1)


def test_host_changes_respect_max_np_and_the_blacklist():
    never = lambda host: False  # noqa: E731
    assert plan_change(("a", "a"), {"a": 2}, never, None) == HostChange()
    assert not HostChange()
    assert plan_change(("a", "a"), {"a": 2, "b": 4}, never, 4).added == (("b", 2),)
    assert plan_change(("a", "a"), {"a": 2, "b": 4}, lambda h: h == "b", None).added == ()
    change = plan_change(("a", "b", "b"), {"a": 1, "c": 1}, never, None)
    assert change.removed == ("b",) and change.added == (("c", 1),)


def test_elastic_settings_come_from_the_environment_and_are_checked():
    values = {
        env.DDL_ELASTIC_MIN_NP: "2",
        env.DDL_ELASTIC_MAX_NP: "8",
        env.DDL_ELASTIC_RESET_LIMIT: "3",
        env.DDL_ELASTIC_TIMEOUT: "30",
    }
    settings = ElasticSettings.from_env(values)
    assert (settings.min_np, settings.max_np, settings.reset_limit, settings.timeout) == (
        2,
        8,
        3,
        30.0,
    )
    with pytest.raises(ConfigError, match="--max-np \\(1\\) is below --min-np \\(2\\)"):
        ElasticSettings(min_np=2, max_np=1)
    with pytest.raises(ConfigError, match="DDL_ELASTIC_COOLDOWN must be 'low,high'"):
        ElasticSettings.from_env({env.DDL_ELASTIC_COOLDOWN: "10"})
    with pytest.raises(ConfigError, match="DDL_ELASTIC_MIN_NP must be a number"):
        ElasticSettings.from_env({env.DDL_ELASTIC_MIN_NP: "two"})
    with pytest.raises(ConfigError, match="--min-np must be at least 1"):
        ElasticSettings.from_env({env.DDL_ELASTIC_MIN_NP: "0"})


def test_this_machines_names_are_one_mpirun_host_and_ranks_fill_hosts_in_order():
    assert physical_hosts({"localhost": 2, "127.0.0.1": 2}) == [("localhost", 4)]
    assert [host_of_rank("a:1,b:2", r) for r in range(3)] == ["a", "b", "b"]
    with pytest.raises(LaunchError, match="rank 3 has no slot"):
        host_of_rank("a:1,b:2", 3)


def test_the_launch_waits_for_min_np_slots_then_gives_up(tmp_path):
    clock = iter(range(100))
    settings = ElasticSettings(min_np=3, discovery=_script(tmp_path, "echo a:2"), timeout=2)
    with pytest.raises(LaunchError, match="fewer than --min-np 3, for 2 s"):
        find_hosts(settings, [], clock=lambda: float(next(clock)), sleep=lambda s: None)
    assert find_hosts(ElasticSettings(min_np=2), [Host("a", 2)]) == {"a": 2}
    with pytest.raises(LaunchError, match="--min-np 3 needs that many slots"):
        find_hosts(ElasticSettings(min_np=3), [Host("a", 2)])


def test_the_elastic_launch_runs_ranks_through_the_worker_under_ulfm():
    plan = LaunchPlan(np=0, program=[sys.executable, "train.py"])
    settings = ElasticSettings(min_np=2, max_np=3, reset_limit=1, cooldown=(1.0, 4.0))
    make_elastic(plan, settings, {"localhost": 2, "127.0.0.1": 2})
    assert plan.np == 3 and plan.mpi_args[: len(ULFM_ARGS)] == ULFM_ARGS
    assert plan.program[1:5] == ["-m", "ddl_tf.launch.worker", "--hosts", "localhost:2,127.0.0.1:2"]
    assert plan.env[env.DDL_ELASTIC_RESET_LIMIT] == "1"
    assert plan.env[env.DDL_ELASTIC_COOLDOWN] == "1,4"
    with pytest.raises(LaunchError, match="-np 5 must lie between --min-np 2 and 3"):
        make_elastic(LaunchPlan(np=5, program=["x"]), settings, {"localhost": 4})


def test_ddlrun_takes_horovodruns_elastic_options(tmp_path, capsys):
    script = _script(tmp_path, "echo localhost:2; echo 127.0.0.1:2")
    program = tmp_path / "train.py"
    program.write_text("print('hi')\n")
    code = ddlrun.main(
        ["--min-num-proc", "2", "--max-num-proc", "3", "--host-discovery-script", script,
         "--blacklist-cooldown-range", "5", "60", "--dry-run", "--skip-checks", str(program)]
    )  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert code == ddlrun.EXIT_OK, captured.err
    command = shlex.split(out.split("ddlrun: running: ")[1].splitlines()[0])
    assert "--with-ft" in command and command[command.index("-np") + 1] == "3"
    assert "DDL_ELASTIC_COOLDOWN=5,60" in out

    # on the rehearsal cluster: the virtual nodes are the hosts, over TCP only (no sm)
    code = ddlrun.main(
        ["--min-np", "2", "--rehearse", "2", "-np", "4", "--dry-run", "--skip-checks", str(program)]
    )
    captured = capsys.readouterr()
    assert code == ddlrun.EXIT_OK, captured.err
    command = shlex.split(captured.out.split("ddlrun: running: ")[1].splitlines()[0])
    assert command[command.index("-H") + 1] == "node0:2,node1:2"
    assert "--with-ft" in command and "plm_rsh_agent" in command
    btls = [command[i + 2] for i, word in enumerate(command) if command[i + 1 : i + 2] == ["btl"]]
    assert btls and all(b == "tcp,self" for b in btls), btls


def test_a_relaunch_after_a_lost_daemon_leaves_the_lost_host_out(tmp_path, capsys):
    from ddl_tf.launch.supervise import FinishedWatch

    settings = ElasticSettings(min_np=2)
    assert find_hosts(settings, [Host("a", 2), Host("b", 2)], exclude=["b"]) == {"a": 2}
    with pytest.raises(LaunchError, match="without the lost host"):
        find_hosts(ElasticSettings(min_np=3), [Host("a", 2), Host("b", 2)], exclude=["b"])
    script = _script(tmp_path, "echo a:2; echo b:2; echo c:1")
    found = find_hosts(ElasticSettings(min_np=2, discovery=script), [], exclude=["b"])
    assert found == {"a": 2, "c": 1}

    base = LaunchPlan(np=4, program=[sys.executable, "train.py"], env={"DDL_ELASTIC_MIRROR": "m"})
    said: list[str] = []
    relaunch = ddlrun._Relauncher(
        base, settings, {"a": 2, "b": 2}, None, ("mpirun", "openmpi", False)
    )
    watch = FinishedWatch(said.append)
    watch.daemon_lost, watch.lost_hosts = True, ["b"]
    command, child_env = relaunch(watch)
    assert command[command.index("-np") + 1] == "2" and command[command.index("-H") + 1] == "a:2"
    assert (
        child_env[env.DDL_ELASTIC_RESUMED] == "1" and child_env[env.DDL_ELASTIC_LOST_HOSTS] == "b"
    )
    assert child_env[env.DDL_ELASTIC_MIRROR] == "m", "the relaunch reads the same mirror"
    assert relaunch(watch) is None, "no new host lost: nothing to relaunch"
    watch.lost_hosts = ["a"]
    assert "relaunching the elastic job on a:2 (2 rank(s), relaunch 1)" in capsys.readouterr().err
    assert relaunch(watch) is None
    err = capsys.readouterr().err
    assert "lost its daemon on host a (a node crash" in err
    assert "; no relaunch: ddlrun: --min-np 2" in err


def test_a_new_host_whose_ranks_never_connect_is_dropped_by_a_relaunch(capsys):
    """Issue 45 (d), point 3: a spawning rank's watchdog ends it with a line naming the new
    host (the real line: a process runs the watchdog); ddlrun's watch reads that host from it,
    the relaunch leaves it out and says it was dropped; dropping it again, or a relaunch below
    --min-np, is refused with a message."""
    import io
    import signal
    import subprocess

    from ddl_tf.launch.supervise import FinishedWatch

    watchdog = (
        "import time\nfrom ddl_tf.membership.reform import _deadline\n"
        "with _deadline(0.2, (('c', 2),)):\n    time.sleep(30)\n"
    )
    rank = subprocess.run(
        [sys.executable, "-c", watchdog], capture_output=True, timeout=60, check=False
    )
    assert rank.returncode == -signal.SIGKILL, rank.stderr

    class Sink:
        buffer = io.BytesIO()

        @staticmethod
        def flush():
            return None

    said: list[str] = []
    watch = FinishedWatch(said.append)
    watch(io.BytesIO(rank.stderr), Sink())
    assert watch.spawn_failed.is_set() and watch.dropped_hosts == ["c"]
    assert watch.relaunchable(137), "ddlrun killed the rest: relaunch"
    assert not watch.relaunchable(128 + signal.SIGTERM), "ddlrun was told to stop"

    base = LaunchPlan(np=4, program=[sys.executable, "train.py"], env={"DDL_ELASTIC_MIRROR": "m"})
    relaunch = ddlrun._Relauncher(
        base, ElasticSettings(min_np=2), {"a": 2, "b": 2}, None, ("mpirun", "openmpi", False)
    )
    command, child_env = relaunch(watch)
    assert command[command.index("-H") + 1] == "a:2,b:2"
    assert (
        child_env[env.DDL_ELASTIC_LOST_HOSTS] == "c" and child_env[env.DDL_ELASTIC_RESUMED] == "1"
    )
    err = capsys.readouterr().err
    assert "ddlrun: the ranks spawned onto the new host c never connected within" in err
    assert "that host is dropped" in err and "relaunching the elastic job on a:2,b:2" in err
    assert "lost its daemon" not in err
    assert relaunch(watch) is None
    assert "no relaunch: this job dropped that host before" in capsys.readouterr().err
    assert watch.status(137) == 1 and "the new host c never connected" in said[-1]

    short = ddlrun._Relauncher(
        base, ElasticSettings(min_np=5), {"a": 2, "b": 2}, None, ("mpirun", "openmpi", False)
    )
    assert short(watch) is None
    assert "never connected" in (err := capsys.readouterr().err) and "--min-np 5" in err


def test_ddlrun_launches_the_last_command_again_after_a_start_up_failure_on_virtual_nodes():
    """The rehearsal path's ``again``: a start-up failure repeats the last launch (the first,
    or the latest relaunch); otherwise the relaunch after a node crash decides."""
    import os

    from ddl_tf.launch.elastic import retrying
    from ddl_tf.launch.supervise import FinishedWatch

    said: list[str] = []
    watch = FinishedWatch(said.append)
    relaunches = [(["mpirun", "relaunch"], {"R": "1"})]
    after = retrying(watch, lambda code: relaunches.pop() if relaunches else None, ["m"], {})
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb") as out:
        out.write(b"The PMIx server's listener thread failed to start. We cannot\n")

    class Sink:
        class buffer:  # noqa: N801 - what FinishedWatch writes through
            @staticmethod
            def write(_line):
                return None

        @staticmethod
        def flush():
            return None

    with os.fdopen(reader, "rb") as stream:
        watch(stream, Sink())
    assert after(1) == (["m"], {}) and "retry 1 of 2" in said[0]
    assert after(1) == (["mpirun", "relaunch"], {"R": "1"})  # no start-up failure now
    watch.start_failed = True
    assert after(1) == (["mpirun", "relaunch"], {"R": "1"}), "the latest launch again"
    assert after(1) is None


def _deciding(prestart: bool = True, discovered=None):
    """A Membership whose discovery watcher saw ``discovered``, and a 2-rank job on host a."""
    from types import SimpleNamespace

    from ddl_tf.membership.reform import Membership
    from ddl_tf.membership.settings import ElasticSettings

    members = Membership(ElasticSettings(discovery="/bin/true", max_np=4, prestart=prestart))
    members._watcher = SimpleNamespace(hosts=discovered or {"a": 2, "b": 2}, error=None)
    members._ensure_watcher = lambda: None
    return members, SimpleNamespace(hosts=("a", "a"), rank=0, size=2)


def test_a_new_host_is_started_ahead_then_admitted_once_ready():
    """Growth without a pause, rank 0's decisions: start ahead (no re-forming), nothing while
    they start, admit them when ready; with DDL_ELASTIC_PRESTART=0 the old paused join."""
    from ddl_tf.membership.reform import HostChange, _Prestart

    members, job = _deciding()
    first = members._decide(job)
    assert first == HostChange(ahead=(("b", 2),)) and first and not first.reforms
    members._prestart = pending = _Prestart((("b", 2),))
    assert members._decide(job) == HostChange(), "started once, not again while they start"
    pending.bridge, _ = object(), pending.ready.set()
    ready = members._decide(job)
    assert ready == HostChange(added=(("b", 2),)) and ready.reforms
    paused, job = _deciding(prestart=False)
    assert paused._decide(job) == HostChange(added=(("b", 2),))


def test_ranks_started_ahead_are_sent_away_when_they_failed_or_their_host_left():
    from ddl_tf.membership.reform import HostChange, _Prestart

    members, job = _deciding()
    members._prestart = pending = _Prestart((("b", 2),))
    pending.error, _ = RuntimeError("spawn failed"), pending.ready.set()
    assert members._decide(job) == HostChange(dismiss=True)
    members, job = _deciding(discovered={"a": 2})
    members._prestart = pending = _Prestart((("b", 2),))
    pending.bridge, _ = object(), pending.ready.set()
    assert members._decide(job) == HostChange(dismiss=True), "their host left the list"
    # a host of the job leaves while they start: they were merged with its ranks
    members, job = _deciding()
    job.hosts = ("a", "c")
    members._prestart = _Prestart((("b", 2),))
    assert members._decide(job) == HostChange(removed=("c",), dismiss=True)
