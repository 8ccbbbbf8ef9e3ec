"""Torch dtypes by name, and Python ints wrapped to signed 64 bits (as torch int64 arithmetic wraps)."""

from __future__ import annotations

import torch

from reshardctl.errors import ModelError

MASK64 = (1 << 64) - 1


def signed64(x: int) -> int:
    """``x`` modulo 2**64 as a signed 64-bit integer."""
    x &= MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ModelError(f"dtype {name!r} is not a torch dtype")
    return dt
