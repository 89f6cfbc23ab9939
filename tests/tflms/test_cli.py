"""The ``tflms`` command: subcommands, exit codes, safety of SRC and DST, bad input."""

import builtins
import errno
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from examples import saved_models as sm
from tflms.cli import commands as cli_commands
from tflms.cli.app import ExitCode, main
from tflms.cli.progress import Progress


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_models")
    marker = root / "train_ran.txt"
    return {
        "tf2": sm.export_tf2(root / "tf2", marker=str(marker)),
        "tf1": sm.export_tf1(root / "tf1"),
        "graph_def": sm.write_graph_def(root / "train.pb"),
        "inference": sm.export_tf2_inference(root / "inference"),
        "frozen": sm.write_frozen_inference_graph(root / "frozen.pb"),
        "custom_op": sm.write_custom_op_graph(root / "custom_op.pb"),
        "marker": marker,
    }


@pytest.fixture
def run(models, capsys):
    """``run(*argv) -> (exit code, stdout, stderr)``; checks that no source file changed."""

    def _run(*argv):
        sources = [p for k, p in models.items() if k != "marker"]
        before = [sm.tree_digest(p) for p in sources]
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert [sm.tree_digest(p) for p in sources] == before, "a source model changed"
        assert "Traceback" not in err
        return code, out, err

    return _run


def assert_error(result, code, *fragments):
    got, out, err = result
    assert got == code, (got, out, err)
    assert "error:" in err and "example: tflms" in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


# --------------------------------------------------------------------------- analyze


def test_analyze_reports_graphs_plan_and_untouched_functions(run, models):
    code, out, _ = run("analyze", models["tf2"], *sm.PLAN_FLAGS)  # its batch is static
    assert code == ExitCode.OK
    assert "TF2 SavedModel" in out
    assert "function __inference_train_" in out and "batch 32 (from input signature)" in out
    assert "tensors swapped" in out and "left unchanged" in out


def test_analyze_json_lists_targets_and_plans(run, models):
    code, out, _ = run("analyze", models["tf1"], "--json", "--batch-size", "32", *sm.SWAP_FLAGS)
    assert code == ExitCode.OK
    data = json.loads(out)
    assert data["format"] == "saved_model_v1" and data["training_graphs"] == ["meta_graph[0]"]
    (graph,) = data["training"]
    assert graph["batch_size"] == 32 and graph["swaps"] == len(graph["plan"]["swaps"]) > 0
    assert data["config"]["swapout_threshold"] == 3


def test_analyze_of_an_inference_only_model_succeeds_and_says_so(run, models):
    code, out, _ = run("analyze", models["inference"])
    assert code == ExitCode.OK
    assert "no training graph" in out


def test_analysis_never_runs_the_model(run, models, monkeypatch, tmp_path):
    def forbidden(*args, **kwargs):
        raise AssertionError("tflms executed the model")

    monkeypatch.setattr(tf.saved_model, "load", forbidden)
    monkeypatch.setattr(tf.compat.v1, "Session", forbidden)
    assert run("analyze", models["tf2"], *sm.SWAP_FLAGS)[0] == ExitCode.OK
    assert run("rewrite", models["tf2"], tmp_path / "out", *sm.SWAP_FLAGS)[0] == ExitCode.OK
    assert not models["marker"].exists()  # the train function prints to it when it runs


# --------------------------------------------------------------------------- rewrite


def test_rewrite_writes_a_model_that_trains_like_the_original(run, models, tmp_path):
    dst = tmp_path / "lms"
    code, out, _ = run("rewrite", models["tf1"], dst, *sm.SWAP_FLAGS)
    assert code == ExitCode.OK
    assert "tensors swapped" in out and f"wrote {dst}" in out
    losses, _ = sm.train_tf1(dst)
    assert losses == sm.train_tf1(models["tf1"])[0]


