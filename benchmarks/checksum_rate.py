"""Checksum rate on the CPU, single-threaded: the previous implementation (``reference``: the int64
index-gather code as it was before the float64-matmul rewrite, copied below; the helpers it imports,
``_table``, ``_mix``, ``_row_length``, ``_combine`` and ``_encode``, are unchanged) vs the current
``segment_checksums``, side by side in one process (the machine is shared: compare only within a run).
Each case also checks that the two give the same values.

    .venv/bin/python benchmarks/checksum_rate.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from reshardctl.runtime.checksum import (GRAIN, MOMENTS, P, RANDOM, _combine, _encode, _mix, _row_length,
                                         _table, segment_checksums)


# ---- reference: the previous implementation ---------------------------------------------------------------
def _limb_view(buf: torch.Tensor) -> torch.Tensor:
    n = buf.numel()
    if n % 2 or n == 0 or buf.data_ptr() % 2 or not buf.is_contiguous():
        padded = torch.zeros(max(2, n + n % 2), dtype=torch.uint8, device=buf.device)
        padded[:n] = buf
        buf = padded
    return buf.view(torch.int16)


def _row_sums(x16, first, k, odd, rin, R, tab):
    dev = x16.device
    rows = rin.numel()
    out = torch.empty(rows, MOMENTS + RANDOM, dtype=torch.int64, device=dev)
    ar = torch.arange(R, dtype=torch.int64, device=dev)[None, :]
    nb = R // GRAIN
    step = max(1, (1 << 19) // R)
    for r0 in range(0, rows, step):
        sl = slice(r0, min(rows, r0 + step))
        t = rin[sl, None] * R + ar
        kk = k[sl, None]
        valid = t < kk
        x = x16[torch.where(valid, first[sl, None] + t, 0)].to(torch.int64) & 0xFFFF
        x = torch.where(valid, x, 0)
        x = torch.where((t == kk - 1) & odd[sl, None], x & 0xFF, x)
        for c in range(MOMENTS):
            out[sl, c] = (x * tab[:R, c]).sum(1) % P
        xg = x.view(-1, nb, GRAIN)
        blk = rin[sl, None] * nb + torch.arange(nb, dtype=torch.int64, device=dev)[None, :]
        for j in range(RANDOM):
            c = MOMENTS + j
            s = (xg * tab[:GRAIN, c]).sum(-1) % P
            out[sl, c] = (s * _mix(blk, 101 + j) % P).sum(1) % P
    return out


def reference(buf: torch.Tensor, offsets: list[int], sizes: list[int]) -> torch.Tensor:
    dev = buf.device
    tab = _table(dev)
    x16 = _limb_view(buf)
    limbs = [(n + 1) // 2 for n in sizes]
    R = _row_length(limbs)
    nrows = [max(1, -(-k // R)) for k in limbs]
    rows_t = torch.tensor(nrows, dtype=torch.int64)
    seg_of_row = torch.repeat_interleave(torch.arange(len(sizes)), rows_t)
    starts = torch.cumsum(rows_t, 0) - rows_t
    row_in_seg = torch.arange(int(rows_t.sum()), dtype=torch.int64) - starts[seg_of_row]
    first = torch.tensor([o // 2 for o in offsets], dtype=torch.int64)[seg_of_row]
    k = torch.tensor(limbs, dtype=torch.int64)[seg_of_row]
    odd = torch.tensor([n % 2 for n in sizes], dtype=torch.bool)[seg_of_row]
    rows = _row_sums(x16, first, k, odd, row_in_seg, R, tab)
    return _encode(_combine(rows, seg_of_row, row_in_seg, R, len(sizes), torch.tensor(sizes, dtype=torch.int64)))


# ---- the cases ------------------------------------------------------------------------------------------
def packed(count: int, size: int) -> tuple[list[int], list[int], int]:
    """``count`` regions of ``size`` bytes, each at the next 8-byte aligned offset (as pack.py lays them)."""
    stride = (size + 7) & ~7
    return [k * stride for k in range(count)], [size] * count, count * stride


CASES = [("64 MiB, one segment", [0], [64 << 20], 64 << 20),
         ("200 x 140 KB regions", *packed(200, 140_000)),
         ("5,000 x 1 KB regions", *packed(5000, 1000))]


def best_of(repeats: int, fn) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per implementation")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'case':24s} {'old s':>9s} {'new s':>9s} {'old/new':>8s}")
    for name, offsets, sizes, total in CASES:
        buf = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        new_t, new = best_of(args.repeats, lambda b=buf, o=offsets, s=sizes: segment_checksums(b, o, s))
        old_t, old = best_of(args.repeats, lambda b=buf, o=offsets, s=sizes: reference(b, o, s))
        if not torch.equal(old, new):
            raise SystemExit(f"{name}: the implementations disagree")
        print(f"{name:24s} {old_t:9.4f} {new_t:9.4f} {old_t / new_t:7.1f}x")


if __name__ == "__main__":
    main()
