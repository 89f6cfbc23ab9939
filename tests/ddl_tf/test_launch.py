"""ddlrun: argument errors, pre-flight checks, the exact mpirun command (no job is started)."""

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import ddl_tf
from ddl_tf import ddlrun
from ddl_tf.errors import LaunchError
from ddl_tf.launch.command import LaunchPlan, build_command, child_environment, find_mpirun
from ddl_tf.launch.hosts import Host, local_slots, parse_host_list, parse_hostfile, place_ranks

SCRIPT = str(Path(__file__).parent / "test_launch.py")


def run(capsys, *argv):
    code = ddlrun.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dry_run_prints_topology_settings_and_the_command(capsys):
    code, out, err = run(
        capsys,
        "-np",
        "4",
        "--pseudo-nodes",
        "2",
        "--algo",
        "hierarchical",
        "--fusion-threshold-mb",
        "1",
        "--compression",
        "bf16",
        "--dry-run",
        SCRIPT,
        "--flag",
    )
    assert code == 0, err
    assert "node pseudo0: ranks 0-1" in out and "node(2) -> world(2)" in out
    assert "DDL_ALLREDUCE_ALGO=hierarchical" in out and "DDL_FUSION_THRESHOLD=1048576" in out
    command = out.split("ddlrun: running: ")[1].split()
    assert command[:3] == [find_mpirun(), "-np", "4"]
    assert command[-3:] == [sys.executable, SCRIPT, "--flag"]
    assert ("--allow-run-as-root" in command) == (os.geteuid() == 0)
    assert "-x" in command and "DDL_COMPRESSION" in command


def test_root_permission_only_when_root():
    plan = LaunchPlan(np=2, program=["python", "t.py"], hosts=[Host("a", 2)])
    as_user = build_command(plan, "mpirun", flavor="openmpi", as_root=False)
    as_root = build_command(plan, "mpirun", flavor="openmpi", as_root=True)
    assert "--allow-run-as-root" not in as_user and "--allow-run-as-root" in as_root
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in {
        k for k in child_environment(plan, as_root=False) if k not in os.environ
    }
    env = child_environment(plan, as_root=True)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert build_command(plan, "mpiexec", flavor="hydra", as_root=True)[:5] == [
        "mpiexec",
        "-n",
        "2",
        "-hosts",
        "a:2",
    ]


def test_mpirun_next_to_python_wins():
    assert find_mpirun() == str(Path(sys.executable).parent / "mpirun")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-np", "5", "-H", "localhost:2,127.0.0.1:2", SCRIPT], "5 ranks need 5 slots"),
        (["-np", "2", "-H", "no-such-host.invalid:2", SCRIPT], "cannot resolve host(s)"),
        (["-np", "2", "-H", "a:zero", SCRIPT], "cannot read host 'a:zero'"),
        (["-np", "2", "missing_script.py"], "does not exist"),
        (["-np", "2", "--topology", "/nonexistent/t.json", SCRIPT], "does not exist"),
        (["-np", "3", "--pseudo-nodes", "a,b", SCRIPT], "lists 2 node names for 3 ranks"),
        (["-np", "2", "--mpirun", "/nonexistent/mpirun", SCRIPT], "is not an executable"),
        (["-np", "2", "--stall-warning-seconds", "0", SCRIPT], "stall_warning_seconds"),
    ],
)
def test_preflight_failures_exit_3_with_a_fix(capsys, argv, message):
    code, out, err = run(capsys, *argv, "--dry-run")
    assert code == ddlrun.EXIT_PREFLIGHT, (out, err)
    assert message in err
    assert "ddlrun: running" not in out


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "--algo", "tree", SCRIPT)[0] == ddlrun.EXIT_USAGE
    assert run(capsys, "-H", "a", "--hostfile", "f", SCRIPT)[0] == ddlrun.EXIT_USAGE
    assert run(capsys, "--help")[0] == ddlrun.EXIT_OK


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-np", "2"], "no program to run"),
        (["-np", "2", "--"], "no program to run"),
        (["-np", "0", SCRIPT], "-np must be 1 or more. Received -np 0"),
    ],
)
def test_a_missing_program_or_a_bad_rank_count_is_a_usage_error(capsys, argv, message):
    code, out, err = run(capsys, "--dry-run", *argv)
    assert code == ddlrun.EXIT_USAGE, (out, err)
    assert err.startswith(f"ddlrun: error: {message}") and err.count("\n") == 1


def test_np_defaults_to_the_slots(capsys, monkeypatch):
    for name in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run(capsys, "--dry-run", SCRIPT)  # no hosts: this machine's cores
    assert code == ddlrun.EXIT_OK, err
    command = out.split("ddlrun: running: ")[1].split()
    cores = local_slots()
    assert command[1:3] == ["-np", str(cores)] and f"localhost:{cores}" in command
    assert cores == (psutil.cpu_count(logical=False) or os.cpu_count())
    code, out, err = run(capsys, "-H", "localhost:2,127.0.0.1:1", "--dry-run", SCRIPT)
    assert code == ddlrun.EXIT_OK, err
    assert out.split("ddlrun: running: ")[1].split()[1:3] == ["-np", "3"]
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # an allocation's slots are mpirun's to count
    code, _, err = run(capsys, "--dry-run", SCRIPT)
    assert code == ddlrun.EXIT_USAGE and "give the number of ranks with -np N" in err