def test_dry_run_prints_plans_that_rewrite_accepts_back(run, models, tmp_path):
    code, out, _ = run("rewrite", models["tf2"], tmp_path / "never", "--dry-run", *sm.SWAP_FLAGS)
    assert code == ExitCode.OK
    assert not (tmp_path / "never").exists()
    plans = json.loads(out)
    assert plans["format"] == "tflms.plans" and len(plans["plans"]) == 1
    plan_file = tmp_path / "plans.json"
    plan_file.write_text(out)
    assert run("rewrite", models["tf2"], tmp_path / "a", *sm.SWAP_FLAGS)[0] == ExitCode.OK
    assert run("rewrite", models["tf2"], tmp_path / "b", "--plan", plan_file)[0] == ExitCode.OK
    assert (tmp_path / "a/saved_model.pb").read_bytes() == (
        tmp_path / "b/saved_model.pb"
    ).read_bytes()


def test_a_plan_for_another_model_is_refused(run, models, tmp_path):
    code, out, _ = run("rewrite", models["tf2"], tmp_path / "x", "--dry-run", *sm.SWAP_FLAGS)
    (tmp_path / "plans.json").write_text(out)
    result = run("rewrite", models["tf1"], tmp_path / "y", "--plan", tmp_path / "plans.json")
    assert_error(result, ExitCode.USAGE, "not training graphs")


def test_rewrite_json_summary(run, models, tmp_path):
    code, out, _ = run("rewrite", models["graph_def"], tmp_path / "o.pb", "--json", *sm.SWAP_FLAGS)
    assert code == ExitCode.OK
    data = json.loads(out)
    assert data["rewritten"]["graph"]["swaps"] > 0 and data["format"] == "graph_def"


def test_existing_destination_needs_force_and_is_replaced_whole(run, models, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "stale.txt").write_text("old")
    assert_error(run("rewrite", models["tf2"], dst, *sm.SWAP_FLAGS), ExitCode.OUTPUT, "--force")
    assert (dst / "stale.txt").exists()
    assert run("rewrite", models["tf2"], dst, "--force", *sm.SWAP_FLAGS)[0] == ExitCode.OK
    assert not (dst / "stale.txt").exists() and (dst / "saved_model.pb").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind


@pytest.mark.parametrize("where", ["inside", "same", "parent"])
def test_destination_overlapping_the_source_is_refused(run, models, tmp_path, where):
    src = tmp_path / "model"
    shutil.copytree(models["tf2"], src)
    dst = {"inside": src / "lms", "same": src, "parent": tmp_path}[where]
    before = sm.tree_digest(src)
    result = run("rewrite", src, dst, "--force", *sm.SWAP_FLAGS)
    assert_error(result, ExitCode.OUTPUT, str(dst))
    assert sm.tree_digest(src) == before


@pytest.mark.parametrize("fail_in", ["_write_bytes", "_copy_file"])
def test_a_failing_write_leaves_no_partial_destination(run, models, tmp_path, monkeypatch, fail_in):
    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(f"tflms.saved_model.write.{fail_in}", disk_full)
    dst = tmp_path / "out"
    assert_error(
        run("rewrite", models["tf2"], dst, *sm.SWAP_FLAGS), ExitCode.OUTPUT, "disk is full"
    )
    assert list(tmp_path.iterdir()) == []
    dst.mkdir()
    (dst / "keep.txt").write_text("previous model")
    result = run("rewrite", models["tf2"], dst, "--force", *sm.SWAP_FLAGS)
    assert_error(result, ExitCode.OUTPUT, "previous contents are unchanged")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]


def test_an_already_rewritten_model_is_refused(run, models, tmp_path):
    assert run("rewrite", models["graph_def"], tmp_path / "once.pb", *sm.SWAP_FLAGS)[0] == 0
    result = run("rewrite", tmp_path / "once.pb", tmp_path / "twice.pb", *sm.SWAP_FLAGS)
    assert_error(result, ExitCode.UNSUPPORTED_GRAPH, "already rewritten")
    assert not (tmp_path / "twice.pb").exists()


