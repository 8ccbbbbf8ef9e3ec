"""The staging pool's release events (buffer_pool.py, the stream-ordered NCCL path): a block handed
back with the event of its last use is waited for by the host, on that event only, before the pool
lets go of its memory (torch's allocator may hand it out on another stream at once). Reuse waits on the
device (``Stream.wait_event``), which needs CUDA: tests/runtime/test_gpu.py."""

from __future__ import annotations

import torch

from reshardctl.runtime.buffer_pool import BufferPool


class FakeEvent:
    """A release event (``torch.cuda.Event`` on a GPU): counts the host's waits on it."""

    def __init__(self):
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1


def test_a_block_let_go_over_the_limit_is_waited_for_on_its_own_event_first():
    pool = BufferPool(torch.device("cpu"), limit_bytes=(1 << 15) + (1 << 14))
    a, b = pool.acquire(1 << 14), pool.acquire(1 << 14)
    ea, eb = FakeEvent(), FakeEvent()
    pool.release(a, ea)
    pool.release(b, eb)
    pool.acquire(1 << 15)  # over the limit: the largest free block (either) is let go
    assert ea.waits + eb.waits == 1
    pool.clear()
    assert ea.waits == 1 and eb.waits == 1  # each block's own event, once


def test_a_block_released_without_an_event_cpu_is_never_waited_for():
    pool = BufferPool(torch.device("cpu"), limit_bytes=1 << 16)
    a = pool.acquire(100)
    pool.release(a)
    assert pool.acquire(100) is a
    pool.release(a)
    pool.clear()
    assert pool.reserved == 0
