"""Memory model of the simulator: buffers, their lifetimes, and the peaks.

Given a schedule (:mod:`tflms.simulation.schedule`), every op output becomes a
*buffer* in device or host memory:

* a buffer is allocated when its producer starts and freed when the last
  data consumer of every tensor in it ends (control edges never extend a
  life); an output nothing reads dies when its producer ends;
* a swap-out (a copy on the ``d2h`` stream) is one more consumer of the
  device tensor, so the device copy is freed only when the swap-out *and*
  the producer's other device consumers are done; the host copy lives until
  the last swap-in has finished copying it back;
* a swap-in (``h2d``) allocates device memory when it is dispatched - once
  its trigger has fired and its swap-out is done, even if its copy then
  waits for the host-to-device stream - and frees it after its consumers;
* frees at an instant come before allocations at the same instant (the
  allocator reuses memory on one stream at once), except for buffers that
  are born at that instant (zero-time ops).

Three accountings share this machinery:

TensorFlow's conventions (``"tensors"`` and ``"realistic"``)
    Variables and optimizer slots are resident for the whole step (counted
    once, see :func:`variable_bytes`), a ``ReadVariableOp`` aliases its
    variable, ``Identity``/``Reshape``/``Squeeze``/``ExpandDims``/
    ``StopGradient`` outputs share their input's buffer (TensorFlow forwards
    it), and an element-wise op (:data:`FORWARDING_OPS`) writes its output
    into an input buffer nobody else reads any more, as TensorFlow's kernels
    do. A kernel's own temporaries (an ``Einsum``'s transposed operands,
    :mod:`tflms.cost.temporaries`) are held while it runs. An op reading a
    tensor of the other memory space without a tflms copy
    gets TensorFlow's own copy, made as soon as the tensor exists and freed
    after its last reader there, and the source is freed once copied
    (:func:`_crossings`). The peak is what an allocator would need at least.

``"realistic"`` (the default for device presets: what a GPU process holds)
    TensorFlow's conventions as above, and every term a real TensorFlow GPU
    process holds beyond its tensors (:mod:`tflms.cost.gpu_memory`): the
    memory the driver hides, the CUDA context, TensorFlow's reserve, the BFC
    allocator's rounding and fragmentation (the step's allocations replayed
    in one region of the allocator's limit; the peak is its high-water mark)
    and cuDNN convolution workspaces where they fit under that limit.
    ``MemoryTrace.terms`` names each term; they add up to the device peak.

``"tensors"`` (``"tensorflow"`` is its former name)
    TensorFlow's conventions, tensors only: what the step's buffers need at
    least, for analysis and for comparing plans.

``"grappler"`` (Grappler's conventions, for a like-with-like cross-check)
    Every output is a fresh buffer, ``ReadVariableOp`` and ``Identity``
    outputs included, and variables themselves weigh nothing; times are
    truncated to whole microseconds and a buffer is freed 1 ns after its last
    consumer ends, so the op that starts next still sees it - exactly as
    ``GraphMemory`` counts (see :mod:`tflms.simulation.grappler`).

Example:
    >>> ACCOUNTINGS["grappler"].startswith("every output")
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflms.cost import gpu_memory
from tflms.cost.ops import ALIAS_OPS, updates_a_variable
from tflms.cost.target import ACCOUNTINGS
from tflms.cost.temporaries import TEMPORARY_OPS
from tflms.errors import ConfigError
from tflms.simulation.allocator import BufferReplay, check_allocator, replay_region
from tflms.simulation.schedule import CompiledGraph, Schedule

__all__ = [
    "ACCOUNTINGS",
    "FORWARDING_OPS",
    "FORWARDED_OUTPUT",
    "MemoryTrace",
    "LiveBuffer",
    "trace_memory",
    "variable_bytes",
    "variable_sizes",
]

TF_CONVENTIONS = frozenset({"realistic", "tensors", "tensorflow"})
"""Accountings that follow TensorFlow's buffer conventions (aliases, forwarding, variables)."""

_HANDLE_TYPES = ("VarHandleOp", "Placeholder", "_Arg", "VariableV2", "Variable")


