"""Pinned checksum values (the CPU's, which CUDA must equal)."""

from __future__ import annotations

PINNED_ARANGE = [4611675846271592703, 1649912918534604642, 820263118548085078, 4313451649473233529]
PINNED_EMPTY = [0, 0, 0, 0]
