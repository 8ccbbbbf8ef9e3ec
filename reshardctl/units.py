"""Human units for times and byte counts: one choice of unit for a whole table column or plot axis.

* Times: ``us`` below 1 ms, ``ms`` below 1 s, ``s`` from there (``time_unit`` picks one unit from the
  largest value of a series, so an axis or column never mixes ``ms`` and ``s``).
* Bytes: binary units (``KiB``, ``MiB``, ``GiB``, ``TiB``), picked the same way (``byte_unit``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

TIME_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0))
BYTE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))


def _largest(values: Iterable[float | int | None]) -> float:
    finite = [abs(float(v)) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v)]
    return max(finite, default=0.0)


def time_unit(values: Iterable[float | None]) -> tuple[str, float]:
    """``(name, seconds per unit)`` for a series of seconds: the largest unit whose value of the series'
    largest element is at least 1 (``ms`` for 0.0042 .. 0.9, ``s`` from 1.0)."""
    top = _largest(values)
    name, scale = TIME_UNITS[0]
    for n, s in TIME_UNITS:
        if top >= s:
            name, scale = n, s
    return name, scale


def byte_unit(values: Iterable[int | float | None]) -> tuple[str, int]:
    """``(name, bytes per unit)`` for a series of byte counts, as ``time_unit`` (``MiB`` for 1 MiB .. 1 GiB)."""
    top = _largest(values)
    name, scale = BYTE_UNITS[0]
    for n, s in BYTE_UNITS:
        if top >= s:
            name, scale = n, s
    return name, scale


def seconds(x: float | None) -> str:
    """``812 us``, ``4.21 ms``, ``1.234 s``; ``-`` for a missing or non-finite value."""
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "-"
    name, scale = time_unit([x])
    v = x / scale
    return f"{v:.0f} {name}" if name == "us" else f"{v:.2f} {name}" if name == "ms" else f"{v:.3f} {name}"


def size(n: int | float | None) -> str:
    """``512 B``, ``175.0 KiB``, ``3.42 GiB``; ``-`` for a missing value."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n):
        return "-"
    name, scale = byte_unit([n])
    return f"{int(n)} B" if name == "B" else f"{n / scale:.1f} {name}" if n / scale < 100 else f"{n / scale:.0f} {name}"