@dataclass(frozen=True)
class LiveBuffer:
    """A buffer live at a peak.

    Attributes:
        tensor: the tensor that created the buffer (``"op:index"``).
        op_type: type of its producer.
        bytes: its size.
        allocated_s: when it was allocated (simulated seconds).
        freed_s: when it is freed.
    """

    tensor: str
    op_type: str
    bytes: int
    allocated_s: float
    freed_s: float


@dataclass(frozen=True)
class MemoryTrace:
    """Device and host memory over one simulated step.

    Attributes:
        ops: op number of each timeline point, in start order.
        times: simulated start time of each point's op (seconds).
        device, host: bytes in use right after each point's op allocated
            its outputs (``device`` includes resident variables).
        device_peak, host_peak: the maxima.
        device_peak_point, host_peak_point: index of the point at the peak.
        live_at_peak: buffers on the device at its peak, largest first.
        variable_bytes: resident variable bytes on the device (0 under
            Grappler's accounting).
        host_variable_bytes: resident variable bytes on the host (an
            offloaded optimizer's state, weights kept there; 0 under
            Grappler's accounting).
        terms: under ``"realistic"``, the device peak by term (bytes, in
            order: driver, cuda_context, tensorflow_reserve, tensors,
            calibration (only for a calibrated stack), workspace, allocator);
            empty otherwise.
        allocator_limit: under ``"realistic"``, the bytes TensorFlow's
            allocator may hand out (:func:`tflms.cost.gpu_memory.allocator_limit`).
    """

    ops: tuple
    times: tuple
    device: tuple
    host: tuple
    device_peak: int
    host_peak: int
    device_peak_point: int
    host_peak_point: int
    live_at_peak: tuple
    variable_bytes: int
    terms: dict = field(default_factory=dict)
    allocator_limit: int | None = None
    host_variable_bytes: int = 0


def variable_bytes(graph: CompiledGraph) -> int:
    """Bytes of the variables on the device, read off their reads and assigns.

    A variable handle weighs nothing in a graph; its size is that of the
    largest ``ReadVariableOp`` output or assigned value among its users, or
    the variable's own size where the view knows it (a traced step's handle
    data: a variable read only inside a called function, as an optimizer's
    slots behind a loss-scale ``cond``, is still resident).

    Args:
        graph: The compiled step graph.

    Returns:
        The total, in bytes, of :func:`variable_sizes`.
    """
    return sum(variable_sizes(graph))


def variable_sizes(graph: CompiledGraph, space: str = "device") -> list[int]:
    """The size of each variable in ``space``, in graph order (see :func:`variable_bytes`).

    Args:
        graph: The compiled step graph.
        space: ``"device"``, or ``"host"`` for variables kept on the host (an
            offloaded optimizer's state, :mod:`tflms.keras.offload`).

    Returns:
        Bytes per variable handle in that space, in graph order; 0 for a
        variable neither read nor assigned in the graph.
    """
    sizes = []
    for i, out in enumerate(graph.outputs):
        if graph.spaces[i] != space or graph.types[i] not in _HANDLE_TYPES:
            continue
        if not out or out[0].dtype != "resource":
            continue
        sizes.append(_variable_size(graph, i))
    return sizes


def _variable_size(graph: CompiledGraph, handle: int) -> int:
    """Bytes of the variable behind op ``handle`` (see :func:`variable_bytes`)."""
    size = graph.held[handle] if graph.held else 0
    for j in graph.consumers.get((handle, 0), ()):
        if graph.types[j] == "ReadVariableOp":
            size = max(size, sum(t.bytes for t in graph.outputs[j]))
        elif graph.types[j] == "AssignVariableOp":
            for p, k, in_idx in graph.inputs[j]:
                if in_idx == 1:
                    size = max(size, graph.outputs[p][k].bytes)
    return size


def _whole_us(seconds: float) -> float:
    """Grappler's step stats keep whole microseconds (truncated)."""
    return int(seconds * 1e6 + 1e-6) / 1e6


def _alias_source(graph: CompiledGraph, i: int, k: int):
    wanted = k if graph.types[i] == "IdentityN" else 0
    for p, out_idx, in_idx in graph.inputs[i]:
        if in_idx == wanted:
            return p, out_idx
    return None


