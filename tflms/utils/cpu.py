"""What TensorFlow does on this CPU: the model, oneDNN on or off, the CPU allocator.

The same TensorFlow wheel behaves differently from one x86-64 CPU to another.
Where the CPU has AVX-512-class features (AVX512_VNNI, AVX512_BF16, AMX, ...),
TensorFlow turns oneDNN on by itself, and with it oneDNN's CPU allocator: a
BFC allocator for large tensors (small ones go to a separate pool), which keeps
statistics (``tf.config.experimental.get_memory_info('CPU:0')``). Elsewhere (an
AMD EPYC with AVX2 only, say) both are off, and the plain CPU allocator keeps
no statistics. Two variables change that before TensorFlow starts:

* ``TF_ENABLE_ONEDNN_OPTS=1``: oneDNN and its allocator, on any x86-64 CPU;
  the allocator every published CPU measurement of this project used
  (:func:`measurement_env` gives a process this state);
* ``TF_CPU_ALLOCATOR_USE_BFC=true``: the plain BFC allocator for every tensor
  (it wins over oneDNN's): statistics too, but small tensors share its regions,
  so its peaks differ from oneDNN's by a few hundred KiB of placement.

Other kernels mean other rounding and other speed (the demo's 3D U-Net step
is 5x slower without oneDNN on such a CPU: ``benchmarks/bench_cpu_kernels.py``),
so every measurement names the
state it ran in: :func:`cpu_state` gives it as a dict for a results file, and
``python -m tflms.utils.cpu`` prints it (the test suite prints it first).

TensorFlow says whether oneDNN is on only in a log line at start-up, so
:func:`cpu_state` asks a fresh interpreter (a few seconds, once per call): the
current process's state is the same where its environment is the same.

Example:
    >>> state = cpu_state()
    >>> sorted(state)  # doctest: +NORMALIZE_WHITESPACE
    ['avx512', 'bfc_cpu_allocator', 'cpu_model', 'onednn', 'variables']
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = [
    "ONEDNN_VARIABLE",
    "every_allocation_env",
    "BFC_VARIABLE",
    "cpu_model",
    "cpu_state",
    "describe",
    "measurement_env",
]

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"

_PROBE = """
import sys
import tensorflow as tf
tf.ones((4, 4)) * 2.0
try:
    tf.config.experimental.get_memory_info("CPU:0")
    sys.stdout.write("BFC=1\\n")
except ValueError:
    sys.stdout.write("BFC=0\\n")
"""
_ONEDNN_ON = "oneDNN custom operations are on"


def cpu_model() -> tuple[str, bool]:
    """The CPU's model name and whether it has AVX-512 (from ``/proc/cpuinfo``; Linux).

    Returns:
        ``(model, avx512)``; ``("unknown", False)`` where ``/proc/cpuinfo`` cannot be read.
    """
    model, avx512 = "unknown", False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags":
                    avx512 = "avx512f" in value.split()
                    break
    except OSError:
        pass
    return model, avx512


def cpu_state(env: dict[str, str] | None = None, timeout: float = 120.0) -> dict:
    """The CPU and what TensorFlow turns on there, under ``env`` (default: this process's).

    Args:
        env: the environment TensorFlow would start in.
        timeout: seconds the probing interpreter may take.

    Returns:
        ``cpu_model``, ``avx512`` (bool), ``onednn`` and ``bfc_cpu_allocator``
        (bool, or ``None`` where the probe failed), and ``variables``: the values
        of ``TF_ENABLE_ONEDNN_OPTS`` and ``TF_CPU_ALLOCATOR_USE_BFC`` in ``env``
        (``None``: unset, TensorFlow's default for this CPU).
    """
    env = dict(os.environ if env is None else env)
    model, avx512 = cpu_model()
    probe_env = {**env, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_MAX_VLOG_LEVEL": "0"}
    onednn = bfc = None
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=probe_env,
        )
        if done.returncode == 0:
            onednn = _ONEDNN_ON in done.stderr
            bfc = "BFC=1" in done.stdout
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "cpu_model": model,
        "avx512": avx512,
        "onednn": onednn,
        "bfc_cpu_allocator": bfc,
        "variables": {name: env.get(name) for name in (ONEDNN_VARIABLE, BFC_VARIABLE)},
    }


def measurement_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) set for a CPU memory measurement comparable everywhere.

    oneDNN on (``TF_ENABLE_ONEDNN_OPTS=1``) and ``TF_CPU_ALLOCATOR_USE_BFC``
    removed: oneDNN's allocator, the one TensorFlow picks by itself on the CPUs
    where this project's published figures were measured, on any x86-64 CPU.
    Give it to the fresh process that measures (TensorFlow reads both variables
    when it starts).
    """
    out = dict(os.environ if env is None else env)
    out[ONEDNN_VARIABLE] = "1"
    out.pop(BFC_VARIABLE, None)
    return out


def every_allocation_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) set so the CPU allocator's peak counts every allocation.

    The plain BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``, oneDNN off).
    oneDNN's allocator leaves small allocations out of its peak: measured
    here, a loop that keeps 64 or 256 elements of 32 KiB for its gradient
    peaks at 3 MiB either way under oneDNN's allocator, at 5.2 and 11.4 MiB
    under the plain one. Judge recurrent models (lists of per-step tensors)
    with this one; its peaks differ from oneDNN's on tensors of any size by
    its own chunk placement (see the module docstring).
    """
    out = dict(os.environ if env is None else env)
    out[ONEDNN_VARIABLE] = "0"
    out[BFC_VARIABLE] = "true"
    return out


def describe(state: dict) -> str:
    """One line for a log: ``cpu: AMD EPYC (AVX-512: no) | oneDNN: off | BFC ...``."""

    def word(flag):
        return "unknown" if flag is None else ("on" if flag else "off")

    set_vars = ", ".join(f"{k}={v}" for k, v in state["variables"].items() if v is not None)
    return (
        f"cpu: {state['cpu_model']} (AVX-512: {'yes' if state['avx512'] else 'no'}) | "
        f"oneDNN: {word(state['onednn'])} | BFC CPU allocator (statistics): "
        f"{word(state['bfc_cpu_allocator'])} | set: {set_vars or 'nothing (defaults)'}"
    )


if __name__ == "__main__":
    sys.stdout.write(describe(cpu_state()) + "\n")