@pytest.mark.parametrize("key", ["inference", "frozen"])
def test_nothing_to_swap_exits_6_and_writes_nothing(run, models, tmp_path, key):
    code, _, err = run("rewrite", models[key], tmp_path / "out", *sm.SWAP_FLAGS)
    assert code == ExitCode.NOTHING_TO_SWAP
    assert "inference-only" in err and "Nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def test_a_training_graph_with_nothing_worth_swapping_exits_6(run, models, tmp_path):
    code, _, err = run(
        "rewrite", models["graph_def"], tmp_path / "out.pb", "--swapout-threshold", "500",
        "--batch-size", "32",
    )  # fmt: skip
    assert code == ExitCode.NOTHING_TO_SWAP and "--swapout-threshold" in err


# --------------------------------------------------------------------------- bad input


def test_missing_path(run, tmp_path):
    assert_error(run("analyze", tmp_path / "nope"), ExitCode.NOT_FOUND, "No such file or directory")


def test_directory_that_is_not_a_saved_model(run, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_error(run("analyze", tmp_path), ExitCode.BAD_FORMAT, "not a SavedModel", "notes.txt")


def test_corrupt_saved_model_pb(run, models, tmp_path):
    src = tmp_path / "model"
    shutil.copytree(models["tf2"], src)
    data = (src / "saved_model.pb").read_bytes()
    (src / "saved_model.pb").write_bytes(data[: len(data) // 2])  # an interrupted copy
    assert_error(run("analyze", src), ExitCode.BAD_FORMAT, "corrupt")
    (src / "saved_model.pb").write_bytes(b"this is not a protobuf")
    assert_error(run("rewrite", src, tmp_path / "out"), ExitCode.BAD_FORMAT, "saved_model.pb")
    assert not (tmp_path / "out").exists()


def test_a_garbage_graph_def_file(run, tmp_path):
    (tmp_path / "model.pb").write_bytes(b"\x00\x01garbage")
    assert_error(run("analyze", tmp_path / "model.pb"), ExitCode.BAD_FORMAT, "not a GraphDef")


def test_unreadable_files(run, models, tmp_path, monkeypatch):
    src = tmp_path / "model"
    shutil.copytree(models["tf2"], src)
    (src / "saved_model.pb").unlink()
    (src / "saved_model.pb").mkdir()  # a directory where the file should be
    assert_error(run("analyze", src), ExitCode.NOT_FOUND, "is a directory")

    real_open = builtins.open

    def no_permission(file, *args, **kwargs):  # tests run as root: chmod 000 would not stop us
        if str(file).endswith("train.pb"):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_permission)
    assert_error(run("analyze", models["graph_def"]), ExitCode.NOT_FOUND, "Permission denied")


def test_unknown_op_types(run, models):
    result = run("analyze", models["custom_op"])
    assert_error(
        result, ExitCode.UNSUPPORTED_GRAPH, "'TflmsTestCustomOp'", "'mystery'", "--op-library"
    )


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--sync-mode", "7"], "sync_mode must be 0, 1, 2 or 3. Received sync_mode=7"),
        (["--swapout-threshold", "abc"], "Received swapout_threshold='abc'"),
        (["--min-tensor-bytes", "12 parsecs"], "min_tensor_bytes"),
        (["--host-device", "/nowhere"], "host_device"),
        (["--swap-ahead", "3"], "unrecognized arguments: --swap-ahead"),
    ],
)
def test_bad_option_values(run, models, flags, fragment):
    assert_error(run("analyze", models["tf2"], *flags), ExitCode.USAGE, fragment)