FORWARDING_OPS: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        (
            "Abs", "Ceil", "Cos", "Elu", "Erf", "Exp", "Expm1", "Floor", "Inv", "LeakyRelu",
            "Log", "Log1p", "Neg", "Reciprocal", "Relu", "Relu6", "Rint", "Round", "Rsqrt",
            "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Square", "Tan",
            "Tanh", "BiasAdd",
        ),
        (0,),
    ),
    **dict.fromkeys(
        (
            "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv",
            "FloorMod", "Maximum", "Minimum", "Pow", "SquaredDifference", "Xdivy", "Xlogy",
            "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
            "TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
        ),
        (0, 1),
    ),
    "SelectV2": (1, 2),
    "Select": (1, 2),
    "AddN": None,
    "SoftmaxCrossEntropyWithLogits": (0,),
    "SparseSoftmaxCrossEntropyWithLogits": (0,),
}  # fmt: skip
"""Ops whose TensorFlow kernels write their output into an input buffer when that input
is read by nobody else any more (``forward_input_or_allocate_output``), and which inputs
they try, in order (``None``: all). Element-wise ops and their gradients, BiasAdd, AddN,
and the softmax cross-entropies, whose backprop output takes the logits' buffer
(:data:`FORWARDED_OUTPUT`): a language model's loss holds one logits-sized tensor, not two."""

FORWARDED_OUTPUT: dict[str, int] = {
    "SoftmaxCrossEntropyWithLogits": 1,
    "SparseSoftmaxCrossEntropyWithLogits": 1,
}
"""The output a :data:`FORWARDING_OPS` op writes into its input's buffer, where it is not
the first (the cross-entropies' backprop; their loss is a new, small tensor)."""


def _forwardable(graph, schedule, i, info, buffer_of, b_tensors, b_space, b_bytes):
    """The input buffer op ``i`` may write its output into, or ``None``.

    The input must be on the device, as large as the output, of the same
    dtype, not a function argument, read once by ``i``, and every other
    reader of its buffer (aliases included) must have ended when ``i``
    starts: the reference count the kernel sees is then 1.
    """
    allowed = FORWARDING_OPS[graph.types[i]]
    inputs = graph.inputs[i]
    read = [buffer_of.get((p, k)) for p, k, _ in inputs]
    start, end, consumers = schedule.start[i], schedule.end, graph.consumers
    for (p, k, in_idx), b in zip(inputs, read, strict=True):  # ordered by input index
        if (
            b is None
            or (allowed is not None and in_idx not in allowed)
            or b_bytes[b] != info.bytes
            or b_space[b] != "device"
            or read.count(b) != 1
            or graph.outputs[p][k].dtype != info.dtype
            or graph.types[b_tensors[b][0][0]] in _HANDLE_TYPES
        ):
            continue
        if _readers_done(b_tensors[b], consumers, end, start, i):
            return b
    return None


def _readers_done(tensors, consumers, end, start, i) -> bool:
    """Whether every reader of ``tensors`` other than op ``i`` ended by ``start``."""
    for t in tensors:
        for c in consumers.get(t, ()):
            if end[c] > start and c != i:
                return False
    return True


