"""The auto-tuner the reference way: every plan made and simulated from scratch.

:func:`tflms.autotune` shares work across the plans of one view (a
:class:`~tflms.simulation.plans.PlanSimulator`, a
:class:`~tflms.compose.levers.Levers` memo). :func:`from_scratch` swaps both
for the reference they must equal: :class:`SimulateEach` (``tflms.simulate``
per plan) and a fresh lever composition per setting.
``tests/tflms/test_autotune_reuse.py`` holds the two paths to the same
results; ``bench_tflms_rewrite.py`` times them side by side.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import networkx as nx

from tflms.compose.levers import compose_plan
from tflms.cost.gpu_memory import SoftwareStack
from tflms.cost.hardware import DeviceModel, LinkModel
from tflms.cost.target import Accounting
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.simulator import SimulationResult, simulate
from tflms.tuning import search

__all__ = ["SimulateEach", "from_scratch"]


@contextlib.contextmanager
def from_scratch():
    """Within it, :func:`tflms.autotune` plans and simulates every setting anew."""

    def fresh(view, config, target, *, retime=None, levers=None, order_plain=True):
        return compose_plan(view, config, target, retime=retime, order_plain=order_plain)

    with (
        mock.patch.object(search, "PlanSimulator", SimulateEach),
        mock.patch.object(search, "compose_plan", fresh),
    ):
        yield


class SimulateEach:
    """:class:`~tflms.simulation.plans.PlanSimulator`'s interface on :func:`tflms.simulate`: the reference.

    Every call rewrites, compiles and simulates from scratch, as the
    auto-tuner did before it shared work across plans; tests and the
    rewrite-speed benchmark check that both give the same results.

    Args:
        view: The analysis view the plans are made from.
        device: Device preset name or model.
        link: The default link preset or model.
        accounting: Memory conventions, as for :func:`tflms.simulate`.
        stack: The software stack, as for :func:`tflms.simulate`.
    """

    def __init__(
        self,
        view: nx.DiGraph,
        *,
        device: str | DeviceModel,
        link: str | LinkModel,
        accounting: Accounting,
        stack: str | SoftwareStack = "tf2",
    ):
        self.view, self.device, self.link = view, device, link
        self.accounting: Accounting = accounting
        self.stack = stack
        self.costs: dict | None = None  # nothing memoized: every op is timed anew
        self.baseline = simulate(view, device=device, link=link, accounting=accounting, stack=stack)

    def simulate(
        self,
        plan: SwapPlan,
        *,
        link: str | LinkModel | None = None,
        baseline: SimulationResult | None = None,
    ) -> SimulationResult:
        """``tflms.simulate(view, plan, baseline=baseline or False, ...)``.

        Args:
            plan: A plan made from the view.
            link: The link to simulate over; None for the default one.
            baseline: The result to report the overhead against; None for none.

        Returns:
            The :class:`SimulationResult`.
        """
        return simulate(
            self.view,
            plan,
            device=self.device,
            link=self.link if link is None else link,
            baseline=baseline or False,
            accounting=self.accounting,
            stack=self.stack,
        )