def test_config_file_and_flag_precedence(run, models, tmp_path):
    config = tmp_path / "lms.json"
    config.write_text(
        json.dumps({"swapout_threshold": 3, "min_tensor_bytes": 0, "swapin_ahead": 2})
    )
    code, out, _ = run(
        "analyze", models["tf1"], "--json", "--config", config, "--swapin-ahead", "1",
        "--batch-size", "32",
    )  # fmt: skip
    assert code == ExitCode.OK
    data = json.loads(out)["config"]
    assert (data["swapout_threshold"], data["swapin_ahead"]) == (3, 1)
    config.write_text("{not json")
    assert_error(run("analyze", models["tf1"], "--config", config), ExitCode.USAGE, "not JSON")
    config.write_text(json.dumps({"swap_ahead": 1}))
    assert_error(run("analyze", models["tf1"], "--config", config), ExitCode.USAGE, "swap_ahead")


def test_missing_op_library(run, models, tmp_path):
    result = run("analyze", models["tf2"], "--op-library", tmp_path / "ops.so")
    assert_error(result, ExitCode.NOT_FOUND, "No such op library")


def test_internal_errors_are_reported_briefly(run, models, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(cli_commands.saved_model, "analyze_model", boom)
    assert_error(run("analyze", models["tf2"]), ExitCode.INTERNAL, "internal error", "--traceback")


# --------------------------------------------------------------------------- help and script


@pytest.mark.parametrize("command", ["analyze", "simulate", "rewrite"])
def test_every_subcommand_has_help_with_an_example(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"example:\n  tflms {command}" in out
    assert "--swapout-threshold" in out and "--config FILE.json" in out


def test_top_level_help_lists_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes" in out and "nothing to swap" in out
    assert main([]) == ExitCode.USAGE
    assert "example: tflms" in capsys.readouterr().err


def test_progress_is_drawn_only_on_a_terminal_after_the_delay():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        with Progress(stream, delay=0, interval=0.01) as progress:
            progress.stage("analysing train")
            # wait for the first draw on a terminal (bounded), never on a pipe
            deadline = time.monotonic() + 10
            while stream is terminal and "analysing" not in stream.getvalue():
                assert time.monotonic() < deadline, "the progress line was never drawn"
                time.sleep(0.005)
    assert "analysing train" in terminal.getvalue() and terminal.getvalue().endswith("\x1b[2K")
    assert pipe.getvalue() == ""
    quick = Terminal()
    with Progress(quick, delay=5):
        pass
    assert quick.getvalue() == ""


def test_the_progress_line_fits_the_terminal_width(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "40")  # the width a stream without a descriptor gets
    terminal = Terminal()
    with Progress(terminal, delay=0, interval=0.01) as progress:
        progress.stage("reading /a/very/long/path/to/a/saved/model/directory")
        deadline = time.monotonic() + 10
        while "reading" not in terminal.getvalue():
            assert time.monotonic() < deadline, "the progress line was never drawn"
            time.sleep(0.005)
    lines = [line for line in terminal.getvalue().split("\r\x1b[2K") if line]
    assert lines and all(len(line) <= 39 for line in lines), lines
    assert all(line.startswith("tflms: ") and line.endswith("s") for line in lines), lines
    # the stage is shortened, the elapsed time kept (a first draw may come before the stage)
    assert not any("directory" in line for line in lines), lines


def test_the_installed_console_script(models, tmp_path):
    script = Path(sys.executable).with_name("tflms")
    assert script.exists(), "run `make install` so setup.cfg's console_scripts entry is installed"
    dst = tmp_path / "lms"
    done = subprocess.run(
        [str(script), "rewrite", str(models["tf2"]), str(dst), *sm.SWAP_FLAGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "tensors swapped" in done.stdout and "Traceback" not in done.stderr
    assert sm.train_tf2(dst)[0] == sm.train_tf2(models["tf2"])[0]


def test_an_open_batch_dimension_needs_the_batch_size_flag(run, models, tmp_path):
    result = run("rewrite", models["tf1"], tmp_path / "x", *sm.PLAN_FLAGS)
    assert_error(result, ExitCode.USAGE, "batch size of", "is unknown", "--batch-size N")
    assert not (tmp_path / "x").exists()
    assert run("rewrite", models["tf1"], tmp_path / "y", *sm.SWAP_FLAGS)[0] == ExitCode.OK
