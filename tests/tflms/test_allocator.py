"""The BFC allocator model against TensorFlow's own allocator, and its use by the simulator."""

import json
import random
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import tflms
from tflms.errors import ConfigError
from tflms.simulation import native
from tflms.simulation.allocator import (
    MIN_ALLOCATION,
    BFCModel,
    BufferReplay,
    replay_region,
    rounded,
)
from tflms.utils.cpu import measurement_env

MiB = 1 << 20

# Holds tensors of the given sizes in a fresh process and prints TensorFlow's
# bytes in use on the CPU after each step (tf.fill: a real allocation, never a
# cached constant).
_TF_REPLAY = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    one, held, out = tf.constant(1.0), {}, []
    for sequence in json.loads(sys.stdin.read()):
        for kind, key, n in sequence:
            if kind == "alloc":
                held[key] = tf.fill([n // 4], one)
            else:
                del held[key]
            out.append(tf.config.experimental.get_memory_info("CPU:0")["current"])
        held.clear()
        out.append(None)
    print(json.dumps(out))
    """
)


def _random_sequence(seed: int, steps: int = 50) -> list:
    rng = random.Random(seed)
    ops, live, total = [], {}, 0
    for k in range(steps):
        if live and (rng.random() < 0.4 or total > 1 << 30):
            key = rng.choice(sorted(live))
            total -= live.pop(key)
            ops.append(("free", f"{seed}-{key}", 0))
        else:
            n = int(2 ** rng.uniform(18, 28.5)) // 4 * 4  # 256 KiB .. 362 MiB
            live[k] = n
            total += n
            ops.append(("alloc", f"{seed}-{k}", n))
    for key in sorted(live):  # the sequence ends empty, as the next one starts in TF
        ops.append(("free", f"{seed}-{key}", 0))
    return ops


@pytest.mark.slow
def test_model_reports_what_tensorflows_cpu_allocator_reports():
    """Random allocation sequences in a fresh TensorFlow process and in one model: the bytes
    in use agree exactly after every step (rounding, unsplit chunks, growth, coalescing)."""
    sequences = [_random_sequence(seed) for seed in range(4)]
    proc = subprocess.run(
        [sys.executable, "-c", _TF_REPLAY],
        input=json.dumps(sequences),
        capture_output=True,
        text=True,
        timeout=300,
        env=measurement_env(),  # oneDNN's allocator, which BFCModel models, on any CPU
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    model, handles, predicted = BFCModel(), {}, []
    for sequence in sequences:
        for kind, key, n in sequence:
            if kind == "alloc":
                handles[key] = model.allocate(n)
            else:
                model.free(handles.pop(key))
            predicted.append(model.in_use)
        predicted.append(None)
    assert len(measured) == len(predicted)
    wrong = [(i, m, p) for i, (m, p) in enumerate(zip(measured, predicted, strict=True)) if m != p]
    assert not wrong, f"{len(wrong)} of {len(measured)} steps differ (step, tf, model): {wrong[:5]}"
    assert (
        sum(m != n for m, n in zip(measured, [None] + measured[:-1], strict=True)) > 100
    )  # it moved


def test_rounding_and_the_two_split_rules():
    assert rounded(1) == MIN_ALLOCATION and rounded(256) == 256 and rounded(257) == 512
    bfc = BFCModel()
    a = bfc.allocate(3 * MiB)  # a 4 MiB region (2 MiB is too small): < 2x, taken whole
    assert bfc.in_use == 4 * MiB and bfc.region_bytes == 4 * MiB
    bfc.free(a)
    bfc.allocate(1 * MiB)  # 4 MiB >= 2 x 1 MiB: split
    assert bfc.in_use == 1 * MiB
    big = BFCModel()
    big.allocate(300 * MiB)  # region 512 MiB: the 212 MiB rest >= 128 MiB, split
    assert big.in_use == 300 * MiB and big.region_bytes == 512 * MiB


def test_freed_neighbours_coalesce_within_a_region():
    bfc = BFCModel(allow_growth=False, limit_bytes=64 * MiB)  # one region, as a GPU
    a, b, _c = (bfc.allocate(8 * MiB) for _ in range(3))
    bfc.free(a)
    bfc.free(_c)  # merges with the free tail: 48 MiB at 16 MiB
    assert bfc.allocate(30 * MiB) is not None  # best fit is the 48 MiB chunk, < 2x: whole
    assert bfc.in_use == 8 * MiB + 48 * MiB
    bfc.free(b)  # merges with a: 16 MiB free at the front
    assert bfc.allocate(16 * MiB) is not None and bfc.in_use == 64 * MiB
    assert bfc.allocate(MiB) is None and bfc.failed == 1
    assert bfc.high_water == 64 * MiB


def test_replay_warms_the_regions_before_the_measured_step():
    events = [(0, 3 * MiB, 1), (1, 5 * MiB, 1), (0, 3 * MiB, -1), (1, 5 * MiB, -1)]
    replay = BufferReplay.warmed([MiB], events)
    assert replay.in_use == replay.model.peak == MiB  # variables only; the peak restarted
    for buffer, nbytes, sign in events:
        replay.event(buffer, nbytes, sign)
    assert replay.model.peak >= 1 * MiB + 3 * MiB + 5 * MiB


def test_unknown_allocator_and_bfc_under_grappler_accounting_are_refused():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 1000], name="x")
        tf.nn.relu(x, name="y")
    view = tflms.build_view(g)
    with pytest.raises(ConfigError, match="allocator must be one of"):
        tflms.simulate(view, allocator="tcmalloc", accounting="tensors")
    with pytest.raises(ConfigError, match="accounting='tensors'"):
        tflms.simulate(view, allocator="bfc", accounting="grappler")
    with pytest.raises(ConfigError, match="limit_bytes"):
        BFCModel(allow_growth=False)


def test_bfc_peak_counts_chunks_not_tensors():
    # 3 MiB tensors get 4 MiB chunks: the BFC peak is above the exact one, by the rounding.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3 * MiB // 4], name="x")
        y = tf.math.sin(x, name="y")
        tf.add(tf.math.cos(x, name="z"), y, name="w")
    view = tflms.build_view(g)
    exact = tflms.simulate(view, accounting="tensors")
    bfc = tflms.simulate(view, allocator="bfc", accounting="tensors")
    assert exact.allocator == "exact" and bfc.allocator == "bfc"
    assert exact.device_peak_bytes == 3 * 3 * MiB
    assert bfc.device_peak_bytes > exact.device_peak_bytes
    assert bfc.to_dict(timeline=False)["allocator"] == "bfc"


def _random_step(rng: random.Random, n_buffers: int) -> tuple[list, list, list]:
    """Buffers and a valid event order: each allocated once, freed later (or never)."""
    spaces = rng.choices(["device", "host", "workspace"], weights=[8, 1, 1], k=n_buffers)
    sizes = [
        rng.choice([rng.randint(1, 4096), rng.randint(1, 8 * MiB), rng.randint(100, 400) * MiB])
        for _ in range(n_buffers)
    ]
    events, live = [], []
    for b in range(n_buffers):
        while live and rng.random() < 0.5:  # free some of the live buffers, in random order
            events.append((live.pop(rng.randrange(len(live))), -1))
        events.append((b, 1))
        live.append(b)
        if rng.random() < 0.3:
            events.append((-1, 0))  # a timeline point
    rng.shuffle(live)
    events += [(b, -1) for b in live[: len(live) // 2]]  # the rest outlive the step
    return spaces, sizes, events


@pytest.mark.skipif(not native.COMPILED, reason="kernels not built (no C compiler)")
def test_compiled_region_replay_matches_the_python_model_on_random_steps():
    rng = random.Random(7)
    for trial in range(300):
        spaces, sizes, events = _random_step(rng, rng.randint(1, 120))
        resident = [rng.randint(0, 2 * MiB) for _ in range(rng.randint(0, 5))]
        limit = rng.choice([64 * MiB, 1 << 33, 1 << 40])
        extra = rng.choice([0.0, 0.05, 0.137])
        args = (spaces, sizes, events, resident)
        fast = replay_region(*args, limit=limit, extra=extra, compiled=True)
        reference = replay_region(*args, limit=limit, extra=extra, compiled=False)
        assert fast == reference, f"trial {trial}"


@pytest.mark.skipif(not native.COMPILED, reason="kernels not built (no C compiler)")
def test_compiled_region_replay_matches_on_a_real_step(monkeypatch):
    from tflms import zoo
    from tflms.simulation import memory

    view = tflms.analyze(zoo.resnet50(64), batch_size=8)
    plan = tflms.make_plan(view, tflms.LMSConfig(swapout_threshold=4))
    rewritten = tflms.apply_to_view(view, plan)
    results = {}
    for compiled in (True, False):
        monkeypatch.setattr(
            memory,
            "replay_region",
            lambda *a, compiled=compiled, **k: replay_region(*a, compiled=compiled, **k),
        )
        results[compiled] = tflms.simulate(rewritten, device="V100-16GB", link="pcie3")
    fast, reference = results[True], results[False]
    assert fast.swap_outs > 0 and fast.host_peak_bytes > 0  # host buffers too
    assert fast.memory_terms["allocator"] > 0  # the chunks' rounding and fragmentation
    assert fast.to_dict() == reference.to_dict()


def test_region_replay_counts_chunks_and_the_workspace_limit():
    spaces = ["device", "device", "workspace", "host", "workspace"]
    sizes = [3 * MiB + 1, MiB, 8 * MiB, 5 * MiB, 100 * MiB]
    events = [(0, 1), (1, 1), (-1, 0), (2, 1), (3, 1), (4, 1), (-1, 0), (2, -1), (0, -1), (-1, 0)]
    for compiled in {False, native.COMPILED}:
        found = replay_region(spaces, sizes, events, [MiB], limit=20 * MiB, compiled=compiled)
        chunk0 = 3 * MiB + MIN_ALLOCATION  # rounded up
        assert found.in_use == [MiB + chunk0 + MiB, MiB + chunk0 + 9 * MiB, 2 * MiB]
        assert found.tensors == [MiB + 3 * MiB + 1 + MiB] * 2 + [2 * MiB]
        assert found.host == [0, 5 * MiB, 5 * MiB]
        # the 100 MiB workspace would end above the 20 MiB limit: not taken
        assert found.high_water == MiB + chunk0 + 9 * MiB and found.workspace_at_high == 8 * MiB


def test_compiled_replay_that_was_not_built_is_refused(monkeypatch):
    monkeypatch.setattr(native, "kernels", None)
    with pytest.raises(ConfigError, match="kernels was not built"):
        replay_region(["device"], [1], [(0, 1)], [], limit=1 << 30, compiled=True)


def test_simulator_kernels_are_compiled_here():
    # optional for users without a C compiler; this machine has one
    assert native.COMPILED, (
        "tflms.simulation.kernels was not built (every simulated plan replays its buffers "
        "and schedules in Python, slower); reinstall with a C compiler: pip install -e ."
    )


@pytest.mark.skipif(not native.COMPILED, reason="kernels not built (no C compiler)")
def test_compiled_kernels_refuse_input_out_of_range():
    from array import array

    with pytest.raises(ValueError, match="sign 2"):
        replay_region(["device"], [10], [(0, 2)], [], limit=1 << 40, compiled=True)
    with pytest.raises(TypeError, match="two ints"):
        replay_region(["device"], [10], [(0, "1")], [], limit=1 << 40, compiled=True)
    with pytest.raises(ValueError, match="buffer 0 has"):  # would overflow int64 arithmetic
        replay_region(["device"], [2**63 - 1], [(0, 1)], [], limit=1 << 40, compiled=True)
    assert native.kernels is not None
    one_op = (array("d", [1.0]), array("q", [0, 0]), array("q"), array("q", [0]), array("q", [0]))
    for lane, compute in ((-1, 0), (2**31 - 1, 0), (0, (1 << 32) + 5)):  # out of its arrays
        with pytest.raises(ValueError, match="lane"):
            native.kernels.first_ready(array("i", [lane]), *one_op, compute, 1, 1e-6)
