"""LMSConfig: every option of tflms in one frozen, validated dataclass.

The same fields drive the Python API (:class:`tflms.LMS`,
:class:`tflms.LMSCallback`, :func:`tflms.function`) and the command line
(``tflms rewrite --swapout-threshold ...``), so there is one source of truth.
The option names follow TFLMS v2 where TFLMS had the same knob.

The fields are flat, as users pass them (``LMSConfig(swapout_threshold=4)``,
``--swapout-threshold 4``, a plan's JSON). The front ends resolve what they
name once (:class:`tflms.pipeline.Pipeline`: the target, the devices, the
batch size) and every stage reads the fields it needs from the one config.

Example:
    >>> from tflms import LMSConfig
    >>> cfg = LMSConfig(swapout_threshold=20, serialization=["3", "10:12"])
    >>> cfg.serialization
    ((3, 3), (10, 12))
    >>> LMSConfig.from_dict(cfg.to_dict()) == cfg
    True
    >>> cfg.replace(swapin_ahead=4).swapin_ahead
    4
    >>> LMSConfig(memory_budget="16GiB").memory_budget, LMSConfig(memory_budget="v100-16gb").memory_budget
    (17179869184, 'V100-16GB')
    >>> LMSConfig(sync_mode=7)
    Traceback (most recent call last):
    ...
    tflms.errors.ConfigError: LMSConfig.sync_mode must be 0, 1, 2 or 3. Received sync_mode=7. ...
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from tflms.cost.hardware import DEVICES, LINKS
from tflms.cost.target import DEFAULT_LINK, Target
from tflms.errors import ConfigError
from tflms.utils.devices import check_device_string, same_device
from tflms.utils.units import parse_bytes

__all__ = ["LMSConfig", "SYNC_MODES", "SyncMode"]

SyncMode: TypeAlias = Literal[0, 1, 2, 3]
"""The values of ``LMSConfig.sync_mode`` (see :data:`SYNC_MODES`)."""

SYNC_MODES: dict[SyncMode, str] = {
    0: "asynchronous: swap-outs and swap-ins overlap with compute",
    1: "the producer's other consumers wait until the swap-out is done",
    2: "each swap-in waits for the other inputs of its consumer (no prefetch)",
    3: "both 1 and 2",
}


def _fail(name: str, value: Any, expected: str, fix: str) -> ConfigError:
    return ConfigError(f"LMSConfig.{name} must be {expected}. Received {name}={value!r}. {fix}")


@dataclass(frozen=True)
class LMSConfig:
    """Options of the swap planner and the graph rewriter.

    Levels are topological levels of the training graph (Kahn generations
    over data and control edges, as in TFLMS v2): level 0 holds the ops with
    no inputs, and every op sits one level above its deepest input.
    """

    device: str | None = None
    """Compute device (the GPU). Ops with no device are assumed to run there.
    ``None`` keeps TensorFlow's choice: unassigned ops land on the first GPU."""

    host_device: str = "/device:CPU:0"
    """Where swapped-out tensors live (host memory, pinned by TensorFlow)."""

    batch_size: int | None = None
    """Batch size used to size tensors whose first dimension is unknown.
    ``None``: take it from the traced input signature; if that is unknown too,
    sizes are per sample (the analysis reports which tensors this affects)."""

    min_tensor_bytes: int = 1024 * 1024
    """Tensors smaller than this are never swapped (transfers of tiny tensors
    cost more in latency than they save). Accepts ``"64KiB"`` style strings.
    The defaults of this and the next three fields were chosen with the
    simulator on ResNet-50, VGG16 and a 3D U-Net
    (``benchmarks/results/defaults_sweep.json``)."""

    swapout_threshold: int = 40
    """A tensor is swapped out for each consumer whose level exceeds the
    producer's level by more than this many levels."""

    swapin_ahead: int = 8
    """The swap-in is triggered by an op about this many levels before its
    earliest consumer, so the copy back overlaps with compute."""

    swapin_groupby: int = 50
    """Consumers of one tensor whose levels lie within this many levels of the
    group's first consumer share one swap-in."""

    sync_mode: SyncMode = 0
    """0-3, as in TFLMS v2; see ``SYNC_MODES``."""

    serialization: tuple[tuple[int, int], ...] = ()
    """Levels whose ops are chained by control edges so they run one after the
    other (lowers peak width). Given as ints or ``"lo:hi"`` strings
    (inclusive); stored as ``(lo, hi)`` pairs."""

    incl_scopes: tuple[str, ...] = ()
    """If set, only producers whose op name starts with one of these prefixes."""

    excl_scopes: tuple[str, ...] = ()
    """Producers whose op name starts with one of these prefixes are skipped."""

    incl_types: tuple[str, ...] = ()
    """If set, only producers of these op types (e.g. ``("Conv2D", "Relu")``)."""

    excl_types: tuple[str, ...] = ()
    """Producers of these op types are skipped."""

    n_tensors: int | None = None
    """Swap at most this many tensors, largest first. ``None``: no cap."""

    swap: bool = True
    """Swap tensors to the host. ``False``: no tensor leaves the device, and
    the other levers work alone - recomputation (``recompute=True``),
    memory-aware order (``reorder=True``), ``serialization`` - for a host
    whose pinned memory is scarce, or a CPU step, where a swap frees nothing.
    With ``memory_budget`` the auto-tuner then searches those levers only."""

    swap_weight_gradients: bool = False
    """Also swap weight gradients (outputs of ``Conv*BackpropFilter``,
    ``BiasAddGrad``, ...). Off by default: they are at most the size of the
    weights, so swapping them saves little, and a swap adds a reader to a
    gradient that Grappler's memory optimizer may accumulate in place
    (``AddN``), which changes its choice and the float rounding (see
    ``benchmarks/bench_resnet50_equivalence.py``)."""

    memory_budget: int | str | None = None
    """Device memory the training step must fit in. When set, the swap options
    above are *searched* (:func:`tflms.autotune`) for the plan that fits with
    the lowest predicted overhead, and no plan is made when the step fits
    without one. Bytes, a string such as ``"16GiB"``, or a device preset
    (``"V100-16GB"``, ``"A100-80GB"``, ...; see ``tflms.cost.hardware.DEVICES``)
    whose memory and speed are then used. ``None``: plan with the options as
    given."""

    host_memory_budget: int | None = None
    """Host memory the step may pin (``"64GiB"``): the swapped-out tensors,
    and the weights and optimizer state kept there (``offload_weights``,
    ``offload_optimizer``). Pinned memory cannot be paged out, so a plan whose
    simulated host peak exceeds it does not fit: the auto-tuner (with
    ``memory_budget``) keeps only plans within both budgets. ``None``: the
    host is not limited."""

    safety_margin: float = 0.1
    """Fraction of ``memory_budget`` held back for what static tensor sizes
    miss: cuDNN/cuBLAS workspaces, allocator fragmentation and rounding,
    tensors of unknown size. With 0.1 a 16 GiB budget plans for 14.4 GiB."""

    tensor_factor: float = 1.0
    """Calibration of the realistic memory model (a ``memory_budget`` that
    names a GPU preset) to your own GPU: the tensors term is multiplied by
    this factor, and the extra memory is reported as the ``calibration``
    term. Fit it with ``tflms.cost.gpu_memory.fit_tensor_factor`` from the
    largest batch that trained and the first that ran out of memory (see the
    docs page "The simulator against real GPUs"). 1.0: the sourced model."""

    link: str = DEFAULT_LINK
    """Host link the auto-tuner times swap copies with: ``"pcie3"``,
    ``"pcie4"``, ``"pcie5"``, ``"nvlink2"`` or ``"ideal"``."""

    recompute: bool = False
    """Recompute cheap activations (elementwise chains such as BatchNorm +
    ReLU, chosen by predicted cost) just before the backward pass needs them,
    from tensors it keeps or swaps anyway, instead of keeping or swapping
    them (:mod:`tflms.plan.recompute`). With ``memory_budget`` the
    auto-tuner decides."""

    recompute_dense: float = 0.0
    """With ``recompute``, also re-run convolutions and matmuls whose predicted
    time is at most this multiple of the time ``link`` takes to copy their
    outputs to the host once (0.25: a quarter of it), and chain the groups that
    feed each other (the clones read clones, so mostly the tensors at a chain's
    start are kept or swapped). Recomputing what the link cannot hide in time;
    ``0.0``: only cheap ops; no effect with ``link="ideal"`` (no copy takes
    time). With ``memory_budget`` the auto-tuner decides."""

    recompute_segments: int = 0
    """With ``recompute``, also re-run whole segments of the forward pass -
    dense ops included - from checkpoints kept between them, as Chen et al.'s
    sqrt(n) checkpointing and Keras's ``RematScope(mode="full")`` do
    (:mod:`tflms.plan.segments`): the forward pass is cut where one tensor
    alone carries it on (the residual stream between two blocks), and every
    N-th cut is kept. 1: every cut kept (short segments); larger: fewer
    checkpoints, longer segments re-run at once. A segment re-runs every
    tensor the backward pass reads, however near the loss
    (``swapout_threshold`` does not apply: a re-run has no copy to hide), each
    started at most 2 levels before its first reader. ``0``: no segments. With
    ``memory_budget`` the auto-tuner decides."""

    reorder: bool = False
    """Add control edges that order the ops whose interleaving makes the
    memory peak (two backward branches running side by side), as the
    simulator finds them (:mod:`tflms.compose.ordering`). With
    ``memory_budget`` the auto-tuner decides."""

    max_op_bytes: int | None = None
    """Split ops too large for any swap plan into row chunks of at most this
    many bytes (``"256MiB"``), bitwise identical (:mod:`tflms.plan.splits`):
    the vocabulary loss of a language model where its logits outlive it (a
    metric reads them after the loss: logits and gradient are then both on
    the device at the op; otherwise TensorFlow writes the gradient into the
    logits' buffer and a split frees nothing); random tensors (dropout masks) larger than
    this are drawn in their layer rather than all as the step starts.
    ``None`` (the default) changes nothing."""

    offload_optimizer: bool | None = None
    """Keep the optimizer's state (slots, ``iterations``) on ``host_device`` and
    run its update there (:class:`tflms.keras.OffloadedOptimizer`): each
    gradient goes to the host as backprop produces it and each updated weight
    comes back. ``LMSCallback`` moves a compiled model's optimizer there when
    ``fit`` starts, before its first step builds the state (a model trained
    before has it on the device already: wrap the optimizer yourself before
    ``compile`` when that state does not fit the device even once).
    In custom loops use ``OffloadedOptimizer`` directly: a traced function
    cannot move an optimizer.

    ``None`` (the default) lets a ``memory_budget`` decide under
    ``LMSCallback``: when the weights, their gradients and the optimizer's
    state already exceed the budget (no plan could keep the state on the
    device), the callback builds that state on the host before the first
    step and runs the update there; the log and the summary say so, and a
    fit that still cannot plan puts the optimizer back. A state that fits
    beside the weights goes to the host too when a trace of the step with a
    copy of the optimizer built on the device finds no plan and the host
    would let one fit (:mod:`tflms.keras.state_trial`; the first step is
    planned twice then). Where that trace cannot be made (a subclassed
    model, an optimizer an earlier fit built) the state is built on the
    device, and the error says whether ``True`` would let one fit (Keras's
    ``compile`` keeps the optimizer it was given, so a state built on the
    device cannot be released). Without a budget ``None`` is ``False``;
    ``False`` never moves it."""

    offload_weights: bool = False
    """Stream the weights from ``host_device`` (:mod:`tflms.plan.streams`):
    each weight the model keeps there comes to the device ahead of its
    forward use and again ahead of its backward use (swap-ins with
    triggers), and each copy is freed after its last use, so the device holds
    only the layers at work. Build the model's weights on the host
    (``with tflms.keras.weights_on_host(): model = ...``); implies
    ``offload_optimizer`` (the update runs next to the weights)."""

    check_rewrites: bool = True
    """Keep the step's arithmetic bit for bit: run Grappler offline on the
    step with and without the plan, as TensorFlow runs it before every step,
    and plan again without each op Grappler rewrites differently with the
    plan (a fusion or fold a swap-out's extra consumer blocks, a dead tensor a
    swap keeps alive, a recomputed chain optimized another way), until both
    graphs agree (:mod:`tflms.simulation.grappler.rewrites`). Costs two
    Grappler passes per round when a step is traced (the first round took
    8 s for a 15,000-op step and 38 s for a 60,000-op one on two cores:
    ``benchmarks/bench_rewrite_check.py``). ``False`` trusts the planner's
    rules alone (:mod:`tflms.graph.grappler_rules`)."""

    def __post_init__(self) -> None:
        check_device_string("host_device", self.host_device, owner="LMSConfig.")
        for name, what in (
            ("offload_optimizer", "keeps the optimizer's state on host_device"),
            ("offload_weights", "streams the weights kept on host_device"),
            ("check_rewrites", "checks each plan against Grappler's rewrites"),
        ):
            value = getattr(self, name)
            if value is None and name == "offload_optimizer":
                continue  # a memory_budget decides
            if not isinstance(value, bool):
                allowed = "True, False or None" if name == "offload_optimizer" else "True or False"
                raise _fail(name, value, allowed, f"True {what}.")
        if self.device is not None:
            check_device_string("device", self.device, owner="LMSConfig.")
            if same_device(self.device, self.host_device):
                raise _fail(
                    "device",
                    self.device,
                    "a different device from host_device",
                    "Swapping to the device the tensors already live on saves nothing; "
                    'the host is usually host_device="/device:CPU:0".',
                )
        if self.batch_size is not None:
            object.__setattr__(
                self,
                "batch_size",
                _check_int(
                    "batch_size",
                    self.batch_size,
                    minimum=1,
                    fix="Pass the batch size each step sees (per replica).",
                ),
            )
        object.__setattr__(
            self, "min_tensor_bytes", _bytes_field("min_tensor_bytes", self.min_tensor_bytes)
        )
        for name, minimum, fix in _INT_FIELDS:
            object.__setattr__(
                self, name, _check_int(name, getattr(self, name), minimum=minimum, fix=fix)
            )
        if (
            isinstance(self.sync_mode, bool)
            or not isinstance(self.sync_mode, numbers.Integral)
            or self.sync_mode not in SYNC_MODES
        ):
            raise _fail("sync_mode", self.sync_mode, "0, 1, 2 or 3", "See tflms.config.SYNC_MODES.")
        object.__setattr__(self, "sync_mode", int(self.sync_mode))
        object.__setattr__(self, "serialization", _parse_levels(self.serialization))
        for name in ("incl_scopes", "excl_scopes", "incl_types", "excl_types"):
            object.__setattr__(self, name, _str_tuple(name, getattr(self, name)))
        if self.n_tensors is not None:
            object.__setattr__(
                self,
                "n_tensors",
                _check_int("n_tensors", self.n_tensors, minimum=1, fix="Use None for no cap."),
            )
        if self.memory_budget is not None:
            object.__setattr__(self, "memory_budget", _budget_field(self.memory_budget))
        if self.host_memory_budget is not None:
            size = _bytes_field("host_memory_budget", self.host_memory_budget)
            if size < 1:
                raise _fail(
                    "host_memory_budget", size, "a positive size", "Use None for no host limit."
                )
            object.__setattr__(self, "host_memory_budget", size)
        if self.max_op_bytes is not None:
            size = _bytes_field("max_op_bytes", self.max_op_bytes)
            if size < 1:
                raise _fail("max_op_bytes", size, "at least 1 byte", "Use None to split nothing.")
            object.__setattr__(self, "max_op_bytes", size)
        margin = _check_real(
            "safety_margin",
            self.safety_margin,
            lambda v: 0 <= v < 0.9,
            "a fraction in [0, 0.9)",
            "0.1 keeps 10% of the budget free for workspaces and fragmentation.",
        )
        object.__setattr__(self, "safety_margin", margin)
        factor = _check_real(
            "tensor_factor",
            self.tensor_factor,
            lambda v: 1.0 <= v < float("inf"),
            "a finite number >= 1.0",
            "1.0 is the sourced model; fit yours with tflms.cost.gpu_memory.fit_tensor_factor.",
        )
        object.__setattr__(self, "tensor_factor", factor)
        if factor != 1.0 and not isinstance(self.memory_budget, str):
            raise _fail(
                "tensor_factor",
                factor,
                "1.0 unless memory_budget names a GPU preset",
                "The factor calibrates the realistic GPU memory model, which a budget in "
                "bytes does not use; set memory_budget to your GPU's preset as well "
                "(memory_budget='V100-16GB').",
            )
        if not isinstance(self.link, str) or self.link.lower() not in LINKS:
            raise _fail("link", self.link, f"one of {sorted(LINKS)}", 'Example: link="nvlink2".')
        object.__setattr__(self, "link", self.link.lower())
        for name in ("swap", "recompute", "reorder", "swap_weight_gradients"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "True or False", "")
        dense = _check_real(
            "recompute_dense",
            self.recompute_dense,
            lambda v: 0 <= v <= 10,
            "a number in [0, 10]",
            "0.0 re-runs cheap ops only; 0.25 also convolutions that take at most a "
            "quarter of the time their output's copy takes.",
        )
        object.__setattr__(self, "recompute_dense", dense)
        segments = self.recompute_segments
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 0:
            raise _fail(
                "recompute_segments",
                segments,
                "a whole number >= 0",
                "0 re-runs no segments; 1 keeps every cut of the forward pass, 2 every second.",
            )
        if segments and not self.recompute:
            raise _fail(
                "recompute_segments",
                segments,
                "0 unless recompute=True",
                "Set recompute=True as well: segments are re-run in recompute groups.",
            )
        if self.recompute_dense and not self.recompute:
            raise _fail(
                "recompute_dense",
                dense,
                "0.0 unless recompute=True",
                "Set recompute=True as well: dense ops are re-run in recompute groups.",
            )

    # ------------------------------------------------------------------ helpers
    def target(self, **overrides: Any) -> Target:
        """The :class:`~tflms.cost.target.Target` these options describe.

        ``memory_budget`` (its preset names the device model), ``link`` and
        ``tensor_factor``; the front ends resolve it once and pass it down.

        Args:
            **overrides: keyword arguments of
                :meth:`~tflms.cost.target.Target.for_budget` (``budget``,
                ``device``, ``link``, ``accounting``, ``stack``) that win over
                the config's; None values are ignored.

        Returns:
            The resolved target.

        Raises:
            ConfigError: an override is invalid, or ``tensor_factor`` is set
                with an accounting that does not read it.
        """
        options: dict[str, Any] = {"link": self.link, "tensor_factor": self.tensor_factor}
        options.update({k: v for k, v in overrides.items() if v is not None})
        budget = options.pop("budget", self.memory_budget)
        return Target.for_budget(budget, **options)

    def replace(self, **changes: Any) -> LMSConfig:
        """A copy with some fields changed (validated again).

        Args:
            **changes: Field names and their new values.

        Returns:
            A new config; this one is unchanged.

        Raises:
            ConfigError: a new value is invalid (the same checks as the constructor).
        """
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Public option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every option."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            value = getattr(self, name)
            if name == "serialization":
                value = [f"{lo}:{hi}" if lo != hi else str(lo) for lo, hi in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMSConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ConfigError`.

        Args:
            data: ``{field name: value}``; missing fields keep their defaults.

        Returns:
            The validated config.

        Raises:
            ConfigError: ``data`` is not a dict, names an unknown field, or holds
                an invalid value.
        """
        if not isinstance(data, dict):
            raise ConfigError(
                f"An LMS config must be a JSON object. Received {type(data).__name__}."
            )
        unknown = sorted(set(data) - set(cls.field_names()))
        if unknown:
            raise ConfigError(
                f"Unknown LMSConfig option(s) {unknown}. Valid options: {', '.join(cls.field_names())}."
            )
        return cls(**data)


_INT_FIELDS = (
    (
        "swapout_threshold",
        0,
        "Smaller values swap more tensors; 0 swaps every tensor with a later consumer.",
    ),
    (
        "swapin_ahead",
        1,
        "It counts levels between the swap-in trigger and the consumer; use 1 for the latest prefetch.",
    ),
    ("swapin_groupby", 0, "0 gives each consumer level its own swap-in."),
)


def _check_int(name: str, value: Any, *, minimum: int, fix: str) -> int:
    """``value`` as a plain int (numpy integers included), or a :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise _fail(name, value, f"an int >= {minimum}", fix)
    return int(value)


def _check_real(
    name: str, value: Any, within: Callable[[float], bool], expected: str, fix: str
) -> float:
    """``value`` as a float if it is a real number (not a bool) ``within`` range, else a :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not within(float(value)):
        raise _fail(name, value, expected, fix)
    return float(value)


def _bytes_field(name: str, value: Any) -> int:
    try:
        parsed = parse_bytes(value)
    except ValueError as err:
        raise _fail(name, value, "a byte count (int or a string like '64KiB')", str(err)) from err
    return parsed


def _budget_field(value: Any) -> int | str:
    if isinstance(value, str):
        preset = {name.lower(): name for name in DEVICES}.get(value.strip().lower())
        if preset is not None:
            return preset
    negative = (isinstance(value, int | float) and not isinstance(value, bool) and value < 0) or (
        isinstance(value, str) and value.strip().startswith("-")
    )
    if negative:  # a size, just not a positive one: say that, as for 0
        raise _fail("memory_budget", value, "a positive size", "Example: memory_budget='16GiB'.")
    try:
        parsed = parse_bytes(value)
    except ValueError as err:
        raise _fail(
            "memory_budget",
            value,
            "a byte count, a size such as '16GiB', or a device preset",
            f"Device presets: {', '.join(DEVICES)}.",
        ) from err
    if parsed <= 0:
        raise _fail("memory_budget", value, "a positive size", "Example: memory_budget='16GiB'.")
    return parsed


def _str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise _fail(
            name, value, "a list of strings", f"Wrap a single value in a list: {name}=[{value!r}]."
        )
    try:
        items = tuple(value)
    except TypeError as err:
        raise _fail(name, value, "a list of strings", "") from err
    if not all(isinstance(item, str) and item for item in items):
        raise _fail(name, value, "a list of non-empty strings", "")
    return items


def _parse_levels(value: Any) -> tuple[tuple[int, int], ...]:
    fix = 'Use ints or "lo:hi" strings, e.g. serialization=["3", "10:12"].'
    if isinstance(value, (str, int)):
        value = [value]
    ranges = []
    for item in value:
        try:
            if isinstance(item, bool):
                raise ValueError(item)
            if isinstance(item, int):
                lo = hi = item
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                lo, hi = int(item[0]), int(item[1])
            elif isinstance(item, str) and ":" in item:
                lo_s, hi_s = item.split(":", 1)
                lo, hi = int(lo_s), int(hi_s)
            else:
                lo = hi = int(item)
        except (TypeError, ValueError) as err:
            raise _fail("serialization", value, "a list of levels or level ranges", fix) from err
        if lo < 0 or hi < lo:
            raise _fail("serialization", value, "ranges with 0 <= lo <= hi", fix)
        ranges.append((lo, hi))
    return tuple(sorted(set(ranges)))
