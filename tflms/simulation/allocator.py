"""A replay model of TensorFlow's BFC allocator: what its counters say, not what tensors need.

The simulator's default peak is the sum of the live tensors' sizes - the least
any allocator needs. TensorFlow's best-fit-with-coalescing allocator (BFC; the
GPU allocator, and the CPU allocator behind
``tf.config.experimental.get_memory_info``) reports the sizes of the *chunks*
it handed out, which are larger:

* every request is rounded up to a multiple of 256 bytes;
* it picks the smallest free chunk that fits (lowest address on ties) and
  splits it only if the chunk is at least twice the request or the rest is
  at least 128 MiB - otherwise the whole chunk is in use, up to 2x the
  request;
* with ``allow_growth`` (the CPU, and GPUs with ``TF_FORCE_GPU_ALLOW_GROWTH``)
  memory comes in regions of 2 MiB, 4 MiB, 8 MiB...: each new region doubles
  the next one's size, and a request larger than the current region size
  doubles it until it fits; without growth one region spans the whole limit;
* freed chunks coalesce with free neighbours of their region (never across
  regions).

:class:`BFCModel` replays a sequence of allocations and frees with these
rules and keeps the counters TensorFlow keeps (bytes in use, peak, regions)
plus the high-water address of each region, which is what an allocator
without growth needs to never run out (fragmentation included).

Example:
    >>> bfc = BFCModel()
    >>> a = bfc.allocate(300_000)            # splits the first 2 MiB region
    >>> b = bfc.allocate(1_048_580)          # the 1.71 MiB rest is < 2x: taken whole
    >>> bfc.in_use, bfc.peak, bfc.region_bytes
    (2097152, 2097152, 2097152)
    >>> bfc.free(a); bfc.in_use
    1797120
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias

from tflms.cost.target import Accounting
from tflms.errors import ConfigError
from tflms.simulation import native

__all__ = [
    "ALLOCATORS",
    "Accounting",
    "Allocator",
    "BFCModel",
    "BufferReplay",
    "MIN_ALLOCATION",
    "MAX_INTERNAL_FRAGMENTATION",
    "RegionReplay",
    "check_allocator",
    "replay_region",
    "rounded",
]


MIN_ALLOCATION = 256
"""Every request is rounded up to a multiple of this (``kMinAllocationSize``)."""
MAX_INTERNAL_FRAGMENTATION = 128 << 20
"""A chunk whose unused rest would reach this is always split."""
_FIRST_REGION = 2 << 20  # the first region with allow_growth

Allocator: TypeAlias = Literal["exact", "bfc"]
"""An allocator model of :func:`tflms.simulate`: a key of :data:`ALLOCATORS`."""


ALLOCATORS: dict[Allocator, str] = {
    "exact": "the bytes of the live tensors: what any allocator needs at least",
    "bfc": "the chunks TensorFlow's BFC allocator hands out (with growth, as on the CPU)",
}
"""The allocator models of :func:`tflms.simulate` (its ``allocator`` argument)."""


def check_allocator(allocator: str, accounting: str = "tensors") -> None:
    """Refuse an unknown allocator model, or ``"bfc"`` with an accounting it does not apply to.

    Args:
        allocator: The allocator model: ``"exact"`` or ``"bfc"``.
        accounting: The memory accounting in use; ``"bfc"`` needs
            ``"tensors"`` (``"realistic"`` replays the GPU's allocator itself).

    Raises:
        ConfigError: what is wrong, and the values that are allowed.
    """
    if allocator not in ALLOCATORS:
        raise ConfigError(
            f"allocator must be one of {sorted(ALLOCATORS)}. Received allocator={allocator!r}."
        )
    if allocator == "bfc" and accounting == "grappler":
        raise ConfigError(
            "allocator='bfc' replays TensorFlow's allocator and needs accounting='tensors' "
            "(Grappler's conventions give variables no memory)."
        )
    if allocator == "bfc" and accounting == "realistic":
        raise ConfigError(
            "accounting='realistic' already replays the GPU's BFC allocator (one region, no "
            "growth); allocator='bfc' (with growth, as on the CPU) needs accounting='tensors'."
        )


def rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to the allocator's granularity (:data:`MIN_ALLOCATION`).

    Args:
        nbytes: Requested size in bytes.

    Returns:
        The smallest multiple of 256 bytes not below ``nbytes``.
    """
    return -(-nbytes // MIN_ALLOCATION) * MIN_ALLOCATION


@dataclass(slots=True)
class _Chunk:
    region: int
    offset: int
    size: int
    free: bool = True
    prev: _Chunk | None = None
    next: _Chunk | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.region, self.offset)


class BFCModel:
    """Replays allocations and frees with TensorFlow's BFC rules (see the module docstring).

    Args:
        limit_bytes: the memory limit (default: unlimited, so nothing fails
            and ``high_water`` says what would have been needed).
        allow_growth: grow in doubling regions (``True``, the CPU's setting) or
            take one region of ``limit_bytes`` up front (a GPU without growth;
            then ``limit_bytes`` is required).

    Attributes:
        in_use: bytes of the chunks handed out (TensorFlow's ``bytes_in_use``).
        peak: the largest ``in_use`` since construction or :meth:`reset_peak`.
        region_bytes: bytes of all regions taken from the system.
        high_water: the highest chunk end ever handed out, over regions laid
            end to end: with one region, the memory needed to never fail.
        failed: requests that could not be met within ``limit_bytes``.
    """

    def __init__(self, limit_bytes: int | None = None, *, allow_growth: bool = True):
        if not allow_growth and not limit_bytes:
            raise ConfigError("BFCModel(allow_growth=False) needs limit_bytes (its one region).")
        self.limit = limit_bytes if limit_bytes else 1 << 62
        self.in_use = self.peak = self.region_bytes = self.high_water = self.failed = 0
        self._region_sizes: list[int] = []
        self._region_starts: list[int] = []
        self._free: list[tuple[int, int, int]] = []  # sorted (size, region, offset)
        self._chunks: dict[tuple[int, int, int], _Chunk] = {}
        self._handed: dict[int, _Chunk] = {}
        self._next_handle = 0
        self._growth = allow_growth
        self._next_region = min(_FIRST_REGION, rounded(self.limit)) if allow_growth else 0
        if not allow_growth:
            self._add_region(rounded(self.limit) // MIN_ALLOCATION * MIN_ALLOCATION)

    def allocate(self, nbytes: int, *, below: int | None = None) -> int | None:
        """Hand out a chunk for ``nbytes``; returns its handle (``None`` for 0 bytes or a failure).

        Args:
            nbytes: Requested size in bytes; rounded up to 256-byte granularity.
            below: only hand out a chunk that ends at or below this address
                (regions laid end to end), else fail softly without counting
                in ``failed``: a request that may fall back, as cuDNN's
                workspace does when its scratch allocation fails.

        Returns:
            An integer handle for :meth:`free`, or None when ``nbytes`` is 0 or
            no chunk fits even after growing (counted in ``failed``).
        """
        if nbytes <= 0:
            return None
        size = rounded(nbytes)
        chunk = self._best_fit(size)
        if chunk is None and self._extend(size):
            chunk = self._best_fit(size)
        if chunk is not None and below is not None:
            if self._region_starts[chunk.region] + chunk.offset + size > below:
                return None
        if chunk is None:
            self.failed += 1
            return None
        self._take(chunk)
        if chunk.size >= 2 * size or chunk.size - size >= MAX_INTERNAL_FRAGMENTATION:
            self._split(chunk, size)
        self.in_use += chunk.size
        self.peak = max(self.peak, self.in_use)
        end = self._region_starts[chunk.region] + chunk.offset + chunk.size
        self.high_water = max(self.high_water, end)
        handle = self._next_handle
        self._next_handle += 1
        self._handed[handle] = chunk
        return handle

    def free(self, handle: int | None) -> None:
        """Return a chunk; it coalesces with free neighbours in its region.

        Args:
            handle: A handle :meth:`allocate` returned; None is ignored.
        """
        if handle is None:
            return
        chunk = self._handed.pop(handle)
        self.in_use -= chunk.size
        prev, after = chunk.prev, chunk.next
        if after is not None and after.free:
            self._take(after)
            self._merge(chunk, after)
        if prev is not None and prev.free:
            self._take(prev)
            self._merge(prev, chunk)
            chunk = prev
        self._put(chunk)

    def reset_peak(self) -> None:
        """Start a new peak at the bytes in use now (``reset_memory_stats``)."""
        self.peak = self.in_use

    # -- internals -------------------------------------------------------------

    def _best_fit(self, size: int) -> _Chunk | None:
        i = bisect.bisect_left(self._free, (size, -1, -1))
        return self._chunks[self._free[i]] if i < len(self._free) else None

    def _extend(self, size: int) -> bool:
        if not self._growth:
            return False
        available = (self.limit - self.region_bytes) // MIN_ALLOCATION * MIN_ALLOCATION
        if size > available:
            return False
        grew = False
        while size > self._next_region:
            self._next_region *= 2
            grew = True
        self._add_region(min(self._next_region, available))
        if not grew:
            self._next_region *= 2
        return True

    def _add_region(self, size: int) -> None:
        region = len(self._region_sizes)
        self._region_starts.append(self.region_bytes)
        self._region_sizes.append(size)
        self.region_bytes += size
        self._put(_Chunk(region, 0, size))

    def _put(self, chunk: _Chunk) -> None:
        chunk.free = True
        self._chunks[chunk.key] = chunk
        bisect.insort(self._free, chunk.key)

    def _take(self, chunk: _Chunk) -> None:
        key = chunk.key
        del self._free[bisect.bisect_left(self._free, key)]
        del self._chunks[key]
        chunk.free = False

    def _split(self, chunk: _Chunk, size: int) -> None:
        rest = _Chunk(chunk.region, chunk.offset + size, chunk.size - size, True, chunk, chunk.next)
        if chunk.next is not None:
            chunk.next.prev = rest
        chunk.next, chunk.size = rest, size
        self._put(rest)

    @staticmethod
    def _merge(left: _Chunk, right: _Chunk) -> None:
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left


class BufferReplay:
    """Drives a :class:`BFCModel` with buffer events: ``event(buffer, nbytes, +1 or -1)``.

    Args:
        model: the allocator model (a fresh growing one by default).
    """

    def __init__(self, model: BFCModel | None = None):
        self.model = model if model is not None else BFCModel()
        self._handles: dict = {}

    @classmethod
    def warmed(cls, resident: list[int], events) -> BufferReplay:
        """A replay holding ``resident`` buffers (variables) after one pass of ``events``.

        Its regions are then those a running job has when a later step starts,
        which is what a measured step sees; the peak restarts there.

        Args:
            resident: sizes allocated first and never freed.
            events: ``(buffer, nbytes, sign)`` of one step, in order.

        Returns:
            The replay, with its peak counters reset and the resident buffers
            still allocated.
        """
        replay = cls()
        for size in resident:
            replay.model.allocate(size)
        for buffer, nbytes, sign in events:
            replay.event(buffer, nbytes, sign)
        replay.model.reset_peak()
        return replay

    def event(self, buffer, nbytes: int, sign: int) -> None:
        """Allocate (``sign > 0``) or free (``sign < 0``) ``buffer``.

        Args:
            buffer: Any hashable key naming the buffer (the same key frees it).
            nbytes: Size in bytes; only read when allocating.
            sign: ``+1`` to allocate, ``-1`` to free.
        """
        if sign > 0:
            self._handles[buffer] = self.model.allocate(nbytes)
        else:
            self.model.free(self._handles.pop(buffer))

    @property
    def in_use(self) -> int:
        """Bytes of the chunks handed out now."""
        return self.model.in_use


SPACE_CODES = {"device": 0, "host": 1}
"""The buffer spaces :func:`replay_region` knows; any other space is a workspace (code 2)."""


class RegionReplay(NamedTuple):
    """What :func:`replay_region` reports.

    Attributes:
        in_use: at each timeline point, bytes of the chunks handed out.
        tensors: at each point, bytes of the live device tensors (resident ones included).
        host: at each point, bytes of the live host buffers.
        tensor_peak: the largest ``tensors`` over the step (at any event).
        high_water: the highest chunk end handed out: what the region must hold.
        workspace_at_high: workspace bytes held when ``high_water`` was reached.
    """

    in_use: list[int]
    tensors: list[int]
    host: list[int]
    tensor_peak: int
    high_water: int
    workspace_at_high: int


def replay_region(
    spaces: list[str],
    sizes: list[int],
    events: list[tuple],
    resident: list[int],
    *,
    limit: int,
    extra: float = 0.0,
    compiled: bool | None = None,
) -> RegionReplay:
    """One step's buffers through one BFC region without growth, as a GPU process allocates.

    ``resident`` sizes are allocated first and never freed (variables). Then
    each event, a tuple ending in ``(buffer, sign)``, allocates (``+1``) or
    frees (``-1``) a buffer, or marks a timeline point (``0``; the buffer is
    not read):
    device buffers take chunks of the region, host buffers are only counted,
    and workspaces (any other space) take a chunk only where it ends under
    ``limit - round(extra * tensor bytes live)``, as cuDNN runs only the
    algorithms whose scratch it could allocate.

    Args:
        spaces: the space of each buffer: ``"device"``, ``"host"``, or a workspace.
        sizes: bytes of each buffer.
        events: tuples ending in ``(buffer, sign)``, in the order they happen.
        resident: sizes allocated before the first event.
        limit: the allocator's limit (bytes) a workspace must end under.
        extra: a calibrated stack's tensor factor minus 1 (0: none).
        compiled: the compiled kernel (True), the Python model (False), or the
            kernel when it was built (None; :mod:`tflms.simulation.native`).

    Returns:
        The :class:`RegionReplay`; the same, to the byte, from either implementation.

    Raises:
        ConfigError: ``compiled=True`` where the kernels were not built.
    """
    region = 1 << 50  # larger than any step: its high-water mark is what is needed
    if not native.use_compiled(compiled):
        return _replay_region_py(spaces, sizes, events, resident, region, limit, extra)
    assert native.kernels is not None
    codes = bytes(SPACE_CODES.get(space, 2) for space in spaces)
    found = native.kernels.replay_region(
        codes,
        array("q", sizes),
        events if isinstance(events, list) else list(events),
        array("q", resident),
        region,
        limit,
        float(extra),
    )
    return RegionReplay(*found)


def _replay_region_py(spaces, sizes, events, resident, region, limit, extra) -> RegionReplay:
    """:func:`replay_region` with :class:`BFCModel`: the reference the C extension is held to."""
    bfc = BFCModel(region, allow_growth=False)
    tensors = 0
    for size in resident:
        bfc.allocate(size)
        tensors += size
    tensor_peak = tensors
    handles: dict[int, int | None] = {}
    workspace = workspace_at_high = host_used = 0
    high = bfc.high_water
    in_use, tensors_at, host_at = [], [], []
    allocate, free = bfc.allocate, bfc.free
    for *_, b, sign in events:
        if not sign:
            in_use.append(bfc.in_use)
            tensors_at.append(tensors)
            host_at.append(host_used)
            continue
        space, nbytes = spaces[b], sizes[b]
        if space == "device":
            if sign > 0:
                handles[b] = allocate(nbytes)
                tensors += nbytes
                tensor_peak = max(tensor_peak, tensors)
            else:
                free(handles.pop(b, None))
                tensors -= nbytes
        elif space == "host":
            host_used += sign * nbytes
        elif sign > 0:  # a workspace
            handle = allocate(nbytes, below=limit - round(extra * tensors))
            if handle is not None:
                handles[b] = handle
                workspace += nbytes
        elif b in handles:
            free(handles.pop(b))
            workspace -= nbytes
        if bfc.high_water > high:
            high, workspace_at_high = bfc.high_water, workspace
    return RegionReplay(in_use, tensors_at, host_at, tensor_peak, high, workspace_at_high)
