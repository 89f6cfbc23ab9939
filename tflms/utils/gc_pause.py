"""Pause Python's cyclic garbage collector around bulk graph work.

Building tens of thousands of node and edge dicts (the analysis view) or
creating thousands of TensorFlow ops (the rewrite) allocates so many objects
that the collector runs full collections again and again, each scanning
everything built so far: quadratic in effect, and it showed as a 0.4 s
stall creating 1,490 swap ops in an 18k-op graph. The objects built meanwhile
hold no reference cycles that need collecting before the work ends.

Work that keeps one large structure and makes many short-lived ones (the
auto-tuner: one view, dozens of rewritten copies) is slowed the same way
when the collector rescans the large one; :func:`gc_frozen` keeps the
collector on what is made inside the block.

Example:
    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    >>> with gc_frozen():
    ...     gc.get_freeze_count() > 0
    True
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["gc_paused", "gc_frozen"]


@contextlib.contextmanager
def gc_paused():
    """Disable the cyclic collector inside the block; restore its state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def gc_frozen():
    """Leave the objects that exist on entry out of collections inside the block.

    They are moved to the collector's permanent generation (``gc.freeze``)
    and back to the oldest one on exit (``gc.unfreeze``); what the block
    makes is collected as usual, garbage cycles included.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
