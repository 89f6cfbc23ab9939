"""numba ports of the two C extensions' hot loops, timed beside the C code (issue 46).

The project keeps two optional C extensions "to the bit" equal to Python
references: ``tflms/simulation/kernels.c`` (the BFC allocator replay
``replay_region`` and the FirstReady list scheduler ``first_ready``) and
``ddl_tf/core/numerics/halfkernels.c`` (float16/bfloat16 <-> float32). numba
could replace them with Python source compiled at run time. This script ports
the loops to ``numba.njit`` (the same rules, line for line), checks the ports
give the C results bit for bit, and measures what a choice needs:

* inputs: the replay and schedule arguments the simulator really produces for
  three steps (GPT-2 small with its default LMS plan, GPT-2 small plain,
  ResNet-50 with swaps), captured from the project venv by recording the
  arguments of the compiled kernels during ``tflms.simulate``; plus how many
  kernel calls a GPT-2 small ``tflms.autotune`` makes and the seconds spent in
  them (what any faster kernel could save in one CLI run);
* equality: numba against C (and so against the Python references, which the
  capture checks C against) on those steps, on 300 random replays (workspaces,
  the ``extra`` rounding), on all 65,536 float16 bit patterns and on about
  20 million float32 patterns (every tie position of the rounding included);
* compile time: fresh processes, ``import numba`` and the first call of each
  kernel (compile + run), without a cache, with ``cache=True`` and an empty
  cache (compile + write), and with that cache filled (load); the C
  extensions' import and first call in a fresh process beside them;
* speed: per call, steady state, best and median of interleaved rounds, C and
  numba side by side in one process (numba both on ready arrays and from the
  simulator's list of event tuples, with the results turned back into lists
  as the C kernel returns them); from the capture (the project venv, same
  rounds): the Python references, and the C kernels as the simulator calls
  them (``allocator.replay_region``, ``schedule.first_ready``: their Python
  glue included).

numba is not a dependency (and must not be installed into ``.venv``). Run it
from a throwaway venv with the same Python as ``.venv`` (the C extensions are
loaded from the source tree, so the ABI must match):

    python3 -m venv /tmp/numba-venv
    /tmp/numba-venv/bin/pip install numba numpy
    /tmp/numba-venv/bin/python benchmarks/bench_numba_kernels.py

It starts ``.venv/bin/python benchmarks/bench_numba_kernels.py --capture FILE``
itself for the inputs (about a minute: GPT-2 small's analysis and one
autotune). Options: ``--quick`` (fewer rounds, a 2-layer GPT-2, no autotune;
for trying the script, not for the results), ``--inputs FILE`` (reuse a
capture). Writes ``benchmarks/results/numba_kernels.json``. Under ``make
bench`` (the project venv, without numba) it says so and exits 0, leaving the
results as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
OUT = RESULTS / "numba_kernels.json"
PROJECT_PYTHON = REPO / ".venv" / "bin" / "python"
CACHE_ENV = "TFLMS_BENCH_NUMBA_CACHE"  # "1": the kernels are compiled with cache=True
MiB = 1 << 20

try:
    import numba
except ImportError:  # the project venv: main() skips
    numba = None

if numba is not None:
    _jit = numba.njit(cache=os.environ.get(CACHE_ENV) == "1")
else:

    def _jit(fn):
        return fn


# --------------------------------------------------------------------------- the BFC replay
# kernels.c's replay_region, rule for rule. The chunks are columns of one int64 array; the
# allocator's counters are an int64 array the helpers update.

_OFF, _SIZE, _PREV, _NEXT, _FREE = 0, 1, 2, 3, 4  # rows of `ch`
_N, _SPARE, _ORDER, _IN_USE, _HIGH = 0, 1, 2, 3, 4  # entries of `st`
MIN_ALLOCATION = 256
MAX_INTERNAL_FRAGMENTATION = 128 << 20


@_jit
def _lower(ch, order, n_order, size, off):
    """First position in the free order whose (size, off) is not below (size, off)."""
    lo, hi = 0, n_order
    while lo < hi:
        mid = (lo + hi) // 2
        c = order[mid]
        if ch[_SIZE, c] < size or (ch[_SIZE, c] == size and ch[_OFF, c] < off):
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def _put(ch, st, order, c):
    n = st[_ORDER]
    at = _lower(ch, order, n, ch[_SIZE, c], ch[_OFF, c])
    for k in range(n, at, -1):
        order[k] = order[k - 1]
    order[at] = c
    st[_ORDER] = n + 1
    ch[_FREE, c] = 1


@_jit
def _take_at(ch, st, order, at):
    n = st[_ORDER]
    c = order[at]
    for k in range(at, n - 1):
        order[k] = order[k + 1]
    st[_ORDER] = n - 1
    ch[_FREE, c] = 0


@_jit
def _new_chunk(ch, st, spare, off, size):
    if st[_SPARE] > 0:
        st[_SPARE] -= 1
        c = spare[st[_SPARE]]
    else:
        c = st[_N]
        st[_N] += 1
    ch[_OFF, c] = off
    ch[_SIZE, c] = size
    ch[_PREV, c] = -1
    ch[_NEXT, c] = -1
    ch[_FREE, c] = 0
    return c


@_jit
def _allocate(ch, st, order, spare, nbytes, has_below, below):
    if nbytes <= 0:
        return -1
    size = (nbytes + MIN_ALLOCATION - 1) // MIN_ALLOCATION * MIN_ALLOCATION
    at = _lower(ch, order, st[_ORDER], size, -1)
    if at == st[_ORDER]:
        return -1
    c = order[at]
    if has_below and ch[_OFF, c] + size > below:
        return -1
    _take_at(ch, st, order, at)
    rest_size = ch[_SIZE, c] - size
    if rest_size >= size or rest_size >= MAX_INTERNAL_FRAGMENTATION:
        rest = _new_chunk(ch, st, spare, ch[_OFF, c] + size, rest_size)
        ch[_PREV, rest] = c
        ch[_NEXT, rest] = ch[_NEXT, c]
        if ch[_NEXT, c] >= 0:
            ch[_PREV, ch[_NEXT, c]] = rest
        ch[_NEXT, c] = rest
        ch[_SIZE, c] = size
        _put(ch, st, order, rest)
    st[_IN_USE] += ch[_SIZE, c]
    end = ch[_OFF, c] + ch[_SIZE, c]
    if end > st[_HIGH]:
        st[_HIGH] = end
    return c


@_jit
def _merge(ch, st, spare, left, right):
    ch[_SIZE, left] += ch[_SIZE, right]
    ch[_NEXT, left] = ch[_NEXT, right]
    if ch[_NEXT, right] >= 0:
        ch[_PREV, ch[_NEXT, right]] = left
    spare[st[_SPARE]] = right
    st[_SPARE] += 1


@_jit
def _free(ch, st, order, spare, c):
    st[_IN_USE] -= ch[_SIZE, c]
    after, before = ch[_NEXT, c], ch[_PREV, c]
    if after >= 0 and ch[_FREE, after]:
        _take_at(ch, st, order, _lower(ch, order, st[_ORDER], ch[_SIZE, after], ch[_OFF, after]))
        _merge(ch, st, spare, c, after)
    if before >= 0 and ch[_FREE, before]:
        _take_at(ch, st, order, _lower(ch, order, st[_ORDER], ch[_SIZE, before], ch[_OFF, before]))
        _merge(ch, st, spare, before, c)
        c = before
    _put(ch, st, order, c)


@_jit
def replay_region_nb(space, nbytes, ev_buffer, ev_sign, resident, region, limit, extra):
    """kernels.replay_region on arrays: space uint8, the rest int64; returns arrays and ints."""
    n_events = ev_buffer.size
    n_points = 0
    for e in range(n_events):
        if ev_sign[e] == 0:
            n_points += 1
    cap = 2 + resident.size + n_events  # an allocation splits off at most one chunk
    ch = np.zeros((5, cap), np.int64)
    order = np.empty(cap, np.int64)
    spare = np.empty(cap, np.int64)
    st = np.zeros(5, np.int64)
    handle = np.full(nbytes.size, -1, np.int64)
    in_use = np.empty(n_points, np.int64)
    tensors_at = np.empty(n_points, np.int64)
    host_at = np.empty(n_points, np.int64)
    first = _new_chunk(
        ch, st, spare, 0, (region + MIN_ALLOCATION - 1) // MIN_ALLOCATION * MIN_ALLOCATION
    )
    _put(ch, st, order, first)
    tensors = 0
    for r in range(resident.size):
        _allocate(ch, st, order, spare, resident[r], False, 0)
        tensors += resident[r]
    tensor_peak = tensors
    high = st[_HIGH]
    workspace = workspace_at_high = host = 0
    p = 0
    for e in range(n_events):
        s = ev_sign[e]
        if s == 0:
            in_use[p] = st[_IN_USE]
            tensors_at[p] = tensors
            host_at[p] = host
            p += 1
            continue
        b = ev_buffer[e]
        nb = nbytes[b]
        if space[b] == 0:  # a device tensor
            if s > 0:
                handle[b] = _allocate(ch, st, order, spare, nb, False, 0)
                tensors += nb
                if tensors > tensor_peak:
                    tensor_peak = tensors
            else:
                if handle[b] >= 0:
                    _free(ch, st, order, spare, handle[b])
                handle[b] = -1
                tensors -= nb
        elif space[b] == 1:  # on the host
            host += nb if s > 0 else -nb
        elif s > 0:  # a workspace: only under the limit
            below = limit - np.int64(np.rint(extra * tensors))
            c = _allocate(ch, st, order, spare, nb, True, below)
            if c >= 0:
                handle[b] = c
                workspace += nb
        elif handle[b] >= 0:
            _free(ch, st, order, spare, handle[b])
            handle[b] = -1
            workspace -= nb
        if st[_HIGH] > high:
            high = st[_HIGH]
            workspace_at_high = workspace
    return in_use, tensors_at, host_at, tensor_peak, high, workspace_at_high


_BUFFER, _SIGN = itemgetter(-2), itemgetter(-1)


def replay_arrays(args) -> tuple:
    """The C kernel's arguments as the numba kernel's arrays (events: two int64 columns)."""
    codes, sizes, events, resident, region, limit, extra = args
    n = len(events)
    return (
        np.frombuffer(codes, np.uint8),
        np.frombuffer(sizes, np.int64),
        np.fromiter(map(_BUFFER, events), np.int64, n),
        np.fromiter(map(_SIGN, events), np.int64, n),
        np.frombuffer(resident, np.int64),
        region,
        limit,
        extra,
    )


def replay_region_numba(*args) -> tuple:
    """The numba replay called as the C one is: from the event tuples, returning lists."""
    in_use, tensors, host, peak, high, ws = replay_region_nb(*replay_arrays(args))
    return in_use.tolist(), tensors.tolist(), host.tolist(), int(peak), int(high), int(ws)


# --------------------------------------------------------------------------- FirstReady


@_jit
def _push(ht, hr, ho, n, t, r, op):
    i = n
    while i > 0:
        parent = (i - 1) // 2
        if not (t < ht[parent] or (t == ht[parent] and r < hr[parent])):
            break
        ht[i], hr[i], ho[i] = ht[parent], hr[parent], ho[parent]
        i = parent
    ht[i], hr[i], ho[i] = t, r, op
    return n + 1


@_jit
def _pop(ht, hr, ho, n):
    top_t, top_op = ht[0], ho[0]
    n -= 1
    lt, lr, lo = ht[n], hr[n], ho[n]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and (
            ht[child + 1] < ht[child] or (ht[child + 1] == ht[child] and hr[child + 1] < hr[child])
        ):
            child += 1
        if not (ht[child] < lt or (ht[child] == lt and hr[child] < lr)):
            break
        ht[i], hr[i], ho[i] = ht[child], hr[child], ho[child]
        i = child
    if n > 0:
        ht[i], hr[i], ho[i] = lt, lr, lo
    return top_t, top_op, n


@_jit
def first_ready_nb(lane, duration, offset, target, waiting0, rank, compute, h2d, dispatch_s):
    """kernels.first_ready on arrays; returns (order, start, end, alloc, busy, lanes_used)."""
    n = duration.size
    n_lanes = max(compute, h2d) + 1
    for i in range(n):
        if lane[i] + 1 > n_lanes:
            n_lanes = lane[i] + 1
    waiting = waiting0.copy()
    ready_at = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    alloc = np.zeros(n)
    lane_free = np.zeros(n_lanes)
    busy = np.zeros(n_lanes)
    seen = np.zeros(n_lanes, np.bool_)
    used = np.empty(n_lanes, np.int64)
    order = np.empty(n, np.int64)
    ht = np.empty(max(n, 1))
    hr = np.empty(max(n, 1), np.int64)
    ho = np.empty(max(n, 1), np.int64)
    n_heap = n_used = n_order = 0
    for i in range(n):
        if waiting[i] == 0:
            n_heap = _push(ht, hr, ho, n_heap, 0.0, rank[i], i)
    while n_heap > 0:
        t_ready, i, n_heap = _pop(ht, hr, ho, n_heap)
        lane_i = lane[i]
        if lane_i == h2d:  # dispatched by the compute stream's executor, in order
            dispatch = t_ready if t_ready > lane_free[compute] else lane_free[compute]
            lane_free[compute] = dispatch + dispatch_s
            t_ready = dispatch + dispatch_s
        t0 = t_ready if t_ready > lane_free[lane_i] else lane_free[lane_i]
        t1 = t0 + duration[i]
        start[i] = t0
        end[i] = t1
        alloc[i] = t_ready if lane_i == h2d else t0
        lane_free[lane_i] = t1
        busy[lane_i] = busy[lane_i] + duration[i]
        if not seen[lane_i]:
            seen[lane_i] = True
            used[n_used] = lane_i
            n_used += 1
        order[n_order] = i
        n_order += 1
        for e in range(offset[i], offset[i + 1]):
            j = target[e]
            if t1 > ready_at[j]:
                ready_at[j] = t1
            waiting[j] -= 1
            if waiting[j] == 0:
                n_heap = _push(ht, hr, ho, n_heap, ready_at[j], rank[j], j)
    return order[:n_order], start, end, alloc, busy, used[:n_used]


def schedule_arrays(args) -> tuple:
    """The C kernel's buffers as numpy arrays (no copies)."""
    lanes, durations, offsets, targets, waiting, rank, compute, h2d, dispatch = args
    return (
        np.frombuffer(lanes, np.int32),
        np.frombuffer(durations, np.float64),
        np.frombuffer(offsets, np.int64),
        np.frombuffer(targets, np.int64),
        np.frombuffer(waiting, np.int64),
        np.frombuffer(rank, np.int64),
        compute,
        h2d,
        dispatch,
    )


