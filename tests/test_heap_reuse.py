"""reused_freed_memory: within it a large block freed and asked for again costs (almost) no new page
faults; before it, a block above glibc's mmap threshold is fresh memory each time, and after it too
above 32 MiB, while a smaller one still comes from the heap. Each case runs in a fresh interpreter: in a
process that has planned before (the suite's workers), freed heap may serve a large block whatever the
thresholds say."""

import json
import subprocess
import sys

import pytest

from reshardctl.heap_reuse import _libc, reused_freed_memory

SCENARIO = r"""
import json, resource, sys
import numpy as np
from reshardctl.heap_reuse import reused_freed_memory

MB = 1 << 20


def faults(size):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(size, dtype=np.uint8)  # every page touched
    del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0


out = {}
faults(96 * MB)
out["before"] = faults(96 * MB)  # fresh memory each time: glibc maps and unmaps the block
with reused_freed_memory() as on:
    out["on"] = on
    faults(96 * MB)  # the heap grows once
    out["within"] = faults(96 * MB)
out["after"] = faults(96 * MB)  # set back: a block above 32 MiB is mapped afresh again
faults(16 * MB)
out["small_after"] = faults(16 * MB)  # below 32 MiB: from the heap (a fixed 128 KiB would map it afresh)
print(json.dumps(out))
"""


def _scenario() -> dict:
    proc = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.mark.skipif(_libc() is None, reason="not glibc: reused_freed_memory is a no-op")
def test_a_freed_block_is_reused_within_and_set_back_after():
    got = _scenario()
    before, within, after, small = got["before"], got["within"], got["after"], got["small_after"]
    assert got["on"]
    # a fresh 96 MB block faults once per page touched: 48 huge pages (numpy asks for them, the kernel gives
    # them where it has them) up to 24k small ones
    assert before >= 40 and after >= 40, got
    assert within * 10 < before and within * 10 < after, got
    assert small * 10 < after, got  # set back where glibc's adjustment ends (32 MiB), not to 128 KiB


def test_without_glibc_it_says_so_and_changes_nothing(monkeypatch):
    import reshardctl.heap_reuse as hr

    monkeypatch.setattr(hr.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert hr._libc() is None
    with reused_freed_memory() as on:
        assert on is False
