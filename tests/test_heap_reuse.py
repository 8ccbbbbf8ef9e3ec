"""reused_freed_memory: within it a large block freed and asked for again costs (almost) no new page
faults; before and after it, a block above glibc's mmap threshold (32 MiB at most) is fresh memory each
time."""

import resource

import numpy as np
import pytest

from reshardctl.heap_reuse import _libc, reused_freed_memory

MB = 1 << 20


def _faults_of_one_block(size: int = 96 * MB) -> int:
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(size, dtype=np.uint8)  # every page touched
    del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0


@pytest.mark.skipif(_libc() is None, reason="not glibc: reused_freed_memory is a no-op")
def test_a_freed_block_is_reused_within_and_not_outside():
    _faults_of_one_block()
    before = _faults_of_one_block()  # fresh memory each time: glibc maps and unmaps the block
    with reused_freed_memory() as on:
        assert on
        _faults_of_one_block()  # the heap grows once
        within = _faults_of_one_block()
    after = _faults_of_one_block()
    # a fresh block faults once per page touched: 48 huge pages (numpy asks for them on large arrays, the
    # kernel gives them where it has them) up to 24k small ones
    assert before >= 40 and after >= 40, (before, after)
    assert within * 10 < before, (before, within)
    assert within * 10 < after, (after, within)  # set back: the next block is mapped afresh again


def test_without_glibc_it_says_so_and_changes_nothing(monkeypatch):
    import reshardctl.heap_reuse as hr

    monkeypatch.setattr(hr.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert hr._libc() is None
    with reused_freed_memory() as on:
        assert on is False