def first_ready_numba(*args) -> tuple:
    """The numba schedule called as the C one is: from the buffers, returning lists."""
    return tuple(a.tolist() for a in first_ready_nb(*schedule_arrays(args)))


# --------------------------------------------------------------------------- 16-bit floats
# halfkernels.c converts float16 with F16C instructions; numba has no float16 type on the
# CPU (np.float16 in a jitted function: NotImplementedError), so these are the integer
# algorithms (round to nearest, ties to even; overflow to inf; subnormals kept; a NaN stays
# a quiet NaN of the same sign, as F16C gives it).


@_jit
def f32_to_f16_nb(src, bits, dst):
    """``src`` float32 (``bits``: the same memory as uint32) rounded into uint16 ``dst``."""
    for i in range(bits.size):
        x = bits[i]
        sign = (x >> 16) & 0x8000
        ax = x & 0x7FFFFFFF
        if ax >= 0x47800000:  # 65536 and above, inf, NaN
            h = 0x7E00 | ((ax >> 13) & 0x3FF) if ax > 0x7F800000 else 0x7C00
        elif ax >= 0x38800000:  # a normal half: rebias, round 13 bits away (ties to even)
            r = ax - 0x38000000
            h = (r + 0xFFF + ((r >> 13) & 1)) >> 13
        else:  # a subnormal half or zero: |x| * 2**24, rounded to an integer, ties to even
            h = np.int64(np.rint(np.abs(np.float64(src[i])) * 16777216.0))
        dst[i] = sign | h


