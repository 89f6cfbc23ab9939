"""``tflms simulate`` and ``--budget``: need the simulator (tflms.simulation.simulator, tflms.tuning.autotuner)."""

import json

import pytest

from examples import saved_models as sm
from tflms.cli.app import ExitCode, main

pytest.importorskip(
    "tflms.simulation.simulator", reason="the simulator (branch sim) is not in this build"
)
pytest.importorskip(
    "tflms.tuning.autotuner", reason="the auto-tuner (branch sim) is not in this build"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim_models")
    return {"tf2": sm.export_tf2(root / "tf2"), "inference": sm.export_tf2_inference(root / "inf")}


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def baseline_peak(capsys, src) -> int:
    """The tensors' peak: what a budget in bytes is compared with (a GPU preset budget is
    compared with the realistic peak, which adds the process's own terms)."""
    code, out, _ = run(capsys, "simulate", src, "--json")
    assert code == ExitCode.OK
    (graph,) = json.loads(out)["graphs"].values()
    simulation = graph["simulation"]
    assert simulation["simulated"] is True and simulation["accounting"] == "realistic"
    terms = simulation["memory_terms"]
    assert sum(terms.values()) == simulation["device_peak_bytes"] > terms["tensors"]
    return terms["tensors"]


def test_simulate_reports_the_simulated_peak(capsys, models):
    code, out, _ = run(capsys, "simulate", models["tf2"])
    assert code == ExitCode.OK
    assert "device peak" in out and "tflms.simulate" in out


def test_analyze_includes_the_predicted_peak(capsys, models):
    code, out, _ = run(capsys, "analyze", models["tf2"], *sm.SWAP_FLAGS)
    assert code == ExitCode.OK and "predicted device peak" in out and "simulated on" in out


def test_simulate_with_a_budget_autotunes_and_plots(capsys, models, tmp_path):
    peak = baseline_peak(capsys, models["tf2"])
    budget = str(int(peak * 0.99))
    plot = tmp_path / "timeline.png"
    argv = ["simulate", models["tf2"], "--budget", budget, "--safety-margin", "0", "--plot", plot]
    argv += ["--min-tensor-bytes", "0"]  # the test model's tensors are small
    code, out, _ = run(capsys, *argv, "--json")
    assert code == ExitCode.OK
    (graph,) = json.loads(out)["graphs"].values()
    tuned = graph["autotune"]
    assert tuned["lms_needed"] and tuned["swaps"] > 0
    assert graph["simulation"]["device_peak_bytes"] <= int(budget)
    assert plot.stat().st_size > 10_000


def test_rewrite_with_a_budget_writes_the_tuned_plan(capsys, models, tmp_path):
    peak = baseline_peak(capsys, models["tf2"])
    dst = tmp_path / "lms"
    budget = str(int(peak * 0.99))
    code, out, _ = run(
        capsys,
        "rewrite",
        models["tf2"],
        dst,
        "--budget",
        budget,
        "--safety-margin",
        "0",
        "--min-tensor-bytes",
        "0",
    )
    assert code == ExitCode.OK and "tensors swapped" in out
    assert sm.train_tf2(dst)[0] == sm.train_tf2(models["tf2"])[0]


def test_an_impossible_budget_exits_7(capsys, models, tmp_path):
    code, _, err = run(capsys, "rewrite", models["tf2"], tmp_path / "x", "--budget", "1KiB")
    assert code == ExitCode.INFEASIBLE and "No swap plan" in err and "example: tflms" in err
    assert not (tmp_path / "x").exists()


def test_simulate_bad_values_and_inference_models(capsys, models):
    assert run(capsys, "simulate", models["tf2"], "--link", "carrier-pigeon")[0] == ExitCode.USAGE
    assert run(capsys, "simulate", models["tf2"], "--hardware", "Z80")[0] == ExitCode.USAGE
    assert run(capsys, "simulate", models["inference"])[0] == ExitCode.NOTHING_TO_SWAP


def test_a_model_that_fits_the_budget_needs_no_rewrite(capsys, models, tmp_path):
    code, _, err = run(capsys, "rewrite", models["tf2"], tmp_path / "x", "--budget", "80GiB")
    assert code == ExitCode.NOTHING_TO_SWAP and "LMS is not needed" in err
    assert not (tmp_path / "x").exists()


def test_a_calibrated_budget_reports_the_fitted_term(capsys, models):
    code, out, _ = run(
        capsys,
        "simulate",
        models["tf2"],
        "--budget",
        "V100-16GB",
        "--tensor-factor",
        "1.5",
        "--json",
    )
    assert code == ExitCode.OK
    (graph,) = json.loads(out)["graphs"].values()
    terms = graph["simulation"]["memory_terms"]
    assert terms["calibration"] == round(0.5 * terms["tensors"])
    assert graph["simulation"]["stack"] == "tf2+calibrated"
    # the factor alone calibrates nothing: the command says what is missing
    code, _, err = run(capsys, "simulate", models["tf2"], "--tensor-factor", "1.5")
    assert code == ExitCode.USAGE and "set memory_budget" in err
