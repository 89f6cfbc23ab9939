"""Byte counts: parse ``"16GiB"``-style strings and format sizes for people.

Example:
    >>> parse_bytes("16GiB"), parse_bytes("1.5 MB"), parse_bytes(4096)
    (17179869184, 1500000, 4096)
    >>> format_bytes(3 * 2**30 + 2**29)
    '3.50 GiB'
"""

from __future__ import annotations

import numbers
import re

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Return ``value`` as a whole number of bytes.

    Args:
        value: an int, or a string such as ``"16GiB"``, ``"512 MiB"``, ``"2e9"``
            is not accepted; decimal (kB, MB, GB) and binary (KiB, MiB, GiB)
            units are.

    Returns:
        The number of bytes (a whole number; fractional results are truncated).

    Raises:
        ValueError: the value is negative or not a byte count.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a byte count, got {value!r}")
    if isinstance(value, numbers.Real):
        if value < 0:
            raise ValueError(f"byte counts cannot be negative, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a byte count, got {value!r}")
    match = _PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a byte count; write e.g. '16GiB', '512MiB', '64KiB' or 1048576"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: int | float) -> str:
    """Human-readable binary size, e.g. ``'3.50 GiB'``.

    Args:
        n: A number of bytes.

    Returns:
        Whole bytes below 1 KiB (``'512 B'``), else two decimals in the
        largest binary unit up to TiB.
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