@_jit
def f16_to_f32_nb(src, bits, dst):
    """uint16 ``src`` (float16 bits) into float32 ``dst`` (``bits``: the same memory as uint32)."""
    for i in range(src.size):
        h = np.uint32(src[i])
        sign = (h & 0x8000) << 16
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        if e == 0x1F:  # inf, NaN (quieted)
            bits[i] = sign | 0x7F800000 | (m << 13) | (0x400000 if m else 0)
        elif e != 0:
            bits[i] = sign | ((e + 112) << 23) | (m << 13)
        else:  # zero, subnormal: m * 2**-24
            v = np.float32(m) * np.float32(5.9604644775390625e-08)
            dst[i] = -v if sign else v


@_jit
def f32_to_bf16_nb(bits, dst):
    for i in range(bits.size):
        u = np.int64(bits[i])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            dst[i] = ((u >> 16) | 0x40) & 0xFFFF  # a quiet NaN, same sign
        else:
            dst[i] = (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def to_f16(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    f32_to_f16_nb(src, src.view(np.uint32), out.view(np.uint16))
    return out


def to_f32(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    f16_to_f32_nb(src.view(np.uint16), out.view(np.uint32), out)
    return out


def to_bf16(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    f32_to_bf16_nb(src.view(np.uint32), out)
    return out


# --------------------------------------------------------------------------- capture (project venv)

STEPS = ("gpt2_small_lms", "gpt2_small", "resnet50_lms")
DEVICE, LINK = "V100-16GB", "pcie3"


def capture(path: Path, quick: bool) -> None:
    """Record the compiled kernels' arguments in real simulations; check C against Python."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from unittest import mock

    import tensorflow as tf

    import tflms
    from tflms import zoo
    from tflms.simulation import allocator, native, schedule, simulator
    from tflms.utils.cpu import cpu_state

    if not native.COMPILED:
        raise SystemExit("tflms.simulation.kernels is not built here: pip install -e . first")
    real = native.kernels
    calls: list[tuple[str, tuple, float]] = []

    class Recorder:
        def replay_region(self, *args):
            t = time.perf_counter()
            found = real.replay_region(*args)
            calls.append(("replay_region", args, time.perf_counter() - t))
            return found

        def first_ready(self, *args):
            t = time.perf_counter()
            found = real.first_ready(*args)
            calls.append(("first_ready", args, time.perf_counter() - t))
            return found

    graphs = []
    original = simulator.first_ready

    def recording_first_ready(graph, **kw):
        graphs.append(graph)
        return original(graph, **kw)

    gpt2 = zoo.gpt2(layers=2, seq=256) if quick else zoo.gpt2()
    t = time.perf_counter()
    gpt2_view = tflms.analyze(gpt2, batch_size=8)
    gpt2_s = time.perf_counter() - t
    resnet_view = tflms.analyze(zoo.resnet50(64), batch_size=8)
    views = {
        "gpt2_small_lms": tflms.apply_to_view(
            gpt2_view, tflms.make_plan(gpt2_view, tflms.LMSConfig())
        ),
        "gpt2_small": gpt2_view,
        "resnet50_lms": tflms.apply_to_view(
            resnet_view, tflms.make_plan(resnet_view, tflms.LMSConfig(swapout_threshold=4))
        ),
    }
    steps = []
    spaces_of = {0: "device", 1: "host", 2: "workspace"}
    rounds = 3 if quick else 7
    for name in STEPS:
        calls.clear()
        graphs.clear()
        with (
            mock.patch.object(native, "kernels", Recorder()),
            mock.patch.object(simulator, "first_ready", recording_first_ready),
        ):
            tflms.simulate(views[name], device=DEVICE, link=LINK)
        (replay_args,) = [args for kind, args, _ in calls if kind == "replay_region"]
        (schedule_args,) = [args for kind, args, _ in calls if kind == "first_ready"]
        (graph,) = graphs
        codes, sizes, events, resident, region, limit, extra = replay_args
        py_args = ([spaces_of[c] for c in codes], list(sizes), events, list(resident))
        replay_c = real.replay_region(*replay_args)
        reference = allocator._replay_region_py(*py_args, region, limit, extra)
        schedule_c = real.first_ready(*schedule_args)
        equal = {
            "replay_region": allocator.RegionReplay(*replay_c) == reference,
            "first_ready": schedule.first_ready(graph, compiled=True)
            == schedule._first_ready_py(graph),
        }
        assert all(equal.values()), (name, equal)
        variants = {
            "replay_python_s": lambda a=py_args, r=replay_args: allocator._replay_region_py(
                *a, *r[4:]
            ),
            # allocator.replay_region: its list-to-array work too
            "replay_c_as_called_s": lambda a=py_args, r=replay_args: allocator.replay_region(
                *a, limit=r[5], extra=r[6], compiled=True
            ),
            "first_ready_python_s": lambda g=graph: schedule._first_ready_py(g),
            "first_ready_c_as_called_s": lambda g=graph: schedule.first_ready(g, compiled=True),
        }
        timings = interleaved(variants, rounds)  # the same rounds as the numba venv's
        steps.append(
            {
                "name": name,
                "view_ops": views[name].number_of_nodes(),
                "scheduled_ops": len(graph),
                "buffers": len(codes),
                "events": len(events),
                "timeline_points": sum(1 for e in events if not e[-1]),
                "resident": len(resident),
                "c_equals_python": equal,
                "replay_args": replay_args,
                "replay_c": replay_c,
                "first_ready_args": schedule_args,
                "first_ready_c": schedule_c,
                "python_timings": timings,
            }
        )
    autotune = None
    if not quick:  # how much kernel time one CLI run (tflms simulate --budget) has to save
        calls.clear()
        with mock.patch.object(native, "kernels", Recorder()):
            t = time.perf_counter()
            tflms.autotune(gpt2_view, DEVICE)
            total = time.perf_counter() - t
        autotune = {
            "model": "GPT-2 small, batch 8",
            "budget": DEVICE,
            "seconds": round(total, 3),
            "replay_region_calls": sum(1 for kind, *_ in calls if kind == "replay_region"),
            "first_ready_calls": sum(1 for kind, *_ in calls if kind == "first_ready"),
            "replay_region_c_seconds": round(
                sum(s for kind, _, s in calls if kind == "replay_region"), 4
            ),
            "first_ready_c_seconds": round(
                sum(s for kind, _, s in calls if kind == "first_ready"), 4
            ),
        }
    data = {
        "steps": steps,
        "autotune": autotune,
        "gpt2_analysis_s": round(gpt2_s, 2),
        "versions": {"tensorflow": tf.__version__, "numpy": np.__version__},
        "cpu_state": cpu_state(),
        "quick": quick,
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the C extensions


def load_c_extensions() -> tuple:
    """``tflms.simulation.kernels`` and ``ddl_tf...halfkernels`` from the source tree, by path.

    Loading the shared objects directly avoids importing tflms (TensorFlow) in the numba venv.
    """
    import importlib.machinery
    import importlib.util
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    modules = []
    for name, folder in (("kernels", "tflms/simulation"), ("halfkernels", "ddl_tf/core/numerics")):
        path = REPO / folder / f"{name}{suffix}"
        if not path.exists():
            raise SystemExit(
                f"{path} is missing: build the extensions (make install) and run this with a "
                f"Python of the same version as .venv (this one: {platform.python_version()})."
            )
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        modules.append(module)
    return tuple(modules)


# --------------------------------------------------------------------------- equality


def _same_floats(a, b) -> bool:
    return np.asarray(a, np.float64).tobytes() == np.asarray(b, np.float64).tobytes()


def same_schedule(numba_result, c_result) -> bool:
    order, start, end, alloc, busy, used = numba_result
    c_order, c_start, c_end, c_alloc, c_busy, c_used = c_result
    return (
        list(order) == c_order
        and list(used) == c_used
        and all(
            _same_floats(x, y)
            for x, y in ((start, c_start), (end, c_end), (alloc, c_alloc), (busy, c_busy))
        )
    )


def _random_step(rng: random.Random, n_buffers: int) -> tuple[list, list, list]:
    """tests/tflms/test_allocator.py's random steps: each buffer allocated once, freed later."""
    spaces = rng.choices(["device", "host", "workspace"], weights=[8, 1, 1], k=n_buffers)
    sizes = [
        rng.choice([rng.randint(1, 4096), rng.randint(1, 8 * MiB), rng.randint(100, 400) * MiB])
        for _ in range(n_buffers)
    ]
    events, live = [], []
    for b in range(n_buffers):
        while live and rng.random() < 0.5:
            events.append((live.pop(rng.randrange(len(live))), -1))
        events.append((b, 1))
        live.append(b)
        if rng.random() < 0.3:
            events.append((-1, 0))
    rng.shuffle(live)
    events += [(b, -1) for b in live[: len(live) // 2]]
    return spaces, sizes, events


def check_random_replays(kernels, trials: int) -> int:
    """numba against C on random steps (workspaces, limits and ``extra`` roundings); mismatches."""
    from array import array

    rng = random.Random(7)
    codes_of = {"device": 0, "host": 1, "workspace": 2}
    wrong = 0
    for _ in range(trials):
        spaces, sizes, events = _random_step(rng, rng.randint(1, 120))
        resident = [rng.randint(0, 2 * MiB) for _ in range(rng.randint(0, 5))]
        limit = rng.choice([64 * MiB, 1 << 33, 1 << 40])
        extra = rng.choice([0.0, 0.05, 0.137])
        args = (
            bytes(codes_of[s] for s in spaces),
            array("q", sizes),
            events,
            array("q", resident),
            1 << 50,
            limit,
            extra,
        )
        wrong += replay_region_numba(*args) != kernels.replay_region(*args)
    return wrong


def float32_patterns() -> np.ndarray:
    """About 20 million float32 bit patterns: a stride over all 2**32, every half/bfloat16 tie."""
    spread = np.arange(0, 1 << 32, 257, dtype=np.uint64).astype(np.uint32)
    high = np.arange(1 << 19, dtype=np.uint32) << 13  # every sign/exponent/top-10-mantissa
    ties = [high | low for low in (0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF)]
    bf16 = np.arange(1 << 16, dtype=np.uint32) << 16
    ties += [bf16 | low for low in (0x7FFF, 0x8000, 0x8001)]
    # half subnormals (exponents 102..112): the ties sit at other bit positions
    sub = []
    for exponent in range(102, 113):
        for shift in range(1, 24):
            for top in (1, 3, 5, 0x155):
                tie = 1 << (shift - 1)
                for low in (0, tie - 1, tie, tie + 1):
                    sub.append((exponent << 23) | ((top << shift) & 0x7FFFFF) | low)
    sub_arr = np.array(sub, dtype=np.uint32)
    both = np.concatenate([spread, *ties, sub_arr, sub_arr | 0x80000000])
    return both.view(np.float32)


def _bits_equal_or_same_nan(a16: np.ndarray, b16: np.ndarray, nan) -> tuple[int, int]:
    """(mismatches outside NaN, NaN inputs whose outputs differ in bits but are NaN of a sign)."""
    diff = a16 != b16
    return int(np.count_nonzero(diff & ~nan)), int(np.count_nonzero(diff & nan))


def check_half(halfkernels) -> dict:
    """numba against C (and numpy) on every float16 and on float32_patterns()."""
    out: dict = {}
    h = np.arange(1 << 16, dtype=np.uint16)
    f_c, f_nb = np.empty(h.size, np.float32), np.empty(h.size, np.float32)
    assert halfkernels.to_float32(0, h.view(np.float16), f_c)
    to_f32(h.view(np.float16), f_nb)
    nan16 = np.isnan(h.view(np.float16))
    wrong, nan_bits = _bits_equal_or_same_nan(f_c.view(np.uint32), f_nb.view(np.uint32), nan16)
    numpy_wrong, _ = _bits_equal_or_same_nan(
        h.view(np.float16).astype(np.float32).view(np.uint32), f_nb.view(np.uint32), nan16
    )
    out["float16_to_float32"] = {
        "inputs": int(h.size),
        "mismatches_vs_c": wrong,
        "nan_bit_differences_vs_c": nan_bits,
        "mismatches_vs_numpy_outside_nan": numpy_wrong,
    }
    x = float32_patterns()
    nan32 = np.isnan(x)
    for name, kind, fn in (("float32_to_float16", 0, to_f16), ("float32_to_bfloat16", 1, to_bf16)):
        c, nb = np.empty(x.size, np.uint16), np.empty(x.size, np.uint16)
        assert halfkernels.from_float32(kind, x, c)
        fn(x, nb)
        wrong, nan_bits = _bits_equal_or_same_nan(c, nb, nan32)
        nan_ok = bool(
            np.all((nb[nan32] & 0x7FFF) > (0x7C00 if kind == 0 else 0x7F80))
            and np.all((nb[nan32] >> 15) == (x.view(np.uint32)[nan32] >> 31))
        )
        out[name] = {
            "inputs": int(x.size),
            "mismatches_vs_c": wrong,
            "nan_bit_differences_vs_c": nan_bits,
            "nan_stays_nan_of_its_sign": nan_ok,
        }
        if kind == 0:
            with np.errstate(over="ignore", invalid="ignore"):
                reference = x.astype(np.float16).view(np.uint16)
            out[name]["mismatches_vs_numpy_outside_nan"] = _bits_equal_or_same_nan(
                reference, nb, nan32
            )[0]
    return out


# --------------------------------------------------------------------------- timing


def interleaved(variants: dict, rounds: int, min_round_s: float = 0.05) -> dict:
    """Per-call seconds of each variant: ``rounds`` rounds, the variants one after another."""
    repeats = {}
    for name, fn in variants.items():  # warm up; enough calls per round for ~min_round_s
        t = time.perf_counter()
        fn()
        repeats[name] = max(1, int(min_round_s / max(time.perf_counter() - t, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            k = repeats[name]
            t = time.perf_counter()
            for _ in range(k):
                fn()
            samples[name].append((time.perf_counter() - t) / k)
    return {name: _summary(s, repeats[name]) for name, s in samples.items()}


def _summary(samples: list[float], calls_per_round: int = 1) -> dict:
    return {
        "best_s": float(f"{min(samples):.4g}"),
        "median_s": float(f"{statistics.median(samples):.4g}"),
        "rounds": len(samples),
        "calls_per_round": calls_per_round,
    }


COLD = """
import json, sys, time
import numpy
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
sys.path.insert(0, {repo!r})
from benchmarks import bench_numba_kernels as bench
print("COLD " + json.dumps(bench.cold_calls({inputs!r}, t1 - t0)))
"""

COLD_C = """
import json, sys, time
import numpy
sys.path.insert(0, {repo!r})
from benchmarks import bench_numba_kernels as bench
print("COLD " + json.dumps(bench.cold_calls_c({inputs!r})))
"""


def _cold_inputs(path: str) -> tuple:
    with open(path, "rb") as f:
        step = pickle.load(f)["steps"][0]
    half = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    return step["replay_args"], step["first_ready_args"], half


def cold_calls(path: str, import_s: float) -> dict:
    """In a fresh process: each numba kernel's first call (compile + run) and second call."""
    replay_args, schedule_args, x = _cold_inputs(path)
    out16, out32 = np.empty(x.size, np.float16), np.empty(x.size, np.float32)
    return {
        "import_numba_s": import_s,
        **_first_and_second(
            ("replay_region", lambda: replay_region_numba(*replay_args)),
            ("first_ready", lambda: first_ready_numba(*schedule_args)),
            ("float32_to_float16", lambda: to_f16(x, out16)),
            ("float16_to_float32", lambda: to_f32(out16, out32)),
        ),
    }


def _first_and_second(*calls) -> dict:
    """Each ``(name, call)`` timed twice in a row: its first call, then its second."""
    result = {}
    for name, fn in calls:
        t = time.perf_counter()
        fn()
        first = time.perf_counter() - t
        t = time.perf_counter()
        fn()
        result[name] = {"first_call_s": first, "second_call_s": time.perf_counter() - t}
    return result


def cold_calls_c(path: str) -> dict:
    """In a fresh process: loading the C extensions, and each kernel's first and second call."""
    replay_args, schedule_args, x = _cold_inputs(path)
    out16, out32 = np.empty(x.size, np.float16), np.empty(x.size, np.float32)
    t = time.perf_counter()
    kernels, halfkernels = load_c_extensions()
    loaded = time.perf_counter() - t
    return {
        "load_extensions_s": loaded,
        **_first_and_second(
            ("replay_region", lambda: kernels.replay_region(*replay_args)),
            ("first_ready", lambda: kernels.first_ready(*schedule_args)),
            ("float32_to_float16", lambda: halfkernels.from_float32(0, x, out16)),
            ("float16_to_float32", lambda: halfkernels.to_float32(0, out16, out32)),
        ),
    }


def run_cold(snippet: str, inputs: Path, env: dict) -> dict:
    code = snippet.format(repo=str(REPO), inputs=str(inputs))
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
        cwd=tempfile.gettempdir(),
    )
    wall = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"a cold run failed:\n{done.stdout}\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("COLD "))
    return {**json.loads(line[5:]), "process_wall_s": wall}


def cold_runs(inputs: Path, rounds: int) -> dict:
    """Fresh processes: C; numba without a cache; with cache=True empty (miss) and filled (hit)."""
    runs: dict[str, list[dict]] = {"c": [], "numba_no_cache": [], "numba_cache_miss": []}
    runs["numba_cache_hit"] = []
    for _ in range(rounds):  # interleaved
        runs["c"].append(run_cold(COLD_C, inputs, {}))
        runs["numba_no_cache"].append(run_cold(COLD, inputs, {CACHE_ENV: "0"}))
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            env = {CACHE_ENV: "1", "NUMBA_CACHE_DIR": cache}
            runs["numba_cache_miss"].append(run_cold(COLD, inputs, env))
            runs["numba_cache_hit"].append(run_cold(COLD, inputs, env))
    kernels = ("replay_region", "first_ready", "float32_to_float16", "float16_to_float32")
    out: dict = {}
    for mode, found in runs.items():
        summary: dict = {
            "process_wall_s": _summary([r["process_wall_s"] for r in found]),
            "first_calls_total_s": _summary(
                [sum(r[k]["first_call_s"] for k in kernels) for r in found]
            ),
        }
        for key in ("import_numba_s", "load_extensions_s"):
            if key in found[0]:
                summary[key] = _summary([r[key] for r in found])
        for k in kernels:
            summary[k] = {
                "first_call_s": _summary([r[k]["first_call_s"] for r in found]),
                "second_call_s": _summary([r[k]["second_call_s"] for r in found]),
            }
        out[mode] = summary
    return out


# --------------------------------------------------------------------------- main


def machine() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next(line for line in cpuinfo.splitlines() if line.startswith("model name"))
        flags = next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split()
        info["cpu_model"] = model.split(":", 1)[1].strip()
        info["cpu_flags"] = [f for f in ("avx", "avx2", "f16c", "avx512f", "fma") if f in flags]
    except (OSError, StopIteration):
        info["cpu_model"] = platform.processor() or "unknown"
    try:
        sys.path.insert(0, str(REPO))
        from benchmarks.machine import cpu_busy

        info["cpu_busy_before"] = round(cpu_busy(3.0), 3)  # 0 idle .. 1 all cores busy
    except ImportError:
        pass
    return info


def _ratio(a: float, b: float) -> float:
    return float(f"{a / b:.3g}")


def _summarize(steady: dict, cold: dict, autotune: dict | None) -> dict:
    """The ratios the docs quote: numba's best per-call time over C's, the compile costs."""
    summary: dict = {"replay_region": {}, "first_ready": {}, "half": {}}
    for kernel in ("replay_region", "first_ready"):
        for step, found in steady[kernel].items():
            summary[kernel][step] = {
                f"{name}_over_c": _ratio(found[name]["best_s"], found["c"]["best_s"])
                for name in found
                if isinstance(found[name], dict) and name != "c"
            }
    for size, found in steady["half"].items():
        summary["half"][size] = {
            f"{name}_over_c": _ratio(
                found[name]["best_s"], found[name[: -len(impl)] + "c"]["best_s"]
            )
            for name in found
            for impl in ("numba", "numpy")
            if name.endswith(impl)
        }
    kernels = ("replay_region", "first_ready", "float32_to_float16", "float16_to_float32")
    c = cold["c"]
    summary["fresh_process_s"] = {
        "c_load_and_first_calls": round(
            c["load_extensions_s"]["median_s"] + c["first_calls_total_s"]["median_s"], 4
        ),
        "c_second_calls": round(sum(c[k]["second_call_s"]["median_s"] for k in kernels), 4),
        **{
            f"{mode}_import": cold[mode]["import_numba_s"]["median_s"]
            for mode in ("numba_no_cache", "numba_cache_miss", "numba_cache_hit")
        },
        **{
            f"{mode}_first_calls": cold[mode]["first_calls_total_s"]["median_s"]
            for mode in ("numba_no_cache", "numba_cache_miss", "numba_cache_hit")
        },
    }
    if autotune:
        kernel_s = autotune["replay_region_c_seconds"] + autotune["first_ready_c_seconds"]
        summary["autotune"] = {
            "kernel_c_seconds": round(kernel_s, 4),
            "kernel_share": round(kernel_s / autotune["seconds"], 4),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, a small GPT-2")
    parser.add_argument("--inputs", metavar="FILE", help="reuse a capture (a pickle)")
    parser.add_argument(
        "--project-python",
        default=str(PROJECT_PYTHON if PROJECT_PYTHON.exists() else sys.executable),
        help="the interpreter with tflms installed, for the capture (default: .venv's)",
    )
    parser.add_argument("--out", default=str(OUT), help="the results file")
    args = parser.parse_args(argv)
    if args.capture:
        capture(Path(args.capture), args.quick)
        return 0
    if numba is None:
        print(
            f"bench_numba_kernels: skipped, numba is not importable by {sys.executable} (it is "
            f"not a dependency); {os.path.relpath(args.out, REPO)} is left as it is. To measure: "
            "python3 -m venv /tmp/numba-venv && /tmp/numba-venv/bin/pip install numba numpy && "
            "/tmp/numba-venv/bin/python benchmarks/bench_numba_kernels.py"
        )
        return 0
    rounds = 3 if args.quick else 7
    kernels, halfkernels = load_c_extensions()
    with tempfile.TemporaryDirectory(prefix="bench-numba-") as tmp:
        inputs = Path(args.inputs) if args.inputs else Path(tmp) / "inputs.pkl"
        if not inputs.exists():
            print(f"capturing the simulator's kernel inputs with {args.project_python} ...")
            command = [args.project_python, __file__, "--capture", str(inputs)]
            subprocess.run(command + ["--quick"] * args.quick, check=True, timeout=1800)
        with open(inputs, "rb") as f:
            captured = pickle.load(f)
        info = machine()
        print("equality checks ...")
        equality: dict = {"steps": {}}
        t = time.perf_counter()
        for step in captured["steps"]:
            c_again = (
                kernels.replay_region(*step["replay_args"]) == step["replay_c"]
                and kernels.first_ready(*step["first_ready_args"]) == step["first_ready_c"]
            )
            equality["steps"][step["name"]] = {
                "c_here_equals_captured_c": c_again,
                "c_equals_python": step["c_equals_python"],
                "replay_region": replay_region_numba(*step["replay_args"]) == step["replay_c"],
                "first_ready": same_schedule(
                    first_ready_numba(*step["first_ready_args"]), step["first_ready_c"]
                ),
            }
        compile_in_this_process_s = time.perf_counter() - t
        equality["random_replays"] = {
            "trials": 300,
            "mismatches": check_random_replays(kernels, 300),
        }
        equality["half"] = check_half(halfkernels)
        print(json.dumps(equality, indent=1))
        print("compile times (fresh processes) ...")
        cold = cold_runs(inputs, 2 if args.quick else 3)
        print("steady state ...")
        steady: dict = {"replay_region": {}, "first_ready": {}, "half": {}}
        for step in captured["steps"]:
            ra, sa = step["replay_args"], step["first_ready_args"]
            ready_replay = replay_arrays(ra)
            ready_schedule = schedule_arrays(sa)
            found = interleaved(
                {
                    "c": lambda ra=ra: kernels.replay_region(*ra),
                    "numba_kernel": lambda r=ready_replay: replay_region_nb(*r),
                    "numba_from_tuples_to_lists": lambda ra=ra: replay_region_numba(*ra),
                    "events_to_arrays_only": lambda ra=ra: replay_arrays(ra),
                },
                rounds,
            )
            py = step["python_timings"]
            found["python_reference"] = py["replay_python_s"]
            found["c_as_simulator_calls_it"] = py["replay_c_as_called_s"]
            found["events"] = step["events"]
            steady["replay_region"][step["name"]] = found
            found = interleaved(
                {
                    "c": lambda sa=sa: kernels.first_ready(*sa),
                    "numba_kernel": lambda s=ready_schedule: first_ready_nb(*s),
                    "numba_to_lists": lambda sa=sa: first_ready_numba(*sa),
                },
                rounds,
            )
            found["python_reference"] = py["first_ready_python_s"]
            found["c_as_simulator_calls_it"] = py["first_ready_c_as_called_s"]
            found["ops"] = step["scheduled_ops"]
            steady["first_ready"][step["name"]] = found
        rng = np.random.default_rng(0)
        for n in (1 << 16, 1 << 20, 32 << 20):  # a small tensor .. one 64 MiB fp16 fusion bucket
            x = (rng.standard_normal(n) * 1e-3).astype(np.float32)  # gradient-like: subnormals
            h, f32, b16 = np.empty(n, np.float16), np.empty(n, np.float32), np.empty(n, np.uint16)
            halfkernels.from_float32(0, x, h)
            variants = {
                "float32_to_float16_c": lambda x=x, h=h: halfkernels.from_float32(0, x, h),
                "float32_to_float16_numba": lambda x=x, h=h: to_f16(x, h),
                "float32_to_float16_numpy": lambda x=x, h=h: h.__setitem__(Ellipsis, x),
                "float16_to_float32_c": lambda h=h, f=f32: halfkernels.to_float32(0, h, f),
                "float16_to_float32_numba": lambda h=h, f=f32: to_f32(h, f),
                "float16_to_float32_numpy": lambda h=h, f=f32: f.__setitem__(Ellipsis, h),
                "float32_to_bfloat16_c": lambda x=x, b=b16: halfkernels.from_float32(1, x, b),
                "float32_to_bfloat16_numba": lambda x=x, b=b16: to_bf16(x, b),
            }
            with np.errstate(over="ignore", invalid="ignore"):
                found = interleaved(variants, max(3, rounds // 2) if n > (1 << 24) else rounds)
            steady["half"][str(n)] = found
    summary = _summarize(steady, cold, captured["autotune"])
    result = {
        "what": "numba ports of kernels.c (replay_region, first_ready) and halfkernels.c "
        "(float16/bfloat16 conversions) against the C extensions: equality, compile time, speed",
        "command": "/tmp/numba-venv/bin/python benchmarks/bench_numba_kernels.py"
        + (" --quick" if args.quick else ""),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            **info,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
            "llvmlite": __import__("llvmlite").__version__,
            "capture": {**captured["versions"], "cpu_state": captured["cpu_state"]},
        },
        "quick": args.quick,
        "inputs": [
            {k: v for k, v in step.items() if not k.endswith(("_args", "_c", "_timings"))}
            for step in captured["steps"]
        ],
        "autotune": captured["autotune"],
        "equality": equality,
        "compile": {"warm_process_first_calls_s": round(compile_in_this_process_s, 3), **cold},
        "steady": steady,
        "summary": summary,
    }
    out = Path(args.out)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp_out, out)
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
