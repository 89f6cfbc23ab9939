"""What a TensorFlow process holds on a GPU beyond its tensors, term by term, with sources.

A simulator that adds up tensor sizes (``accounting="tensors"``) is
optimistic: on a real GPU, memory goes to things no tensor shows. The
realistic model (``accounting="realistic"``, the default for device presets)
counts each of them, names it in the simulation result, and takes every
number from a source (listed in :data:`SOURCES`):

``driver``
    Device memory the driver never reports: a V100-SXM2-16GB shows
    ``totalMemory: 15.75GiB`` of its nominal 16 GiB (a TensorFlow log on a
    POWER9 AC922, the machine of the seed paper; ``summit-log``).
``cuda_context``
    What is in use before TensorFlow builds its allocator: the CUDA context,
    the loaded kernel images, the cuDNN and cuBLAS handles. The same log
    shows 15.34 GiB free when the device is enumerated (0.41 GiB in use) and
    a limit that implies 15 608 MiB free when TensorFlow creates its device
    (another 100 MiB). CUDA 11.7+ loads kernels lazily, which brings a
    context to about 300 MiB (``cuda-lazy-loading``, ``pytorch-context``).
``tensorflow_reserve``
    Memory TensorFlow leaves for the system (``MinSystemMemory`` in
    ``gpu_device.cc``): TensorFlow 1.x keeps ``max(300 MiB, 5%)`` of the
    free memory; TensorFlow 2.x keeps 500 MiB (compute capability <= 6),
    1050 MiB (7.x: V100) or 1536 MiB (8.0+) (``tf-min-system-memory``). What
    remains is the BFC allocator's limit: 14 828 MiB on that V100 under
    TensorFlow 1.x, which the log prints.
``allocator``
    The BFC allocator's rounding (256 bytes) and fragmentation: chunks are
    split only when at least twice the request or 128 MiB larger, and freed
    chunks coalesce only with free neighbours (``tf-bfc``). The simulator
    replays every allocation of the step in one region and takes its
    high-water mark (:mod:`tflms.simulation.allocator`).
``workspace``
    Scratch memory of convolutions: TensorFlow lets cuDNN use up to
    ``TF_CUDNN_WORKSPACE_LIMIT_IN_MB`` (4 GiB by default) and its autotuner
    keeps the fastest algorithm whose workspace could be allocated, falling
    back to one without workspace (``tf-cudnn-workspace``). The workspace is
    therefore elastic: it takes free memory, never makes a step fail, and is
    charged here only where it fits under the allocator's limit
    (:func:`conv_workspace_bytes` gives its size for an explicit-GEMM
    algorithm, the largest common one).
``calibration``
    Not sourced, and absent unless asked for: a stack made by
    :func:`calibrated` multiplies the tensors term by a factor fitted to
    real measurements (``tensor_factor``), for the memory a real GPU was
    seen to hold that no term above explains. ``benchmarks/bench_real_anchors.py``
    fits it to published boundaries, each time holding another one out; the
    default model never uses it.

Example:
    >>> from tflms.cost.hardware import get_device
    >>> terms = process_terms(get_device("V100-16GB"), "tf1")
    >>> {name: round(b / 2**20) for name, b in terms.items()}
    {'driver': 256, 'cuda_context': 520, 'tensorflow_reserve': 780}
    >>> round(allocator_limit(get_device("V100-16GB"), "tf1") / 2**20)  # the log: 14828 MB
    14828
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tflms.cost.hardware import DeviceModel
from tflms.errors import ConfigError

__all__ = [
    "SOURCES",
    "STACKS",
    "GPU_FACTS",
    "GPUFacts",
    "FactorFit",
    "SoftwareStack",
    "allocator_limit",
    "calibrated",
    "configured_stack",
    "conv_kind",
    "conv_workspace_bytes",
    "fit_tensor_factor",
    "get_stack",
    "process_terms",
]

MIB = 1 << 20
GIB = 1 << 30

SOURCES = {
    "summit-log": (
        "tf_cnn_benchmarks log of TensorFlow ~1.13 (CUDA 9.2) on a Tesla V100-SXM2-16GB of an "
        "IBM AC922 (ORNL Summit): 'totalMemory: 15.75GiB freeMemory: 15.34GiB', then "
        "'Created TensorFlow device (... with 14828 MB memory)'"
    ),
    "tf-issue-37162": (
        "tensorflow/tensorflow issue #37162, TensorFlow 1.x on a Tesla V100-SXM2-32GB: "
        "'totalMemory: 31.72GiB freeMemory: 31.41GiB'"
    ),
    "tf-min-system-memory": (
        "tensorflow/core/common_runtime/gpu/gpu_device.cc, MinSystemMemory: TensorFlow 1.x "
        "reserves max(300 MiB, 5% of the free memory) (225 MiB under 2 GiB); TensorFlow 2.x "
        "reserves 500 MiB for compute capability <= 6, 1050 MiB for 7.x, 1536 MiB for 8.0+"
    ),
    "tf-bfc": (
        "tensorflow/core/common_runtime/bfc_allocator.{h,cc}: kMinAllocationSize 256, chunks "
        "split when >= 2x the request or >= 128 MiB (kMaxInternalFragmentation) larger, "
        "coalescing with free neighbours"
    ),
    "tf-cudnn-workspace": (
        "tensorflow/core/kernels/conv_ops_3d.cc and conv_ops.cc: TF_CUDNN_WORKSPACE_LIMIT_IN_MB, "
        "default 1 << 32 bytes; the autotuner profiles each algorithm with a scratch allocator "
        "that fails softly and keeps the fastest that ran plus a no-scratch fallback"
    ),
    "cudnn-gemm": (
        "cuDNN developer guide, CUDNN_CONVOLUTION_FWD_ALGO_GEMM: the convolution as an explicit "
        "matrix product, which materializes the input patches (im2col) in the workspace"
    ),
    "cuda-lazy-loading": (
        "NVIDIA CUDA programming guide, Lazy Loading: introduced in CUDA 11.7, the default on "
        "Linux from 12.2; before it every kernel of a loaded library was loaded into the context"
    ),
    "pytorch-context": (
        "pytorch/pytorch issue #107667 (NVIDIA, 2023): a CUDA context takes about 300 MB with "
        "lazy loading, over 1000 MB before CUDA 11.7"
    ),
}
"""Where each number of this module comes from (keys are cited by the terms)."""


@dataclass(frozen=True)
class GPUFacts:
    """Measured facts of one GPU model that the tensor-only presets do not hold.

    Attributes:
        visible_bytes: total memory the driver reports (``cudaMemGetInfo``),
            or the nominal size where no measurement is known.
        compute_capability: ``(major, minor)``; TensorFlow 2.x's reserve
            depends on the major version.
        source: the :data:`SOURCES` key of ``visible_bytes``, or ``""`` when
            it is the nominal size (not anchored to a measurement).
    """

    visible_bytes: int
    compute_capability: tuple[int, int]
    source: str = ""


GPU_FACTS: dict[str, GPUFacts] = {
    "V100-16GB": GPUFacts(round(15.75 * GIB), (7, 0), "summit-log"),
    "V100-32GB": GPUFacts(round(31.72 * GIB), (7, 0), "tf-issue-37162"),
    "A100-80GB": GPUFacts(80 * GIB, (8, 0)),
    "H100-80GB": GPUFacts(80 * GIB, (9, 0)),
}
"""Facts per device preset of :data:`tflms.cost.hardware.DEVICES`."""


@dataclass(frozen=True)
class SoftwareStack:
    """The TensorFlow and CUDA versions a GPU process runs, as far as memory goes.

    Attributes:
        name: ``"tf2"`` (TensorFlow 2.x on CUDA 12: what users run) or
            ``"tf1"`` (TensorFlow 1.8 to 1.15 on CUDA 9/10: the era of the
            published TFLMS measurements).
        context_bytes: device memory in use before TensorFlow creates its
            allocator (CUDA context, kernel images, library handles).
        reserve_rule: ``"tf1"`` or ``"tf2"``: which ``MinSystemMemory``.
        workspace_limit_bytes: cuDNN's workspace limit
            (``TF_CUDNN_WORKSPACE_LIMIT_IN_MB``).
        sources: the :data:`SOURCES` keys behind the numbers.
        tensor_factor: 1.0 for every sourced stack; a :func:`calibrated`
            stack's fitted multiplier of the tensors term.
        fitted_on: what ``tensor_factor`` was fitted to (empty when 1.0).
    """

    name: str
    context_bytes: int
    reserve_rule: str
    workspace_limit_bytes: int = 4 * GIB
    sources: tuple[str, ...] = ()
    tensor_factor: float = 1.0
    fitted_on: str = ""


STACKS: dict[str, SoftwareStack] = {
    "tf2": SoftwareStack(
        "tf2",
        300 * MIB,
        "tf2",
        sources=("cuda-lazy-loading", "pytorch-context", "tf-min-system-memory"),
    ),
    "tf1": SoftwareStack(
        "tf1",
        round((15.75 - 15.34) * GIB) + 100 * MIB,
        "tf1",
        sources=("summit-log", "tf-min-system-memory"),
    ),
}
"""The software stacks the realistic model knows."""


def get_stack(stack: str | SoftwareStack) -> SoftwareStack:
    """The :class:`SoftwareStack` named ``stack`` (or ``stack`` itself).

    Raises:
        ConfigError: an unknown name, with the known ones.
    """
    if isinstance(stack, SoftwareStack):
        return stack
    if stack not in STACKS:
        raise ConfigError(
            f"Unknown software stack {stack!r}. Known: {', '.join(STACKS)} (tf2: TensorFlow 2.x "
            "on CUDA 12; tf1: TensorFlow 1.x on CUDA 9/10)."
        )
    return STACKS[stack]


def calibrated(stack: str | SoftwareStack, tensor_factor: float, fitted_on: str) -> SoftwareStack:
    """``stack`` with its tensors term multiplied by a factor fitted to real measurements.

    The realistic model counts only what a source explains; when real GPUs
    run out of memory where it still finds room (see ``docs/real-anchors.md``),
    a factor fitted to those measurements gives a verdict that agrees with
    them. The result names the extra memory as its own term,
    ``calibration`` (``(tensor_factor - 1)`` times the tensors term, variables
    included), so a calibrated figure is never mistaken for a sourced one.

    Args:
        stack: the sourced stack to calibrate (a :data:`STACKS` name or a stack).
        tensor_factor: the fitted multiplier, at least 1.0 (the sourced model
            is optimistic, never pessimistic, on every known anchor).
        fitted_on: the measurements it was fitted to, recorded with the figures.

    Returns:
        A :class:`SoftwareStack` named ``"<stack>+calibrated"``; pass it as
        ``stack=`` to :func:`tflms.simulate` or :func:`tflms.autotune`.

    Raises:
        ConfigError: the factor is not a finite number >= 1, ``fitted_on`` is
            empty, or ``stack`` is already calibrated.

    Example:
        >>> stack = calibrated("tf1", 1.5, "two 2018 V100 boundaries")
        >>> stack.name, stack.tensor_factor, stack.context_bytes == STACKS["tf1"].context_bytes
        ('tf1+calibrated', 1.5, True)
    """
    base = get_stack(stack)
    if base.tensor_factor != 1.0:
        raise ConfigError(
            f"Stack {base.name!r} is already calibrated (tensor_factor={base.tensor_factor}); "
            "calibrate a sourced stack (tf1 or tf2) instead."
        )
    if (
        isinstance(tensor_factor, bool)
        or not isinstance(tensor_factor, (int, float))
        or not 1.0 <= tensor_factor < float("inf")
    ):
        raise ConfigError(
            f"tensor_factor must be a finite number >= 1.0 (1.0: the sourced model). "
            f"Received tensor_factor={tensor_factor!r}."
        )
    if not isinstance(fitted_on, str) or not fitted_on.strip():
        raise ConfigError(
            "fitted_on must say which measurements the factor was fitted to, e.g. "
            "'IBM Keras_ResNet50 on a V100-16GB: 2300 fits, 2400 does not'."
        )
    return replace(
        base,
        name=f"{base.name}+calibrated",
        tensor_factor=float(tensor_factor),
        fitted_on=fitted_on,
    )


def configured_stack(stack: str | SoftwareStack, tensor_factor: float) -> str | SoftwareStack:
    """``stack``, calibrated with ``LMSConfig.tensor_factor`` when it is not 1.0.

    Args:
        stack: the stack asked for (a name or a stack).
        tensor_factor: ``LMSConfig.tensor_factor``.

    Returns:
        ``stack`` itself for 1.0, else ``calibrated(stack, tensor_factor, ...)``.

    Raises:
        ConfigError: ``stack`` is already calibrated and the config asks for
            a factor too (one calibration at a time).
    """
    if tensor_factor == 1.0:
        return stack
    return calibrated(stack, tensor_factor, "LMSConfig.tensor_factor")


@dataclass(frozen=True)
class FactorFit:
    """The tensor factors with which the realistic model reproduces one real boundary.

    Attributes:
        low: the factor must exceed this for the first size that did not fit
            to be judged too large.
        high: the factor must not exceed this for the largest size that fit
            to be judged fitting.
        fitted: the middle of ``(low, high]``, at least 1.0: the value to
            pass to :func:`calibrated`.
    """

    low: float
    high: float
    fitted: float


def fit_tensor_factor(fit_terms: dict, no_fit_terms: dict, memory_bytes: int) -> FactorFit:
    """Fit :func:`calibrated`'s factor to a boundary measured on a real GPU.

    Simulate the largest size (batch, resolution) that trained on the GPU and
    the first that ran out of memory, with the sourced realistic model
    (``SimulationResult.memory_terms``), and pass both. Every term but the
    tensors is taken as simulated (cuDNN workspaces, being elastic, can only
    shrink), so check the fitted stack by simulating both sizes again.

    Args:
        fit_terms: ``memory_terms`` of the largest size that fit.
        no_fit_terms: ``memory_terms`` of the first size that did not.
        memory_bytes: the GPU's memory (``DeviceModel.memory_bytes``).

    Returns:
        A :class:`FactorFit`.

    Raises:
        ConfigError: a terms dict without ``tensors`` (not a realistic
            simulation), already calibrated, sizes in the wrong order, or a
            boundary no factor >= 1 reproduces (the sourced model already
            judges the fitting size too large: it is not optimistic there).

    Example:
        >>> GiB = 1 << 30
        >>> fit = fit_tensor_factor({"tensors": 8 * GiB, "driver": 2 * GiB},
        ...                         {"tensors": 10 * GiB, "driver": 2 * GiB}, 16 * GiB)
        >>> fit.low, fit.high, fit.fitted
        (1.4, 1.75, 1.575)
    """
    for name, terms in (("fit_terms", fit_terms), ("no_fit_terms", no_fit_terms)):
        if not isinstance(terms, dict) or not terms.get("tensors"):
            raise ConfigError(
                f"{name} must be the memory_terms of a realistic simulation (with a 'tensors' "
                "term); simulate with accounting='realistic' on a GPU preset."
            )
        if "calibration" in terms:
            raise ConfigError(
                f"{name} comes from a calibrated stack; fit with the sourced one (tf1 or tf2)."
            )

    def threshold(terms: dict) -> float:
        other = sum(terms.values()) - terms["tensors"]
        return (memory_bytes - other) / terms["tensors"]

    if no_fit_terms["tensors"] <= fit_terms["tensors"]:
        raise ConfigError(
            "The size that did not fit holds no more tensors than the one that did; pass the "
            "largest size that fit first and the first size that did not second."
        )
    low, high = threshold(no_fit_terms), threshold(fit_terms)
    if high < 1.0:
        raise ConfigError(
            f"The sourced model already judges the size that fit too large (it would need a "
            f"factor of {high:.3f} < 1): it is not optimistic here, and no calibration is needed."
        )
    return FactorFit(round(low, 4), round(high, 4), round(max(1.0, (low + high) / 2), 4))


def _facts(device: DeviceModel) -> GPUFacts:
    return GPU_FACTS.get(device.name) or GPUFacts(device.memory_bytes, (7, 0))


def _reserve(free: int, rule: str, major: int) -> int:
    if free < 2 * GIB:
        return 225 * MIB
    if rule == "tf1":
        return max(300 * MIB, round(0.05 * free))
    return 500 * MIB if major <= 6 else 1050 * MIB if major == 7 else 1536 * MIB


def process_terms(device: DeviceModel, stack: str | SoftwareStack = "tf2") -> dict[str, int]:
    """The device memory a TensorFlow process cannot give to tensors, by term.

    Args:
        device: the device preset (its name selects the :data:`GPU_FACTS`;
            an unknown device is taken at its nominal size).
        stack: the software stack (:data:`STACKS`).

    Returns:
        ``{"driver", "cuda_context", "tensorflow_reserve"}`` in bytes, in
        that order; with the allocator's limit they add up to
        ``device.memory_bytes``.
    """
    stack, facts = get_stack(stack), _facts(device)
    driver = max(0, device.memory_bytes - facts.visible_bytes)
    free = facts.visible_bytes - stack.context_bytes
    reserve = _reserve(free, stack.reserve_rule, facts.compute_capability[0])
    return {"driver": driver, "cuda_context": stack.context_bytes, "tensorflow_reserve": reserve}


def allocator_limit(device: DeviceModel, stack: str | SoftwareStack = "tf2") -> int:
    """Bytes TensorFlow's GPU allocator may hand out: the memory left for tensors.

    Args:
        device: the device preset.
        stack: the software stack (:data:`STACKS`).

    Returns:
        ``device.memory_bytes`` less every :func:`process_terms` term.
    """
    return device.memory_bytes - sum(process_terms(device, stack).values())


_CONV_OPS = {
    "Conv2D": "forward",
    "Conv3D": "forward",
    "DepthwiseConv2dNative": "forward",
    "Conv2DBackpropInput": "input",
    "Conv3DBackpropInputV2": "input",
    "Conv2DBackpropFilter": "filter",
    "Conv3DBackpropFilterV2": "filter",
}


def conv_workspace_bytes(
    op_type: str, patches: int, patch_elements: int, dtype_bytes: int, limit: int
) -> int:
    """Workspace of an explicit-GEMM cuDNN algorithm for one convolution op, within the limit.

    The matrix of input patches (im2col) has one row per output position
    (``patches``) and one column per filter tap and input channel
    (``patch_elements``); the forward pass, the input gradient and the
    filter gradient all build it. An algorithm whose workspace exceeds the
    limit is never run (``tf-cudnn-workspace``), so the size is 0 then: the
    autotuner takes an algorithm with a small or no workspace.

    Args:
        op_type: the op's type; ops that are not convolutions get 0.
        patches: output positions (batch times output spatial size).
        patch_elements: filter taps times input channels.
        dtype_bytes: bytes per element.
        limit: the workspace limit (``SoftwareStack.workspace_limit_bytes``).

    Returns:
        Bytes, 0 when the op is no convolution or the patches exceed ``limit``.

    Example:
        >>> conv_workspace_bytes("Conv3D", 128**3, 27 * 16, 4, 4 << 30) / 2**30  # 128^3, 16 ch
        3.375
        >>> conv_workspace_bytes("Conv3D", 160**3, 27 * 16, 4, 4 << 30)  # 6.6 GiB > 4 GiB
        0
    """
    if op_type not in _CONV_OPS:
        return 0
    nbytes = patches * patch_elements * dtype_bytes
    return nbytes if nbytes <= limit else 0


def conv_kind(op_type: str) -> str | None:
    """``"forward"``, ``"input"`` or ``"filter"`` for a convolution op type, else None."""
    return _CONV_OPS.get(op_type)