def trace_memory(
    graph: CompiledGraph,
    schedule: Schedule,
    *,
    accounting: str = "tensorflow",
    allocator: str = "exact",
    top: int = 20,
    stack: str | gpu_memory.SoftwareStack = "tf2",
) -> MemoryTrace:
    """Replay ``schedule`` and account every buffer (see the module docstring).

    Args:
        graph: the compiled view.
        schedule: when each op runs.
        accounting: ``"tensorflow"`` or ``"grappler"`` (:data:`ACCOUNTINGS`).
        allocator: ``"exact"`` (bytes of the live tensors) or ``"bfc"`` (the
            chunks TensorFlow's BFC allocator hands out with growth, in the
            second of two replayed steps; :data:`ALLOCATORS`).
        top: how many of the largest live buffers to keep at the peak.
        stack: under ``"realistic"``, the software stack
            (:data:`tflms.cost.gpu_memory.STACKS`) whose terms count.

    Returns:
        A :class:`MemoryTrace`.

    Raises:
        ConfigError: an unknown ``accounting`` or ``allocator``, or ``"bfc"``
            with Grappler's accounting (its variables weigh nothing).
    """
    if accounting not in ACCOUNTINGS:
        raise ConfigError(
            f"accounting must be one of {sorted(ACCOUNTINGS)}. Received accounting={accounting!r}."
        )
    check_allocator(allocator, accounting)
    realistic = accounting in TF_CONVENTIONS  # TensorFlow's buffer conventions
    gpu = accounting == "realistic"
    end, order = schedule.end, schedule.order
    alloc = schedule.start if schedule.alloc is None else schedule.alloc  # Schedule.alloc_time
    position = [0] * len(graph)
    for pos, i in enumerate(order):
        position[i] = pos

    buffer_of: dict[tuple[int, int], int] = {}
    b_space: list[str] = []
    b_bytes: list[int] = []
    b_producer: list[int] = []
    b_tensors: list[list[tuple[int, int]]] = []
    spaces, types, outputs, copy = graph.spaces, graph.types, graph.outputs, graph.copy
    for i in order:
        space = spaces[i]
        if space is None:
            continue
        op_type = types[i]
        for k, info in enumerate(outputs[i]):
            if info.bytes <= 0:
                continue
            if realistic and op_type == "ReadVariableOp":
                continue  # aliases the resident variable (on the device or the host)
            if realistic and copy[i] is None:
                if op_type in ALIAS_OPS:
                    source = _alias_source(graph, i, k)
                    if source is not None and source in buffer_of:
                        b = buffer_of[source]
                        if b_space[b] == space:
                            buffer_of[(i, k)] = b
                            b_tensors[b].append((i, k))
                            continue
                if op_type in FORWARDING_OPS and k == FORWARDED_OUTPUT.get(op_type, 0):
                    b = _forwardable(
                        graph, schedule, i, info, buffer_of, b_tensors, b_space, b_bytes
                    )
                    if b is not None:  # TensorFlow writes the output into a dying input's buffer
                        buffer_of[(i, k)] = b
                        b_tensors[b].append((i, k))
                        continue
            buffer_of[(i, k)] = len(b_space)
            b_space.append(space)
            b_bytes.append(info.bytes)
            b_producer.append(i)
            b_tensors.append([(i, k)])

    events = []
    alloc_key, free_key = [], []
    consumers_of = graph.consumers.get
    for b, producer in enumerate(b_producer):
        t_alloc = alloc[producer]
        t_free, last = end[producer], producer
        here = b_space[b]
        for i, k in b_tensors[b]:
            for c in consumers_of((i, k), ()):
                if realistic and copy[c] is None and spaces[c] not in (None, here):
                    continue  # read from the other space: TensorFlow's copy (_crossings) is
                if end[c] > t_free or (end[c] == t_free and position[c] > position[last]):
                    t_free, last = end[c], c
            if end[i] > t_free:
                t_free, last = end[i], i
        if realistic:
            a_key = (t_alloc, 1, position[producer])
            f_key = (t_free, 0 if t_free > t_alloc else 2, position[last])
        else:  # GraphMemory: whole microseconds, freed 1 ns after the consumer's end
            a_key = (_whole_us(t_alloc), 1, position[producer])
            f_key = (_whole_us(t_free) + 1e-9, 0, position[last])
        alloc_key.append(a_key)
        free_key.append(f_key)
        events.append((*a_key, b, 1))
        events.append((*f_key, b, -1))
    crossing_names: dict[int, str] = {}
    implicit = []  # buffers TensorFlow makes with no op of the graph: (label, space, bytes, op, at, last)
    if realistic:  # its copy of a tensor read across the link (no tflms op), and copies on write
        implicit += [
            (
                f"{name} (TensorFlow's copy on the {space})",
                space,
                nbytes,
                producer,
                end[producer],
                last,
            )
            for producer, name, space, nbytes, last in _crossings(graph, end, position)
        ]
        implicit += [
            (f"{name} (the value before {graph.names[u]})", space, nbytes, u, alloc[u], last)
            for u, name, space, nbytes, last in _copies_on_write(graph, alloc, end, position)
        ]
    for label, space, nbytes, producer, t_alloc, last in implicit:
        b = len(b_space)
        crossing_names[b] = label
        b_space.append(space)
        b_bytes.append(nbytes)
        b_producer.append(producer)
        b_tensors.append([])
        a_key = (t_alloc, 1, position[producer])
        f_key = (end[last], 0 if end[last] > t_alloc else 2, position[last])
        alloc_key.append(a_key)
        free_key.append(f_key)
        events.append((*a_key, b, 1))
        events.append((*f_key, b, -1))
    held: list[tuple[int, str, int]] = []  # (op, space, bytes) held while the op runs
    if graph.scratch and any(graph.scratch):  # a loop's iterations in flight
        held += [
            (i, "device", graph.scratch[i])
            for i in order
            if graph.scratch[i] and spaces[i] == "device"
        ]
    if realistic and graph.temporaries and any(graph.temporaries):  # kernels' own temporaries
        held += [
            (i, "device", graph.temporaries[i])
            for i in order
            if graph.temporaries[i] and spaces[i] == "device"
        ]
    if gpu:
        ws_limit = gpu_memory.get_stack(stack).workspace_limit_bytes
        workspaces = graph.derive(("workspaces", ws_limit), lambda g: _workspaces(g, ws_limit))
        convolutions = graph.derive(
            ("convolutions", ws_limit), lambda g: [i for i, w in enumerate(workspaces) if w]
        )  # scratch memory for the op's run: allocated at its start, freed at its end
        held += [
            (i, "workspace", workspaces[i]) for i in sorted(convolutions, key=position.__getitem__)
        ]
    for i, space, nbytes in held:
        b = len(b_space)
        b_space.append(space)
        b_bytes.append(nbytes)
        b_producer.append(i)
        b_tensors.append([])
        t_alloc = alloc[i]
        if realistic:
            a_key = (t_alloc, 1, position[i])
            f_key = (end[i], 0 if end[i] > t_alloc else 2, position[i])
        else:
            a_key = (_whole_us(t_alloc), 1, position[i])
            f_key = (_whole_us(end[i]) + 1e-9, 0, position[i])
        alloc_key.append(a_key)
        free_key.append(f_key)
        events.append((*a_key, b, 1))
        events.append((*f_key, b, -1))
    marker = len(b_space)  # sorts after the op's own allocations
    if realistic:  # a point per op
        events += [(alloc[i], 1, pos, marker, 0) for pos, i in enumerate(order)]
    else:
        events += [(_whole_us(alloc[i]), 1, pos, marker, 0) for pos, i in enumerate(order)]
    events.sort()

    sizes = graph.derive("variable sizes", variable_sizes) if realistic else []
    variables = sum(sizes)
    used = {"device": variables, "host": 0}
    terms: dict[str, int] = {}
    limit: int | None = None
    if gpu:
        ops, times, device, host, terms, limit = _replay_on_gpu(
            graph, events, order, b_space, b_bytes, stack, sizes
        )
    else:
        bfc = None
        if allocator == "bfc":  # a later step: the allocator's regions exist from the first one
            on_device = [
                (b, b_bytes[b], sign) for *_, b, sign in events if sign and b_space[b] == "device"
            ]
            bfc = BufferReplay.warmed(sizes, on_device)
        ops, times, device, host = [], [], [], []
        for t, phase, pos, b, sign in events:
            if sign:
                used[b_space[b]] += sign * b_bytes[b]
                if bfc is not None and b_space[b] == "device":
                    bfc.event(b, b_bytes[b], sign)
            elif phase == 1:
                ops.append(order[pos])
                times.append(t)
                device.append(bfc.in_use if bfc is not None else used["device"])
                host.append(used["host"])
    on_host = 0
    if realistic:  # the host holds its resident variables all step long (pinned: never paged)
        on_host = sum(graph.derive("host variable sizes", lambda g: variable_sizes(g, "host")))
        host = [h + on_host for h in host]
    dev_point = max(range(len(device)), key=device.__getitem__, default=0)
    host_point = max(range(len(host)), key=host.__getitem__, default=0)
    at_peak: list[tuple[int, str, int, int]] = []  # (-bytes, tensor, buffer, op): largest first
    if ops:
        t_peak = times[dev_point] if realistic else _whole_us(times[dev_point])
        peak_key = (t_peak, 1, position[ops[dev_point]])
        for b in range(len(b_space)):
            if b_space[b] == "device" and alloc_key[b] <= peak_key < free_key[b]:
                if b in crossing_names:
                    i, name = b_producer[b], crossing_names[b]
                elif not b_tensors[b]:  # a loop's scratch, a kernel's temporaries
                    i = b_producer[b]
                    held_for = "temporaries" if graph.types[i] in TEMPORARY_OPS else None
                    name = f"{graph.names[i]} ({held_for or 'iterations in flight'})"
                else:
                    i, k = b_tensors[b][0]
                    name = graph.outputs[i][k].name
                at_peak.append((-b_bytes[b], name, b, i))
    at_peak.sort()
    live = [
        LiveBuffer(name, graph.types[i], -neg, alloc_key[b][0], free_key[b][0])
        for neg, name, b, i in at_peak[:top]
    ]
    return MemoryTrace(
        ops=tuple(ops),
        times=tuple(times),
        device=tuple(device),
        host=tuple(host),
        device_peak=sum(terms.values()) if terms else device[dev_point] if device else variables,
        host_peak=host[host_point] if host else 0,
        device_peak_point=dev_point,
        host_peak_point=host_point,
        live_at_peak=tuple(live),
        variable_bytes=variables,
        terms=terms,
        allocator_limit=limit,
        host_variable_bytes=on_host,
    )


