"""Plan entries: the levers a plan pulls on one tensor - swap it, or recompute it.

Naming (see :mod:`tflms.plan.swap_plan` for why): swap-outs are called
``lms/swapout_<tensor>``; swap-ins ``<producer>-lms/swapin`` (``-lms/swapin_out<k>``
for output ``k > 0``, plus ``_<n>`` for the n-th consumer group); the clone of
op ``<op>`` that recomputes it is ``<op>-lms/recompute`` (plus ``_<n>`` for
the n-th group recomputing it). A renamed input sorts where the original input
sorted, so Grappler canonicalizes the rewritten graph as it did the original.

Example:
    >>> r = Recompute(ops=("bn/mul", "relu"), consumers=(("grad/ReluGrad", 1, "relu", 0),),
    ...               trigger="grad/conv", trigger_level=40, consumer_level=42)
    >>> r.clone_name("relu"), r.tensors, r.entry_ops(lambda op: {"relu": ["bn/mul"]}.get(op, ["x"]))
    ('relu-lms/recompute', ('relu:0',), ('bn/mul',))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SwapIn", "Swap", "Recompute", "SCOPE"]

SCOPE = "lms"


def _sanitize(tensor_name: str) -> str:
    return tensor_name.replace(":", "_")


@dataclass(frozen=True)
class SwapIn:
    """One swap-in of a swapped-out tensor, shared by a group of consumers.

    Attributes:
        consumers: ``(op name, input index)`` pairs rerouted to read the
            swapped-in copy instead of the original tensor.
        trigger: op whose completion starts the swap-in (a control edge
            ``trigger -> swap-in``); ``None`` when there is no suitable op.
        control_inputs: further ops the swap-in waits for (sync mode 2 and
            the synchronous fallback: the consumer's other inputs).
        trigger_level: level of ``trigger`` (``None`` without trigger).
        consumer_level: level of the earliest consumer.
        fallback: why no trigger was found (``None`` when one was).
    """

    consumers: tuple[tuple[str, int], ...]
    trigger: str | None = None
    control_inputs: tuple[str, ...] = ()
    trigger_level: int | None = None
    consumer_level: int = 0
    fallback: str | None = None


@dataclass(frozen=True)
class Swap:
    """One tensor swapped out to the host and back in for its far consumers.

    Attributes:
        tensor: ``"op:index"`` name of the swapped tensor.
        producer, index: the op producing it and the output index.
        bytes: estimated size (see :class:`tflms.graph.view.TensorInfo`).
        dtype: dtype name.
        producer_level: the producer's level.
        device: the producer's device string (``""`` if unassigned).
        swap_ins: one entry per consumer group.
        wait_for_swapout: ops given a control edge from the swap-out
            (sync modes 1 and 3: the producer's other consumers, but those
            Grappler's check pinned).
        streamed: the tensor lives on the host already (a weight kept there,
            :mod:`tflms.plan.streams`): every device reader, forward ones
            included, reads a swap-in, and the swap-out copies nothing.
    """

    tensor: str
    producer: str
    index: int
    bytes: int
    dtype: str
    producer_level: int
    device: str
    swap_ins: tuple[SwapIn, ...]
    wait_for_swapout: tuple[str, ...] = ()
    streamed: bool = False

    @property
    def swapout_name(self) -> str:
        """Name of the swap-out op, ``lms/swapout_<tensor>``."""
        return f"{SCOPE}/swapout_{_sanitize(self.tensor)}"

    def swapin_name(self, k: int) -> str:
        """Name of the swap-in of consumer group ``k`` (see the module docstring).

        Args:
            k: Index of the consumer group in ``swap_ins`` (0-based); group 0
                gets no ``_k`` suffix.

        Returns:
            ``<producer>-lms/swapin[_out<index>][_<k>]``.
        """
        base = f"{self.producer}-{SCOPE}/swapin" + (f"_out{self.index}" if self.index else "")
        return f"{base}_{k}" if k else base

    @property
    def consumers(self) -> tuple[tuple[str, int], ...]:
        return tuple(c for s in self.swap_ins for c in s.consumers)


@dataclass(frozen=True)
class Recompute:
    """Cheap ops re-run just before their far consumers, instead of keeping their outputs.

    Each op of :attr:`ops` is cloned (:meth:`clone_name`); a clone reads the
    clone of an op of the group where the original read that op, and the
    original tensor otherwise - which a swap of the same plan may in turn
    bring back from the host. The far consumers read the clones, so the
    originals' outputs die after the forward pass.

    Attributes:
        ops: the original ops to clone, in topological order.
        consumers: ``(consumer, input index, op, output index)``: the far
            consumers rerouted to read output ``output index`` of ``op``'s clone.
        trigger: op whose completion starts the recomputation (a control edge
            into every clone that reads nothing of the group); ``None`` when
            the clones may run as soon as their inputs exist.
        trigger_level: level of ``trigger``; consumer_level: level of the
            earliest consumer.
        group: which recomputation of these ops this is (names of later
            groups get ``_<group>``).
        bytes: bytes of the rerouted tensors: what the device no longer holds
            between the forward use and the recomputation.
        seconds: predicted compute time of the clones.
        reason: why this lever was chosen.
        device: where the clones run; ``""``: with their originals (a weight's
            cast runs on the host instead, so its float16 copy is what streams:
            :func:`tflms.plan.streams.plan_host_casts`).
        gates: ``(op, output index)`` of the tensors the group's first clones
            read through a *gate* (:meth:`gate_name`): an Identity kept by
            Grappler that waits for the trigger. The clones themselves are
            left to Grappler, which then fuses and folds them as it does their
            originals (a ``MatMul`` + ``BiasAdd`` clone becomes the same
            ``_FusedMatMul``), while the gates keep them distinct from the
            originals (no merge) and start them at the trigger. Empty: every
            clone is kept from Grappler and the trigger edge goes into the
            clones themselves (a group that reads only constants).
        control_inputs: ops the re-run also waits for, like the trigger (a
            control edge from each into the gates, or into the first clones):
            the other readers of tensors that die before the trigger, so that
            the re-run never runs beside them (:mod:`tflms.plan.release`).

    Every original tensor whose far consumers now read a clone (:attr:`held`)
    keeps one reader in their place: a *hold* (:meth:`hold_name`), an
    Identity kept by Grappler that reads the original as soon as it exists
    and gives nothing to anyone (a control edge into the gates, or into the
    first clones, keeps it in the step). Grappler's rewrites of the forward
    pass count readers (the remapper fuses a ``MatMul`` with its GELU only
    when nothing else reads the GELU's intermediates; the arithmetic
    optimizer folds an op into its one reader): with a hold the originals
    keep the readers they had, so the forward pass is rewritten as it is
    without the plan.
    """

    ops: tuple[str, ...]
    consumers: tuple[tuple[str, int, str, int], ...]
    trigger: str | None = None
    trigger_level: int | None = None
    consumer_level: int = 0
    group: int = 0
    bytes: int = 0
    seconds: float = 0.0
    reason: str = ""
    device: str = ""
    gates: tuple[tuple[str, int], ...] = ()
    control_inputs: tuple[str, ...] = ()

    def clone_name(self, op: str) -> str:
        """Name of the clone of ``op`` (see the module docstring).

        Args:
            op: Name of an op of this group.

        Returns:
            ``<op>-lms/recompute``, with ``_<group>`` appended for groups other
            than 0.
        """
        base = f"{op}-{SCOPE}/recompute"
        return f"{base}_{self.group}" if self.group else base

    @property
    def clone_names(self) -> tuple[str, ...]:
        """Names of every clone, in :attr:`ops` order."""
        return tuple(self.clone_name(op) for op in self.ops)

    def gate_name(self, i: int) -> str:
        """Name of the gate of ``gates[i]``: ``<first op>-lms/recompute[_<group>]_gate<i>``.

        Args:
            i: Index into :attr:`gates`.

        Returns:
            The gate's name.
        """
        return f"{self.clone_name(self.ops[0])}_gate{i}"

    @property
    def held(self) -> tuple[tuple[str, int], ...]:
        """``(op, output index)`` of each original tensor the far consumers no longer read,
        in :attr:`consumers` order: each gets a hold (see the class doc)."""
        return tuple(dict.fromkeys((op, k) for _, _, op, k in self.consumers))

    def hold_name(self, i: int) -> str:
        """Name of the hold of ``held[i]``: ``<first op>-lms/recompute[_<group>]_hold<i>``.

        Args:
            i: Index into :attr:`held`.

        Returns:
            The hold's name.
        """
        return f"{self.clone_name(self.ops[0])}_hold{i}"

    @property
    def inserted(self) -> tuple[str, ...]:
        """Names of every op the group inserts: clones, then gates, then holds."""
        return (
            self.clone_names
            + tuple(self.gate_name(i) for i in range(len(self.gates)))
            + tuple(self.hold_name(i) for i in range(len(self.held)))
        )

    @property
    def tensors(self) -> tuple[str, ...]:
        """The ``"op:index"`` tensors whose far consumers read clones, sorted."""
        return tuple(sorted({f"{op}:{k}" for _, _, op, k in self.consumers}))

    def entry_ops(self, inputs_of: Callable[[str], list[str]]) -> tuple[str, ...]:
        """Ops of the group that read no op of the group (they get the trigger edge).

        Args:
            inputs_of: the names of the ops an op reads data from.

        Returns:
            Their names, in the group's order.
        """
        members = set(self.ops)
        return tuple(op for op in self.ops if not members.intersection(inputs_of(op)))
