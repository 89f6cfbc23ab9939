"""What ``LMSConfig.check_rewrites`` buys and costs, measured on this CPU.

Run by ``make bench`` (or ``python benchmarks/bench_rewrite_check.py [--models a,b]``;
``--cost-only`` re-measures the cost part alone, on a quiet machine).

* **Effect.** Each model of ``tests/tflms/users_models.py`` (families the
  planner's rules were not written for) trains 3 steps plainly, then under
  three aggressive option sets with the check on and off, on the two logical
  CPU devices the tests use (compute on ``CPU:1``, host ``CPU:0``). Recorded:
  the largest weight difference from plain training, the plan's swaps and
  recomputations, and the check's rounds and pinned ops.
* **Cost.** The zoo's GPT-2 (width 32, 12 and 48 blocks) is traced, and the
  two Grappler passes of one check round are timed (the step without the plan,
  once per step, and with it), with the machine's load average beside them.

Real training on this CPU, no simulation. Writes ``benchmarks/results/rewrite_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(  # before anything starts TensorFlow's devices
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import numpy as np  # noqa: E402

import tflms  # noqa: E402
from benchmarks.common import RESULTS, write_result  # noqa: E402
from tests.tflms.models import same_names  # noqa: E402
from tests.tflms.test_rewrite_check import BATCH, OPTION_SETS, STEPS  # noqa: E402
from tests.tflms.users_models import USERS_MODELS, users_data  # noqa: E402
from tflms import zoo  # noqa: E402
from tflms.graph.grappler_rules import NOT_RECOMPUTED, PINNED  # noqa: E402
from tflms.simulation.grappler.rewrites import RewriteGuard, check_device  # noqa: E402
from tflms.utils.cpu import cpu_state  # noqa: E402

DEVICE = "/device:CPU:1"


def train(name: str, options: dict | None, check: bool) -> tuple[list, dict]:
    same_names()  # every run under the same layer names (tests/tflms/models.py)
    model = USERS_MODELS[name]()
    x, y = users_data(model, BATCH * STEPS)
    callbacks = []
    if options is not None:
        callbacks = [tflms.LMSCallback(batch_size=BATCH, check_rewrites=check, **options)]
    with tf.device(DEVICE):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    if not callbacks:
        return model.get_weights(), {}
    trace = callbacks[0].traces[0]
    plan, view = trace.plan, trace.view
    last = plan.notes[-1] if plan.notes else ""
    facts = {
        "swaps": len(plan.swaps),
        "recomputes": len(plan.recomputes),
        "order_edges": len(plan.order),
        "pinned": len(view.graph.get(PINNED, ())),
        "kept_from_recomputation": len(view.graph.get(NOT_RECOMPUTED, ())),
        "check_note": last if check else None,
    }
    return model.get_weights(), facts


def effect(models: list[str]) -> list[dict]:
    rows = []
    for name in models:
        plain, _ = train(name, None, True)
        for options in sorted(OPTION_SETS):
            for check in (True, False):
                row = {"model": name, "options": options, "check": check}
                try:
                    weights, facts = train(name, OPTION_SETS[options], check)
                except Exception as err:  # recorded: a plan TensorFlow refuses to run
                    row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
                    rows.append(row)
                    print(f"{name:16s} {options:9s} check={check!s:5s} {row['error']}")
                    continue
                diff = max(
                    float(np.max(np.abs(a - b))) for a, b in zip(plain, weights, strict=True)
                )
                rows.append(row | {"max_abs_diff": diff} | facts)
                print(f"{name:16s} {options:9s} check={check!s:5s} diff={diff:.3g} {facts}")
    return rows


def cost() -> list[dict]:
    rows = []
    for layers in (12, 48):
        model = zoo.gpt2(vocab=97, seq=32, dim=32, heads=4, layers=layers)
        x, y = zoo.synthetic_data(model, BATCH)
        model.train_on_batch(x, y)

        @tf.function
        def step(x, y, model=model):
            return model.train_step((x, y))

        specs = (
            tf.TensorSpec([BATCH, *x.shape[1:]], x.dtype),
            tf.TensorSpec([BATCH, *y.shape[1:]], y.dtype),
        )
        graph = step.get_concrete_function(*specs).graph
        config = tflms.LMSConfig(batch_size=BATCH, device=DEVICE, check_rewrites=False)
        view = tflms.build_view(graph, config=config)
        plan = tflms.make_plan(view, config.replace(swapout_threshold=8, min_tensor_bytes=0))
        guard = RewriteGuard(
            graph,
            fetches=[t.op.name for t in graph.outputs] + [o.name for o in graph.control_outputs],
            device=check_device(view),
            host_device="/device:CPU:0",
            batch_size=BATCH,
        )
        load = os.getloadavg()[0]  # other work on the 2 cores inflates the time
        started = time.perf_counter()
        check = guard.check(plan)  # both passes: the step without the plan, and with it
        seconds = time.perf_counter() - started
        rows.append(
            {
                "model": f"gpt2 {layers} blocks",
                "ops": len(graph.as_graph_def().node),
                "swaps": len(plan.swaps),
                "agree": check.agree,
                "first_round_seconds": round(seconds, 2),
                "load_average_1min": round(load, 2),
            }
        )
        print(rows[-1])
    return rows


def summary(effect: list[dict]) -> dict:
    """Counts over the runs: bitwise with and without the check, and silent differences
    (the check said Grappler rewrites the step alike, yet the weights differ)."""
    on = [r for r in effect if r["check"]]
    off = [r for r in effect if not r["check"]]
    agreed = [
        r for r in on if str(r.get("check_note")).startswith("Grappler rewrites the step alike")
    ]
    return {
        "runs": len(on),
        "bitwise_with_check": sum(r.get("max_abs_diff") == 0 for r in on),
        "bitwise_without_check": sum(r.get("max_abs_diff") == 0 for r in off),
        "failed_with_check": sum("error" in r for r in on),
        "failed_without_check": sum("error" in r for r in off),
        "worst_with_check": max(r.get("max_abs_diff", 0.0) for r in on),
        "worst_without_check": max(r.get("max_abs_diff", 0.0) for r in off),
        "swap_runs_bitwise_with_check": all(
            r.get("max_abs_diff") == 0 for r in on if r["options"] == "swap"
        ),
        "check_agreed": len(agreed),
        "differ_though_check_agreed": sum(r.get("max_abs_diff") != 0 for r in agreed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(USERS_MODELS))
    parser.add_argument(
        "--cost-only",
        action="store_true",
        help="re-measure only the check's cost, into the existing JSON (on a quiet machine)",
    )
    parser.add_argument(
        "--effect-only",
        action="store_true",
        help="re-measure only the training runs, keeping the check's cost from the existing JSON",
    )
    args = parser.parse_args()
    if args.cost_only or args.effect_only:
        result = json.loads((RESULTS / "rewrite_check.json").read_text())
        if args.cost_only:
            result["cost"] = cost()
            result["cost_cpu"] = cpu_state()
        else:
            result.setdefault("cost_cpu", result["cpu"])  # the machine the cost was measured on
            result.update(cpu=cpu_state(), tensorflow=tf.__version__)
            result["effect"] = effect(args.models.split(","))
        result["summary"] = summary(result["effect"])
        print(write_result("rewrite_check.json", result))
        return
    models = args.models.split(",")
    result = {
        "measured": "on this CPU (real training, two logical devices); nothing simulated",
        "batch": BATCH,
        "steps": STEPS,
        "option_sets": OPTION_SETS,
        "cpu": cpu_state(),
        "tensorflow": tf.__version__,
        "effect": effect(models),
        "cost": cost(),
    }
    result["summary"] = summary(result["effect"])
    print(write_result("rewrite_check.json", result))


if __name__ == "__main__":
    main()