def _crossings(graph: CompiledGraph, end, position):
    """TensorFlow's copies of tensors that ops of the other memory space read directly.

    An op reading a tensor from the other space (no tflms copy in between:
    the host update reading a gradient, a device op reading a weight kept on
    the host that is not streamed) gets it through TensorFlow's own
    ``_Send``/``_Recv`` pair: one copy per tensor and space, made as soon as
    the tensor exists (a ``_Recv`` has no inputs to wait for) and freed after
    the last reader in that space.

    The tensor's own buffer is freed when the copy is made (its readers in
    its own space aside): the ``_Send`` is the reader the other space's ops
    wait for.

    Yields:
        ``(producer, tensor name, space of the copy, bytes, last reader)`` per copy.
    """
    spaces, copy = graph.spaces, graph.copy
    for (i, k), readers in graph.consumers.items():
        source = spaces[i]
        if source is None or k >= len(graph.outputs[i]):
            continue
        tensor = graph.outputs[i][k]
        if tensor.dtype == "resource" or tensor.bytes <= 0:
            continue
        last: dict[str, int] = {}
        for c in readers:
            space = spaces[c]
            if space is None or space == source or copy[c] is not None:
                continue
            if space not in last or (end[c], position[c]) > (
                end[last[space]],
                position[last[space]],
            ):
                last[space] = c
        for space, c in last.items():
            yield i, tensor.name, space, tensor.bytes, c


