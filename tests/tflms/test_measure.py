"""The CPU judge: TensorFlow's allocator peak and op order against the simulator.

The measurement runs in a fresh process with oneDNN's allocator (the one the
published figures used, on any x86-64 CPU: ``measurement_env``) and one
inter-op thread: with
several, the CPU executor's op order (and so its peak) changes from process
to process (it sends ops it estimates as expensive to a thread pool).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tflms.errors import ConfigError
from tflms.simulation.measure import measure_cpu_step, ops_in_start_order
from tflms.utils.cpu import measurement_env

pytestmark = pytest.mark.measures  # TensorFlow's real allocator: run alone (make test)

REPO = Path(__file__).resolve().parents[2]

MEASURE = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tflms
    from tflms import zoo
    from tflms.simulation.measure import measure_cpu_step

    model = zoo.mlp(512, (2048, 2048, 2048), classes=100, optimizer=OPTIMIZER)
    x, y = zoo.synthetic_data(model, 256)
    step = tf.function(model.train_step, jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    data = (tf.constant(x), tf.constant(y))
    view = tflms.build_view(step.get_concrete_function(data).graph)
    m = measure_cpu_step(step, data, runs=3)
    matmuls = [n for n, d in view.nodes(data=True) if d["type"] == "MatMul"]
    print(json.dumps({
        **m.to_dict(),
        "optimizer": OPTIMIZER,
        "nodes": view.number_of_nodes(),
        "seen": len(set(m.order) & set(view.nodes)),
        "gradient_matmuls": [n for n in matmuls if n.startswith("gradient")],
        "order": [n for n in m.order if n in view],
        "replayed": {a: tflms.simulate(view, order=m.order, allocator=a).device_peak_bytes
                     for a in ("exact", "bfc")},
        "backwards": tflms.simulate(view, order=tuple(reversed(m.order))).device_peak_bytes,
    }))
    """
)


# Adam; and SGD with momentum, whose updates Keras routes through one IdentityN of all
# gradients that Grappler removes: each update runs as soon as its gradient exists.
@pytest.fixture(scope="module", params=["adam", "sgd"])
def measured(request):
    done = subprocess.run(
        [sys.executable, "-c", f"OPTIMIZER = {request.param!r}\n" + MEASURE],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=measurement_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_measures_peaks_and_the_executor_order(measured):
    m = measured
    assert len(m["peaks_bytes"]) == 3 and m["peak_bytes"] in m["peaks_bytes"]
    weights = 4 * (512 * 2048 + 2 * 2048 * 2048 + 2048 * 100)
    slots = 2 if m["optimizer"] == "adam" else 1  # Adam's two slots, SGD's momentum
    assert (1 + slots) * weights <= m["resident_bytes"] < m["peak_bytes"]
    assert m["inter_op_threads"] == 1 and m["ops_in_order"] > 0
    # Grappler's remapper fuses MatMul + BiasAdd + Relu of the forward pass on the
    # CPU, so not every op of the traced graph runs; the gradient MatMuls do.
    assert set(m["gradient_matmuls"]) <= set(m["order"])
    assert m["nodes"] / 3 < m["seen"] <= m["nodes"]


def test_simulated_peak_in_the_measured_order_is_close_to_the_allocators(measured):
    # Exact sizes: within 3.2% in six processes (three per optimizer) when this was written.
    # On an AVX2-only AMD EPYC about one SGD process in ten replays at +16%: that run's
    # profiled start order moves, not the memory model (the same before loops were
    # modelled); hence 20%.
    exact = measured["replayed"]["exact"] / measured["profiled_peak_bytes"] - 1
    assert abs(exact) <= 0.20, measured
    # The BFC model's chunks depend on the order of request sizes, which moves with the
    # measured order: +2.0% to +18.1% in those processes. Under two test workers (make
    # test), one SGD process here peaked at 151, 151 and 166 MB in its three runs, and the
    # replay of the profiled (166 MB) run came out 5.1% under it: hence -10%.
    bfc = measured["replayed"]["bfc"] / measured["profiled_peak_bytes"] - 1
    assert -0.10 <= bfc <= 0.25, measured


def test_a_replayed_order_never_breaks_dependencies(measured):
    # An absurd preference (the measured order backwards) still gives a valid step.
    assert measured["backwards"] > measured["resident_bytes"] / 2


def test_bad_arguments_and_missing_traces_are_named(tmp_path):
    import tflms

    with pytest.raises(ConfigError, match="runs must be"):
        measure_cpu_step(lambda: None, runs=0)
    with pytest.raises(ConfigError, match="No profiler trace"):
        ops_in_start_order(str(tmp_path))
    view = tflms.build_view(_tiny_graph())
    with pytest.raises(ConfigError, match="order must be a sequence of op names"):
        tflms.simulate(view, order="MatMul")


NO_STATS = textwrap.dedent(
    """
    import tensorflow as tf
    from tflms.errors import ConfigError
    from tflms.simulation.measure import measure_cpu_step
    try:
        measure_cpu_step(tf.function(lambda: tf.ones((4, 4)) * 2.0), runs=1, profile=False)
    except ConfigError as err:
        print(err)
    """
)


def test_a_cpu_without_allocator_statistics_is_told_what_to_set():
    # oneDNN off and the BFC allocator refused: TensorFlow's plain CPU allocator, which
    # keeps no statistics, on every CPU (what an AVX2-only CPU gets by default).
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPU_ALLOCATOR_USE_BFC="false")
    done = subprocess.run(
        [sys.executable, "-c", NO_STATS], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CPU:0 keeps no allocator statistics" in done.stdout, done.stdout
    assert "Start the process with TF_ENABLE_ONEDNN_OPTS=1" in done.stdout, done.stdout
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in done.stdout, done.stdout


def _tiny_graph():
    import tensorflow as tf

    @tf.function
    def f(x):
        return tf.nn.relu(x) * 2.0

    return f.get_concrete_function(tf.TensorSpec((8, 8))).graph
