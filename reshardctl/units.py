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


def _unit(values: Iterable[float | int | None], table: tuple) -> tuple:
    """The largest ``(name, scale)`` of ``table`` whose value of the series' largest element is at least 1
    (the smallest unit for an empty or all-zero series)."""
    top = _largest(values)
    return max((u for u in table if top >= u[1]), key=lambda u: u[1], default=table[0])


def time_unit(values: Iterable[float | None]) -> tuple[str, float]:
    """``(name, seconds per unit)`` for a series of seconds (``ms`` for 0.0042 .. 0.9, ``s`` from 1.0)."""
    return _unit(values, TIME_UNITS)


def byte_unit(values: Iterable[int | float | None]) -> tuple[str, int]:
    """``(name, bytes per unit)`` for a series of byte counts (``MiB`` for 1 MiB .. 1 GiB)."""
    return _unit(values, BYTE_UNITS)


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
