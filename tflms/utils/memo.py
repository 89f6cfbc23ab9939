"""Answers computed once per analysis view.

The planner asks the same whole-view questions (which ops depend on the
batch, which ones Grappler folds to constants, where the backward pass
starts) several times per plan, and the auto-tuner plans one view dozens of
times. :func:`per_view` keeps a function's answer for each view, weakly (a
view that is dropped takes its answer with it), and computes it again when
the view's node or edge count has changed since (a view the rewrite grew).

Example:
    >>> import networkx as nx
    >>> calls = []
    >>> @per_view
    ... def size(view):
    ...     calls.append(1)
    ...     return view.number_of_nodes()
    >>> v = nx.DiGraph([("a", "b")])
    >>> size(v), size(v), len(calls)
    (2, 2, 1)
    >>> v.add_edge("b", "c")
    >>> size(v), len(calls)
    (3, 2)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TypeVar

import networkx as nx

__all__ = ["per_view"]

T = TypeVar("T")


def per_view(fn: Callable[[nx.DiGraph], T]) -> Callable[[nx.DiGraph], T]:
    """``fn(view)``, computed once per view and size (see the module doc)."""
    answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def cached(view: nx.DiGraph) -> T:
        # len(edges): number_of_edges() sums degrees on every call
        size = (view.number_of_nodes(), len(view.edges))
        kept = answers.get(view)
        if kept is None or kept[0] != size:
            kept = answers[view] = (size, fn(view))
        return kept[1]

    return cached
