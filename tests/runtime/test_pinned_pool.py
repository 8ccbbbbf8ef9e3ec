"""The bounded staging pool (runtime/pinned_pool.py) on the CPU: the chunk loop (always_stage) is exact
for odd sizes and every dtype, never holds more than its capacity, and reuses one buffer; without
staging it is a plain copy. The CUDA path (pinned, non_blocking, events) runs in `reshardctl selftest --gpu`."""

from __future__ import annotations

import pytest
import torch

from reshardctl.runtime.pinned_pool import ALIGN, DEFAULT_BYTES, PinnedStagingPool, default_capacity, shared_pool


def _rand_bytes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("nbytes", [0, 1, 7, ALIGN - 1, ALIGN, ALIGN + 1, 2 * 4096 - 3, 3 * 4096 + 5, 10 * 4096 + 4095])
def test_chunked_copy_is_exact_for_odd_sizes(nbytes):
    pool = PinnedStagingPool(8192)  # two slots of 4096 bytes
    src = _rand_bytes(nbytes, nbytes)
    dst = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
    pool.copy_(dst, src, always_stage=True)
    assert torch.equal(dst, src)
    assert pool.stats.chunks == -(-nbytes // 4096) and pool.stats.bytes == nbytes
    assert pool.allocated_bytes == (0 if nbytes == 0 else 8192) <= pool.capacity


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.bool,
                                   torch.float8_e4m3fn, torch.int64])
def test_every_dtype_and_shape_byte_exact(dtype):
    pool = PinnedStagingPool(3 * ALIGN, slots=3)  # one-ALIGN slots: many chunks, element boundaries cut
    raw = _rand_bytes(torch.empty((), dtype=dtype).element_size() * 37 * 11, 3)
    src = raw.view(dtype).view(37, 11) if dtype != torch.bool else (raw & 1).view(torch.bool).view(37, 11)
    dst = torch.empty_like(src)
    pool.copy_(dst, src, always_stage=True)
    assert torch.equal(dst.view(torch.uint8), src.view(torch.uint8))
    scalar = src[3, 4].clone()  # 0-d
    out = torch.empty_like(scalar)
    pool.copy_(out, scalar, always_stage=True)
    assert torch.equal(out.reshape(1).view(torch.uint8), scalar.reshape(1).view(torch.uint8))


def test_the_bound_holds_over_many_copies_and_the_buffer_is_reused():
    pool = PinnedStagingPool(1 << 16)
    buf_ptrs = set()
    total = 0
    for k in range(12):
        n = (k + 1) * 37_123  # up to ~7 x the capacity
        src = _rand_bytes(n, k)
        dst = torch.empty(n, dtype=torch.uint8)
        pool.copy_(dst, src, always_stage=True)
        assert torch.equal(dst, src)
        assert pool.allocated_bytes <= pool.capacity
        buf_ptrs.add(pool._buf.data_ptr())
        total += n
    assert len(buf_ptrs) == 1 and pool.stats.bytes == total and pool.stats.copies == 12


def test_non_contiguous_source_and_size_mismatch():
    pool = PinnedStagingPool(4096)
    big = _rand_bytes(40 * 64, 9).view(torch.float32).view(40, 16)
    src = big[:, 3:9]  # a column slice: copied contiguous first
    dst = torch.empty(40, 6, dtype=torch.float32)
    pool.copy_(dst, src, always_stage=True)
    assert torch.equal(dst.view(torch.uint8), src.contiguous().view(torch.uint8))
    with pytest.raises(ValueError, match="into"):
        pool.copy_(torch.empty(5, dtype=torch.float32), torch.empty(6, dtype=torch.float32), always_stage=True)
    with pytest.raises(ValueError, match="contiguous"):
        pool.copy_(torch.empty(40, 16)[:, :6], src, always_stage=True)


def test_cpu_degrades_to_a_plain_copy():
    pool = PinnedStagingPool(4096)
    src = _rand_bytes(10_000, 1)
    out = pool.to_device(src, "cpu")
    assert torch.equal(out, src) and pool.allocated_bytes == 0 and pool.stats.chunks == 0
    dst = torch.empty_like(src)
    pool.copy_(dst, src)  # CPU -> CPU without always_stage: plain
    assert torch.equal(dst, src) and pool.allocated_bytes == 0


def test_capacity_configuration():
    assert default_capacity({}) == DEFAULT_BYTES == 256 << 20
    assert default_capacity({"RESHARDCTL_PINNED_POOL_MB": "64"}) == 64 << 20
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ValueError, match="RESHARDCTL_PINNED_POOL_MB"):
            default_capacity({"RESHARDCTL_PINNED_POOL_MB": bad})
    with pytest.raises(ValueError, match="below"):
        PinnedStagingPool(ALIGN)  # two slots need 2 x ALIGN
    pool = PinnedStagingPool(10 * ALIGN + 100)
    assert pool.chunk == 5 * ALIGN and pool.chunk * pool.slots <= pool.capacity
    assert shared_pool() is shared_pool() and shared_pool().capacity == default_capacity()
    pool.copy_(torch.empty(3, dtype=torch.uint8), torch.ones(3, dtype=torch.uint8), always_stage=True)
    pool.close()
    assert pool.allocated_bytes == 0
