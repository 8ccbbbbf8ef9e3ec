"""Freed memory kept for reuse while planning makes and drops large numpy temporaries.

glibc's malloc serves a block of 128 KiB or more (its mmap threshold) with a mapping of its own and
unmaps it on free: the next such block is fresh memory, and each page of it costs a page fault when
first touched. The planner's vectorised passes (routing, rounds, traffic: arrays of 10^5-10^6 rows, made
and dropped in turn) touched fresh memory that way all the time: the reshard plan and traffic of
DeepSeek-V3 at 256 + 256 took 67k minor faults and 0.26 s of system time in its 0.76 s (docs/benchmarks.md).
``reused_freed_memory`` raises the mmap threshold and the trim threshold for the pass, so those blocks
come from the heap and a freed one serves the next. glibc cannot be put back to its own adjusting
thresholds once they are set, so after the pass they are set where that adjustment ends (mmap 32 MiB,
trim 64 MiB: the state glibc reaches by itself after a large block has been freed; a fixed 128 KiB would
map every block afresh, slower than before the pass), and ``malloc_trim`` hands what is free back to the
system. A no-op where the C library is not glibc. Forked workers (``fork_map``) inherit the setting.
"""

from __future__ import annotations

import platform
from contextlib import contextmanager
from typing import Iterator

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
AFTER_MMAP = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where its own adjustment stops
AFTER_TRIM = 2 * AFTER_MMAP  # glibc keeps the trim threshold at twice the adjusted mmap threshold
DURING = 1 << 30  # blocks up to 1 GiB from the heap; free memory at its top kept up to 1 GiB


def _libc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextmanager
def reused_freed_memory() -> Iterator[bool]:
    """Within: large blocks from the heap, freed ones reused (yields whether that is in effect)."""
    libc = _libc()
    on = bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, DURING) and libc.mallopt(M_TRIM_THRESHOLD, DURING))
    try:
        yield on
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP)
            libc.mallopt(M_TRIM_THRESHOLD, AFTER_TRIM)
            libc.malloc_trim(0)
