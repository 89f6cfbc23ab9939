"""Clusters left on the machine: list them, and remove the ones whose owner died.

A cluster counts as ours if it has a state file (written by
:class:`~ddl_tf.cluster.cluster.Cluster` under ``STATE_DIR``) or a default
prefix (``ddlc`` + 6 hex digits); other namespaces are never listed or
removed. ``python -m ddl_tf.cluster list`` and ``... cleanup`` use this.
"""

from __future__ import annotations

import json
import os
import re

from ddl_tf.cluster import netns
from ddl_tf.cluster.errors import ClusterError
from ddl_tf.cluster.spec import STATE_DIR

__all__ = ["list_clusters", "cleanup"]

_DEFAULT_PREFIX = re.compile(r"^ddlc[0-9a-f]{6}$")


def list_clusters() -> list[dict]:
    """Clusters of this module on the machine: prefix, namespaces, owner pid, whether it lives.

    A cluster counts as ours if it has a state file or a default prefix
    (``ddlc`` + 6 hex digits); other namespaces are never listed or removed.

    Returns:
        One dict per cluster (``prefix``, ``namespaces``, ``owner_pid``,
        ``owner_alive``), sorted by prefix.
    """
    tools = netns.find_tools()
    by_prefix: dict[str, dict] = {}
    for name in netns.list_namespaces(tools):
        prefix = name.rsplit("-", 1)[0]
        if not (_DEFAULT_PREFIX.match(prefix) or (STATE_DIR / f"{prefix}.json").exists()):
            continue  # someone else's namespace that happens to look like ours
        by_prefix.setdefault(prefix, {"prefix": prefix, "namespaces": []})["namespaces"].append(
            name
        )
    for path in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        entry = by_prefix.setdefault(path.stem, {"prefix": path.stem, "namespaces": []})
        entry["owner_pid"] = state.get("owner_pid")
    for entry in by_prefix.values():
        pid = entry.setdefault("owner_pid", None)
        entry["owner_alive"] = pid is not None and _alive(pid)
    return sorted(by_prefix.values(), key=lambda e: e["prefix"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(prefix: str | None = None, *, stale: bool = False) -> list[str]:
    """Remove leftover clusters: the one named ``prefix``, or (``stale``) every cluster whose owner died.

    Args:
        prefix: The cluster's namespace prefix (``ddlc`` + 6 hex digits by default).
        stale: Remove every cluster whose owning process is gone.

    Returns:
        The namespaces removed.

    Raises:
        ClusterError: Neither ``prefix`` nor ``stale`` given, or removal failed.
    """
    if prefix is None and not stale:
        raise ClusterError(
            "cleanup needs a prefix or stale=True, e.g. "
            "`python -m ddl_tf.cluster cleanup --prefix ddlc1a2b3c` or `... cleanup --stale`."
        )
    tools = netns.find_tools()
    if prefix is not None:
        return netns.remove_prefix(tools, prefix)
    removed = []
    for entry in list_clusters():
        if not entry["owner_alive"]:
            removed += netns.remove_prefix(tools, entry["prefix"])
    return removed
