"""Simulate many plans of one view, sharing the work they have in common.

:func:`tflms.simulate` copies the view, rewrites the copy with the plan,
recomputes its levels, times every op, schedules and traces memory. The
auto-tuner (:func:`tflms.autotune`) asks that for dozens of plans of one view,
and again with instantaneous copies for every plan that fits over the link.
:class:`PlanSimulator` returns the very same results with less work:

* plans that change the graph alike (the same swaps, recomputations,
  serialization chains, order edges and host device; options and notes may
  differ) are simulated once per link;
* a plan's view is rewritten and compiled once: another link re-times only
  its copies and loops (:func:`~tflms.simulation.schedule.relinked`);
* the rewritten view's levels are not recomputed: the simulator reads none;
* the view is copied once, and each plan rewrites that copy in place and is
  undone before the next (:func:`~tflms.apply.core.apply_in_place`): a copy
  of a 15,000-op view costs more than its rewrite;
* op times are memoized across plans: an op the plan leaves alone costs what
  it cost before, and a clone or swap op is named after what it copies.

Example:
    >>> import tensorflow as tf, tflms
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [256, 1024], name="x")
    ...     h = tf.nn.relu(x, name="h")
    ...     y = tf.tanh(h, name="y")
    ...     z = tf.add(y, h, name="z")
    >>> view = tflms.build_view(g)
    >>> plans = PlanSimulator(view, device="V100-16GB", link="pcie3", accounting="tensors")
    >>> plan = tflms.SwapPlan()
    >>> plans.simulate(plan) == tflms.simulate(view, plan, accounting="tensors")
    True
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from tflms.apply.core import apply_in_place
from tflms.cost.gpu_memory import SoftwareStack, get_stack
from tflms.cost.hardware import DeviceModel, LinkModel, get_device, get_link
from tflms.errors import ConfigError
from tflms.plan.swap_plan import SwapPlan
from tflms.simulation.allocator import Accounting
from tflms.simulation.schedule import CompiledGraph, compile_view, relinked
from tflms.simulation.simulator import SimulationResult, finished, run_compiled

__all__ = ["PlanSimulator", "plan_key"]


def plan_key(plan: SwapPlan) -> tuple:
    """What a plan changes in a graph: equal keys, equal rewrites.

    Args:
        plan: A swap plan.

    Returns:
        Its swaps, recomputations, serialization chains, order edges and host
        device (what :func:`tflms.apply.core.apply_with` reads).
    """
    return (plan.swaps, plan.recomputes, plan.serialization, plan.order, plan.config.host_device)


class PlanSimulator:
    """:func:`tflms.simulate` of one view under many plans (see the module docstring).

    Args:
        view: The analysis view the plans are made from (without tflms ops).
        device: Device preset name or model.
        link: The link preset (or model) plans are simulated over by default.
        accounting: Memory conventions, as for :func:`tflms.simulate`.
        stack: The software stack, as for :func:`tflms.simulate`.

    Attributes:
        baseline: The simulation of ``view`` without a plan, over ``link``.
        costs: The op times memoized across plans (``compile_view``'s ``costs``);
            other compilations of the view's rewrites on this device may share it.
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
        self.view = view
        self.device, self.link = get_device(device), get_link(link)
        self.accounting: Accounting = accounting
        self.stack = get_stack(stack)
        self.costs: dict = {}
        self._runs: dict[tuple, SimulationResult] = {}
        self._compiled: tuple[tuple, nx.DiGraph, CompiledGraph] | None = None
        self._work: nx.DiGraph | None = None  # a copy of the view, holding one plan at a time
        self._undo: Callable[[], None] | None = None  # restores _work
        self.baseline = finished(view, self._run(SwapPlan(), self.link), None)

    def simulate(
        self,
        plan: SwapPlan,
        *,
        link: str | LinkModel | None = None,
        baseline: SimulationResult | None = None,
    ) -> SimulationResult:
        """The same as ``tflms.simulate(view, plan, baseline=baseline or False, ...)``.

        Args:
            plan: A plan made from the view.
            link: The link to simulate over; None for the simulator's.
            baseline: The result to report the overhead against (as
                :attr:`SimulationResult.baseline`); None for none.

        Returns:
            The :class:`SimulationResult`.

        Raises:
            ConfigError: ``plan`` is not a :class:`~tflms.SwapPlan`.
            ValidationError: the plan does not match the view.
        """
        if not isinstance(plan, SwapPlan):
            raise ConfigError(f"plan must be a tflms.SwapPlan, got {type(plan).__name__}.")
        model = self.link if link is None else get_link(link)
        return finished(self.view, self._run(plan, model), baseline)

    def _run(self, plan: SwapPlan, link: LinkModel) -> SimulationResult:
        key = plan_key(plan)
        if (key, link) in self._runs:
            return self._runs[(key, link)]
        if self._compiled is not None and self._compiled[0] == key:
            _, target, graph = self._compiled
            graph = relinked(graph, target, link) if graph.link != link else graph
        else:
            target = self._rewritten(plan)
            graph = compile_view(
                target,
                device=self.device,
                link=link,
                bypass_identity_n=self.accounting != "grappler",
                costs=self.costs,
            )
            self._compiled = (key, target, graph)  # the next call is often the same plan
        result = run_compiled(target, graph, self.accounting, "exact", None, self.stack)
        self._runs[(key, link)] = result
        return result

    def _rewritten(self, plan: SwapPlan) -> nx.DiGraph:
        """The working copy of the view rewritten with ``plan`` (the view itself if empty).

        The plan it held before is undone first; until the next rewrite, the
        copy (and so ``_compiled``'s view) holds ``plan``.
        """
        if plan.empty:
            return self.view
        self._compiled = None  # its view is the working copy, about to change
        if self._undo is not None:
            self._undo()
            self._undo = None
        if self._work is None:
            self._work = self.view.copy()
        self._undo = apply_in_place(self._work, plan)
        return self._work