def _copies_on_write(graph: CompiledGraph, start, end, position):
    """The old buffers of variables written while a read of them is still held.

    A ``ReadVariableOp``'s output is the variable's own buffer. An update
    that finds that buffer shared
    (:func:`~tflms.cost.ops.updates_a_variable`) writes into a new one
    (``PrepareToUpdateVariable``: copy on write), and
    the old one lives on until the last reader of the read's value (through
    ``Identity``/``Reshape`` views) ends. Keras's weight decay is such an
    update: ``var.assign_sub(var * lr * wd)`` waits for nothing of the
    backward pass, so it runs as the step starts while the forward pass's
    reads are held for the backward pass: the step holds every decayed weight
    twice until its layer's gradient is made. Only reads made since the
    previous update of the variable share the buffer it has.

    Yields:
        ``(update op, variable's handle name, space, bytes, last reader)`` per copy.
    """
    types, consumers = graph.types, graph.consumers
    for (h, k), users in consumers.items():
        if k or types[h] not in _HANDLE_TYPES or graph.spaces[h] is None:
            continue
        updates = sorted(
            (u for u in users if updates_a_variable(types[u])),
            key=lambda u: (start[u], position[u]),
        )
        if not updates:
            continue
        reads = [r for r in users if types[r] == "ReadVariableOp"]
        since = (-1.0, -1)
        for u in updates:
            at = (start[u], position[u])
            last = max(
                (
                    _last_reader(graph, r, end, position)
                    for r in reads
                    if since < (start[r], position[r]) < at
                ),
                key=lambda c: (end[c], position[c]),
                default=None,
            )
            if last is not None and end[last] > start[u]:
                yield u, graph.names[h], graph.spaces[h], _variable_size(graph, h), last
            since = at