def test_a_launch_option_after_the_program_is_refused_with_the_fix(capsys):
    code, out, err = run(capsys, "--dry-run", SCRIPT, "-np", "2")
    assert code == ddlrun.EXIT_USAGE and "ddlrun: running" not in out
    assert f"-np comes after the program ({SCRIPT})" in err
    assert "Put ddlrun's options before the program" in err and "after '--'" in err
    code, _, err = run(capsys, "--dry-run", "python", SCRIPT, "--hostfile=h")
    assert code == ddlrun.EXIT_USAGE and f"--hostfile comes after the program ({SCRIPT})" in err
    # the program's own arguments pass through unchanged, ddlrun-like ones included
    mine = ["--epochs", "3", "-n", "4", "-x", "1", "--algo", "ring", "--timeline", "t.json"]
    code, out, err = run(capsys, "-np", "2", "--dry-run", SCRIPT, *mine)
    assert code == ddlrun.EXIT_OK, err
    assert out.split("ddlrun: running: ")[1].split()[-len(mine) :] == mine
    # after '--' even a launch option is the program's
    code, out, err = run(capsys, "-np", "2", "--dry-run", "--", SCRIPT, "-np", "5")
    assert code == ddlrun.EXIT_OK, err
    assert out.split("ddlrun: running: ")[1].split()[-3:] == [SCRIPT, "-np", "5"]


def test_the_launch_only_options_are_ddlruns():
    options = {o for a in ddlrun.build_parser()._actions for o in a.option_strings}
    assert ddlrun.LAUNCH_ONLY_OPTIONS <= options, ddlrun.LAUNCH_ONLY_OPTIONS - options


def test_python_check_reports_a_python_without_ddl_tf(capsys, tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'missing: ddl_tf'\nexit 1\n")
    fake.chmod(0o755)
    code, _, err = run(capsys, "-np", "1", "--dry-run", str(fake), SCRIPT)
    assert code == ddlrun.EXIT_PREFLIGHT
    assert "cannot run ddl_tf: missing: ddl_tf" in err


def test_host_lists_and_hostfiles(tmp_path):
    assert parse_host_list("a:2,b,a:1") == [Host("a", 3), Host("b", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4\nnode2:2  # comment\nnode3\n")
    assert parse_hostfile(hostfile) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]
    hostfile.write_text("node1 gpus=4\n")
    with pytest.raises(LaunchError, match="hosts:1: cannot read"):
        parse_hostfile(hostfile)
    assert place_ranks([Host("a", 1), Host("b", 1)], 3, oversubscribe=True) == ["a", "b", "a"]


def test_version_prints_the_distribution_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == ddlrun.EXIT_OK
    assert out.strip() == f"ddlrun (tflms-ddl) {ddl_tf.__version__}"


HEAVY = ("tensorflow", "keras", "mpi4py", "numpy")


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["--help"], 0), (["--version"], 0), (["--algo", "tree", SCRIPT], 2), (["-np"], 2)],
)
def test_ddlrun_answers_at_once_without_tensorflow_or_mpi(argv, code):
    # the console script when installed (what users run), else the module
    script = Path(sys.executable).parent / "ddlrun"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ddl_tf.ddlrun"]
    # what makes it answer at once is what it does not import (checked below), not a
    # wall-clock figure that a loaded machine would break
    out = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    # and what it imported, module by module
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ddl_tf.ddlrun", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert traced.returncode == code, traced.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in traced.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "ddl_tf.launch.command" in imported  # the trace does cover ddlrun's imports
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert not heavy, f"ddlrun {' '.join(argv)} imported {heavy[:8]}; import them lazily"


def test_a_dry_run_imports_neither_tensorflow_nor_mpi4py():
    code = (
        "import sys\n"
        "from ddl_tf import ddlrun\n"
        f"assert ddlrun.main(['-np', '2', '--pseudo-nodes', '2', '--dry-run', {SCRIPT!r}]) == 0\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_horovodrun_options_are_accepted_and_mapped(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:2  # horovodrun's host:slots form\n")
    code, out, err = run(
        capsys,
        "--mpi",
        "-np",
        "2",
        "--hostfile",
        str(hostfile),
        "--timeline-filename",
        str(tmp_path / "timeline.json"),
        "--fusion-threshold-mb",
        "2",
        "--cycle-time-ms",
        "5",
        "--log-level",
        "trace",
        "--verbose",
        "--start-timeout",
        "30",
        "--network-interface",
        "eth1",
        "--mpi-args",
        "--mca btl_base_verbose 0",
        "--dry-run",
        SCRIPT,
    )
    assert code == 0, err
    command = out.split("ddlrun: running: ")[1].split()
    # the hostfile is read here and passed as -H: mpirun never sees 'localhost:2' as a host
    assert "--hostfile" not in command and command[command.index("-H") + 1] == "localhost:2"
    assert f"DDL_TIMELINE={tmp_path / 'timeline.json'}" in out and "DDL_LOG_LEVEL=trace" in out
    assert "DDL_FUSION_THRESHOLD=2097152" in out
    for component in ("btl_tcp_if_include", "oob_tcp_if_include"):
        assert command[command.index(component) + 1] == "eth1"
    assert command[command.index("btl_base_verbose") + 1] == "0"
    assert "note: --cycle-time-ms is horovodrun's" in out and "note: --start-timeout" not in out
    assert "DDL_START_TIMEOUT=30.0" in out  # horovodrun's start timeout is init()'s
    assert "DDL_START_ADDR" not in command  # a dry run starts no start-up check
