"""The target a plan is made for: device model, host link, budget, memory accounting, stack.

Every stage that times or sizes a step (the recompute planner, the ordering
and retiming levers, the simulator, the auto-tuner) needs the same answers:
which GPU, over which link, within how many bytes, counted how, with which
software stack. A :class:`Target` holds them, resolved once by the front end
(:class:`tflms.LMSCallback`, :func:`tflms.function`, :class:`tflms.LMS`,
:func:`tflms.autotune`, :func:`tflms.simulate`, the ``tflms`` command) from
the options the user gave (``LMSConfig.target()`` for a config), and passed
down. The device assumed when none is
named is :data:`DEFAULT_DEVICE`, here and nowhere else.

Example:
    >>> Target.for_budget("A100-80GB").describe()
    'A100-80GB over pcie3, budget 80.00 GiB, realistic accounting (tf2 stack)'
    >>> t = Target.for_budget("16GiB", link="nvlink2")
    >>> t.device.name, t.link.name, t.budget_bytes, t.accounting
    ('V100-16GB', 'nvlink2', 17179869184, 'tensors')
    >>> Target.for_device().accounting, Target.for_device("V100-16GB").budget_bytes is None
    ('realistic', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from tflms.cost.gpu_memory import GPU_FACTS, SoftwareStack, configured_stack, get_stack
from tflms.cost.hardware import DEVICES, DeviceModel, LinkModel, get_device, get_link
from tflms.errors import ConfigError
from tflms.utils.units import format_bytes, parse_bytes

__all__ = [
    "ACCOUNTINGS",
    "Accounting",
    "DEFAULT_DEVICE",
    "DEFAULT_LINK",
    "Target",
    "resolve_budget",
]

DEFAULT_DEVICE = "V100-16GB"
"""The device model assumed when neither a device nor a budget naming a GPU preset is given."""

DEFAULT_LINK = "pcie3"
"""The host link assumed when none is given (``LMSConfig.link``'s default)."""

Accounting: TypeAlias = Literal["realistic", "tensors", "tensorflow", "grappler"]
"""A memory accounting of :func:`tflms.simulate`: a key of :data:`ACCOUNTINGS`."""

ACCOUNTINGS = {
    "realistic": "TensorFlow's conventions plus what a GPU process holds beyond tensors",
    "tensors": "variables resident, variable reads and Identity/Reshape alias their input",
    "tensorflow": "the former name of 'tensors'",
    "grappler": "every output is a fresh buffer, variable reads included; variables weigh 0",
}
"""The memory accountings of :func:`tflms.simulation.memory.trace_memory` and :func:`tflms.simulate`."""


def resolve_budget(budget: int | str | DeviceModel | None) -> tuple[int, DeviceModel | None]:
    """``(bytes, device preset or None)`` from a budget.

    Args:
        budget: Bytes (int), a size string (``"16GiB"``, ``"900MB"``), a device
            preset name or :class:`DeviceModel`.

    Returns:
        ``(budget in bytes, the device preset)``; the preset is None when the
        budget was given as a size.

    Raises:
        ConfigError: no budget was given, or it is not a size or a preset.

    Example:
        >>> resolve_budget("16GiB")[0], resolve_budget("A100-80GB")[1].name
        (17179869184, 'A100-80GB')
    """
    value = budget
    if value is None:
        raise ConfigError(
            "No memory budget: pass one, e.g. tflms.autotune(view, '16GiB'), or set "
            "LMSConfig(memory_budget='16GiB')."
        )
    if isinstance(value, DeviceModel):
        return value.memory_bytes, value
    if isinstance(value, str) and value.strip().lower() in {n.lower() for n in DEVICES}:
        device = get_device(value.strip())
        return device.memory_bytes, device
    try:
        size = parse_bytes(value)
    except ValueError as err:
        raise ConfigError(
            f"memory budget must be a byte count, a size such as '16GiB' or a device preset "
            f"({', '.join(DEVICES)}). Received {value!r}."
        ) from err
    if size <= 0:
        raise ConfigError(f"memory budget must be positive. Received {value!r}.")
    return size, None


def _check_accounting(accounting: str) -> Accounting:
    if accounting not in ACCOUNTINGS:
        raise ConfigError(
            f"accounting must be one of {sorted(ACCOUNTINGS)}. Received accounting={accounting!r}."
        )
    return accounting  # type: ignore[return-value]  # checked against ACCOUNTINGS' keys


@dataclass(frozen=True)
class Target:
    """What a plan is made for, resolved: build it with :meth:`for_budget` or :meth:`for_device`.

    Attributes:
        device: the device model ops are timed on (and whose memory a
            ``"realistic"`` accounting counts).
        link: the host link swap copies are timed over.
        budget_bytes: the device memory the step must fit in; None when no
            budget was given (simulation without a verdict, plans with fixed
            options).
        accounting: the memory conventions peaks are judged by (a key of
            :data:`ACCOUNTINGS`).
        stack: the software stack whose non-tensor terms ``"realistic"``
            counts, calibrated when ``LMSConfig.tensor_factor`` is not 1.0.
        budget_preset: the device preset the budget named (``"A100-80GB"``),
            None when the budget was a size.
    """

    device: DeviceModel
    link: LinkModel
    budget_bytes: int | None = None
    accounting: Accounting = "tensors"
    stack: SoftwareStack = get_stack("tf2")
    budget_preset: str | None = None

    @classmethod
    def for_device(
        cls,
        device: str | DeviceModel | None = None,
        link: str | LinkModel | None = None,
        *,
        accounting: Accounting | None = None,
        stack: str | SoftwareStack = "tf2",
    ) -> Target:
        """A target without a budget, for simulating a step on ``device``.

        Args:
            device: a preset name or a model; default :data:`DEFAULT_DEVICE`.
            link: a link preset name or a model; default :data:`DEFAULT_LINK`.
            accounting: default ``"realistic"`` on a GPU preset with measured
                facts, ``"tensors"`` on a custom :class:`DeviceModel`.
            stack: a :data:`~tflms.cost.gpu_memory.STACKS` name or a stack.

        Returns:
            The resolved target.

        Raises:
            ConfigError: an unknown preset, accounting or stack.
        """
        model = get_device(device if device is not None else DEFAULT_DEVICE)
        if accounting is None:
            accounting = "realistic" if model.name in GPU_FACTS else "tensors"
        return cls(
            model,
            get_link(link if link is not None else DEFAULT_LINK),
            None,
            _check_accounting(accounting),
            get_stack(stack),
        )

    @classmethod
    def for_budget(
        cls,
        budget: int | str | DeviceModel | None,
        *,
        device: str | DeviceModel | None = None,
        link: str | LinkModel | None = None,
        accounting: Accounting | None = None,
        stack: str | SoftwareStack = "tf2",
        tensor_factor: float = 1.0,
    ) -> Target:
        """A target with a memory budget, for planning and auto-tuning.

        Args:
            budget: bytes, a size such as ``"16GiB"``, a device preset name or
                a :class:`DeviceModel`; None: no budget (plans with fixed
                options still time their levers on the device).
            device: the device model for time predictions; default the
                budget's preset, else :data:`DEFAULT_DEVICE`.
            link: default :data:`DEFAULT_LINK`.
            accounting: default ``"realistic"`` when the budget names a GPU
                preset with measured facts, else ``"tensors"``.
            stack: the software stack (a name or a stack).
            tensor_factor: ``LMSConfig.tensor_factor``: calibrates ``stack``
                when not 1.0, which only the ``"realistic"`` accounting reads.

        Returns:
            The resolved target.

        Raises:
            ConfigError: an invalid budget, preset, accounting or stack, or a
                ``tensor_factor`` with an accounting that does not read it.
        """
        budget_bytes, preset = (None, None) if budget is None else resolve_budget(budget)
        if device is not None:
            model = get_device(device)
        else:
            model = preset or get_device(DEFAULT_DEVICE)
        if accounting is None:
            accounting = (
                "realistic" if preset is not None and preset.name in GPU_FACTS else "tensors"
            )
        accounting = _check_accounting(accounting)
        if tensor_factor != 1.0:
            if accounting != "realistic":
                raise ConfigError(
                    f"LMSConfig.tensor_factor={tensor_factor:g} calibrates the realistic GPU "
                    f"memory model, but this budget is judged by {accounting!r}. Give the budget "
                    "as a GPU preset (memory_budget='V100-16GB') or leave tensor_factor at 1.0."
                )
            stack = configured_stack(stack, tensor_factor)
        return cls(
            model,
            get_link(link if link is not None else DEFAULT_LINK),
            budget_bytes,
            accounting,
            get_stack(stack),
            preset.name if preset is not None else None,
        )

    def describe(self) -> str:
        """One line: device, link, budget, accounting and stack."""
        budget = f"budget {format_bytes(self.budget_bytes)}" if self.budget_bytes else "no budget"
        return (
            f"{self.device.name} over {self.link.name}, {budget}, {self.accounting} accounting "
            f"({self.stack.name} stack)"
        )