def _last_reader(graph: CompiledGraph, read: int, end, position) -> int:
    """The op that ends last among the readers of ``read``'s value, views included."""
    last, todo = read, [read]
    while todo:
        for c in graph.consumers.get((todo.pop(), 0), ()):
            if graph.types[c] in ALIAS_OPS:
                todo.append(c)
            if (end[c], position[c]) > (end[last], position[last]):
                last = c
    return last


def _workspaces(graph: CompiledGraph, limit: int) -> list[int]:
    """:func:`_workspace` of every op on the device (0 elsewhere)."""
    return [
        _workspace(graph, i, limit) if graph.spaces[i] == "device" else 0 for i in range(len(graph))
    ]


def _workspace(graph: CompiledGraph, i: int, limit: int) -> int:
    """cuDNN workspace of op ``i`` if it is a convolution (see :func:`gpu_memory.conv_workspace_bytes`)."""
    kind = gpu_memory.conv_kind(graph.types[i])
    if kind is None or not graph.outputs[i]:
        return 0
    by_index = {in_idx: graph.outputs[p][k] for p, k, in_idx in graph.inputs[i]}
    out = graph.outputs[i][0]
    if kind == "filter":
        filt, grad = out, by_index.get(2)
    else:
        filt, grad = by_index.get(1), (out if kind == "forward" else by_index.get(2))
    if filt is None or grad is None or not filt.shape or filt.shape[-1] is None:
        return 0
    channels = filt.shape[-1]
    elements = _elements(filt)
    grad_elements = _elements(grad)
    if not elements or not grad_elements or not channels:
        return 0
    dtype_bytes = max(1, grad.bytes // grad_elements)
    return gpu_memory.conv_workspace_bytes(
        graph.types[i], grad_elements // channels, elements // channels, dtype_bytes, limit
    )


def _elements(info) -> int:
    if info.shape is None or any(d is None for d in info.shape):
        return 0
    n = 1
    for d in info.shape:
        n *= d
    return n


def _replay_on_gpu(graph: CompiledGraph, events, order, b_space, b_bytes, stack, sizes):
    """Replay the step's device buffers through one BFC region, as a GPU without growth does.

    Variables (``sizes``: :func:`variable_sizes`) come first (they exist
    before the first step). Workspaces are taken only where a chunk ends
    under the allocator's limit, as cuDNN's autotuner only runs algorithms
    whose scratch could be allocated (:func:`~tflms.simulation.allocator.replay_region`).

    Returns:
        ``(ops, times, device, host, terms, limit)``: the timeline (device
        points include the process terms), the device peak by term, and the
        allocator's limit.
    """
    process = gpu_memory.process_terms(graph.device, stack)
    limit = gpu_memory.allocator_limit(graph.device, stack)
    constant = sum(process.values())
    extra = gpu_memory.get_stack(stack).tensor_factor - 1.0  # a calibrated stack's factor
    # every point (sign 0) is an op's marker, phase 1 (trace_memory)
    found = replay_region(b_space, b_bytes, events, sizes, limit=limit, extra=extra)
    points = [event for event in events if not event[4]]
    ops = [order[event[2]] for event in points]
    times = [event[0] for event in points]
    if extra:
        device = [
            constant + u + round(extra * t)
            for u, t in zip(found.in_use, found.tensors, strict=True)
        ]
    else:
        device = [constant + u for u in found.in_use]
    high, tensor_peak = found.high_water, found.tensor_peak
    charged = max(0, min(found.workspace_at_high, high - tensor_peak))
    terms = {**process, "tensors": tensor_peak}
    if extra:
        terms["calibration"] = round(extra * tensor_peak)
    terms["workspace"] = charged
    terms["allocator"] = high - tensor_peak - charged
    return ops, times, device, found.host, terms, limit
