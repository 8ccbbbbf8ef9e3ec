"""Checksums of byte buffers with proven detection guarantees, in integer torch ops (CPU or CUDA).

A buffer of ``n`` bytes is read as ``N = ceil(n / 2)`` little-endian 16-bit limbs ``x_0 .. x_{N-1}``
(a zero byte pads an odd length). With the prime ``p = 2**31 - 1`` and ``u_i = i + 1`` the checksum is
eight residues modulo ``p``:

    S_m = sum_i u_i**m * x_i        for m = 0 .. 4      (moments)
    R_k = sum_i r_k(i) * x_i + n * L_k   for k = 0 .. 2  (pseudo-random weights, the length mixed in)

returned as ``WORDS = 4`` int64 (two 31-bit residues per word; ``SUM_BYTES = 32``).

Guarantees (proofs in docs/checksums.md; every one is a property test in tests/test_checksum.py), for
buffers of fewer than ``p - 1`` limbs (4 GiB):

1. **Any change of at most 5 limbs anywhere is detected**: the change vector ``d`` (``0 < |d_i| < 2**16``,
   so ``d_i != 0 mod p``) has at most 5 non-zero entries at distinct positions ``u_i < p``; the 5x5
   Vandermonde matrix of ``(u_i ** m)`` is invertible mod ``p``, so ``S_0 .. S_4`` cannot all be unchanged.
   Hence every change of up to 5 bits, of up to 5 bytes, of one or two fp32/int32 elements, of one 8-byte
   word, of up to five bf16/fp16/fp8/int8 elements.
2. **Any swap of two different non-overlapping blocks of at most 4 limbs** (two 2-, 4- or 8-byte words,
   aligned or not) is detected: ``S_m`` changes by ``sum_{j<m} C(m,j) (u_a**(m-j) - u_b**(m-j)) M_j``
   where ``M_j = sum_k k**j y_k`` are the moments of the difference ``y`` of the blocks; with
   ``u_a != u_b`` this forces ``M_0 = .. = M_3 = 0`` in turn, and a 4 x L Vandermonde with ``L <= 4``
   forces ``y = 0``.
3. **Everything else** (longer swapped regions, zeroed tails, NaN payloads, random damage) is missed only
   when all eight residues are unchanged. For a change independent of the fixed weight tables the three
   random residues are each uniform, so the miss probability is at most ``p**-3 < 2**-92`` per checksum;
   tests/test_checksum.py checks the structured families (sign flips at every position pattern,
   high-bit flips, swapped words and regions, zeroed tails, NaN payloads) for fp32, bf16, fp16, fp8 and
   int dtypes and finds no miss.

Exact arithmetic, so CPU and CUDA give the same value bit for bit (one code path for both).
``segment_checksums`` cuts every segment into rows of ``R <= 2**15`` limbs (segment-local positions; a
segment's last row zero padded), converts the rows to float64 and multiplies them by two weight
matrices (a few kernels per pass of 1 M limbs, 16 M on CUDA, whatever the number of segments):

* moments: ``[rows, R] @ [R, 10]``, the weights ``w = (t+1)**m mod p < 2**31`` split into halves
  ``w = w_hi * 2**16 + w_lo`` (``w_lo < 2**16``, ``w_hi < 2**15``): each product ``x * w_half < 2**32``,
  each row sum ``< R * 2**32 <= 2**47``;
* random sums: ``[rows * R / 64, 64] @ [64, 3]``, one block of 64 limbs times the whole in-block weights
  ``table_k[i % 64] < 2**31``: each product ``< 2**47``, each block sum ``< 64 * 2**47 = 2**53``.

Every product and every partial sum of these matmuls is then an integer below ``2**53``, which float64
holds exactly, so the result is exact whatever the BLAS's summation order, blocking or use of FMA (CPU
BLAS and cuBLAS alike; float64 has no TF32-style reduced mode). The rest is int64: ``w_hi`` sums times
``2**16`` plus ``w_lo`` sums (``< 2**63``) mod p; block sums mod p times ``mix_k(block)`` (``< 2**62``),
summed per row mod p; then each row's moments shifted to its place in the segment (binomial) and the rows
summed per segment. ``checksum`` is the one-segment case.
"""

from __future__ import annotations

import torch

from reshardctl.runtime.dtypes import signed64

P = (1 << 31) - 1
MOMENTS = 5
RANDOM = 3
WORDS = (MOMENTS + RANDOM) // 2  # int64 words per checksum
SUM_BYTES = 8 * WORDS
ROW = 1 << 15  # limbs per row: a row's float64 sum of (limb < 2**16) * (16-bit weight half) stays < 2**47
_L = (0x2545F4914F6CDD1D % P, 0x9E3779B97F4A7C15 % P, 0xBF58476D1CE4E5B9 % P)
_BINOM = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]


def _mix(idx: torch.Tensor, seed: int) -> torch.Tensor:
    """splitmix64 of ``idx`` (int64, wrapping), reduced to [0, p)."""
    x = idx * signed64(0x9E3779B97F4A7C15) + signed64(seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019)
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        x = x * signed64(mul)
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    return (x & 0x7FFFFFFF) % P


_tables: dict[tuple[str, int], torch.Tensor] = {}
GRAIN = 64  # limbs per random-weight block: r_k(i) = table_k[i % GRAIN] * mix_k(i // GRAIN)


def _table(device: torch.device) -> torch.Tensor:
    """[ROW, 8] int64: per position t, (t+1)**m mod p (m = 0..4), then the random in-block weights."""
    key = (device.type, device.index if device.index is not None else -1)
    tab = _tables.get(key)
    if tab is None:
        t = torch.arange(ROW, dtype=torch.int64)
        u = t + 1
        cols = [torch.ones_like(u)]
        for _ in range(1, MOMENTS):
            cols.append(cols[-1] * u % P)
        cols += [_mix(t % GRAIN, 1 + k) for k in range(RANDOM)]
        tab = torch.stack(cols, 1).to(device)
        _tables[key] = tab
    return tab


def _row_length(limbs: list[int]) -> int:
    """Limbs per row (a power of two in [GRAIN, ROW]) that minimises the padded work of these segments."""
    best, best_cost = ROW, None
    r = GRAIN
    while r <= ROW:
        cost = sum(max(1, -(-k // r)) * (r + 256) for k in limbs)  # + a per-row overhead
        if best_cost is None or cost < best_cost:
            best, best_cost = r, cost
        r *= 2
    return best


def _chunk_limbs(device: torch.device) -> int:
    """Limbs per pass (bounds the float64 temporaries: 8 bytes a limb)."""
    return 1 << 24 if device.type == "cuda" else 1 << 20


_weights: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _float_weights(R: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [R, 10]: the five moment weights' low 16 bits, then their high 15 bits; float64 [GRAIN, 3]:
    the random in-block weights (whole, < 2**31)."""
    key = (device.type, device.index if device.index is not None else -1, R)
    if key not in _weights:
        tab = _table(device)
        w = tab[:R, :MOMENTS]
        _weights[key] = (torch.cat([w & 0xFFFF, w >> 16], 1).double(), tab[:GRAIN, MOMENTS:].double())
    return _weights[key]


_mixes: dict[tuple[str, int], torch.Tensor] = {}


def _block_mix(blocks: int, device: torch.device) -> torch.Tensor:
    """int64 [>= blocks, 3]: mix_k(b) for the random sums k = 0..2 (cached, grown by doubling)."""
    key = (device.type, device.index if device.index is not None else -1)
    mix = _mixes.get(key)
    if mix is None or mix.shape[0] < blocks:
        b = torch.arange(1 << max(blocks - 1, 1).bit_length(), dtype=torch.int64)
        mix = torch.stack([_mix(b, 101 + j) for j in range(RANDOM)], 1).to(device)
        _mixes[key] = mix
    return mix


_VIEW_RUNS = 32  # up to this many runs of consecutive rows (or partial rows) per pass: one by one


def _fill(out: torch.Tensor, buf: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
          last: torch.Tensor, R: int) -> None:
    """``out`` (float64 [m, R]) <- m rows of limbs as unsigned values: row i holds the ``count[i]`` limbs
    from limb ``start[i]`` of ``buf``, then, where ``last[i] >= 0``, the byte ``buf[last[i]]`` (an odd
    segment's last limb), then zeros. ``start``, ``count``, ``last``: int64 on the CPU (no host sync).
    A few runs of consecutive rows are copied as views; otherwise one gather of R-limb windows (a padded
    copy of the buffer's last R limbs serves the rows that run past its end). Then the limbs past
    ``count`` are zeroed (row by row when few rows are partial)."""
    dev = buf.device
    n16 = buf.numel() // 2
    x16 = buf[: 2 * n16].view(torch.int16)
    inside = start + R <= n16
    runs = torch.nonzero(torch.cat([torch.tensor([True]), start[1:] != start[:-1] + R])).flatten().tolist()
    if len(runs) <= _VIEW_RUNS and bool(inside.all()):
        for a, b in zip(runs, runs[1:] + [start.numel()]):
            s0 = int(start[a])
            out[a:b].copy_(x16[s0 : s0 + (b - a) * R].view(b - a, R).view(torch.uint16))
    else:
        lo = max(0, n16 - R)
        tail = torch.zeros(2 * R, dtype=torch.int16, device=dev)
        tail[: n16 - lo] = x16[lo:]
        for rows, src, shift in ((torch.nonzero(inside).flatten(), x16, 0),
                                 (torch.nonzero(~inside).flatten(), tail, lo)):
            if rows.numel():
                win = src.unfold(0, R, 1)[(start[rows] - shift).to(dev)]
                out.index_copy_(0, rows.to(dev), win.view(torch.uint16).double())
    part = torch.nonzero(count < R).flatten()
    if part.numel() <= _VIEW_RUNS:
        for i in part.tolist():
            out[i, int(count[i]):] = 0
    else:
        keep = torch.arange(R, device=dev)[None, :] < count[part].to(dev)[:, None]
        pdev = part.to(dev)
        out.index_copy_(0, pdev, out.index_select(0, pdev) * keep)
    if part.numel():
        odd = torch.nonzero(last >= 0).flatten()
        if odd.numel():
            out[odd.to(dev), count[odd].to(dev)] = buf[last[odd].to(dev)].double()


def _row_sums(buf: torch.Tensor, start: torch.Tensor, count: torch.Tensor, last: torch.Tensor,
              rin: torch.Tensor, R: int) -> torch.Tensor:
    """[rows, 8] residues per row (see ``_fill``): the five moments with row-local positions, and the three
    random sums (at their positions in the segment, row ``rin``). Exact float64 matmuls: see the module."""
    dev = buf.device
    rows = start.numel()
    res = torch.empty(rows, MOMENTS + RANDOM, dtype=torch.int64, device=dev)
    if rows == 0:
        return res
    wm, wr = _float_weights(R, dev)
    nb = R // GRAIN
    rin_d = rin.to(dev)
    mix = _block_mix((int(rin.max()) + 1) * nb, dev)
    blk_in_row = torch.arange(nb, dtype=torch.int64, device=dev)[None, :]
    step = max(1, _chunk_limbs(dev) // R)
    xf = torch.empty(min(rows, step), R, dtype=torch.float64, device=dev)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = xf[: r1 - r0]
        _fill(x, buf, start[r0:r1], count[r0:r1], last[r0:r1], R)
        m = (x @ wm).to(torch.int64)  # < R * 2**32 <= 2**47 each
        res[r0:r1, :MOMENTS] = (m[:, MOMENTS:] * 65536 + m[:, :MOMENTS]) % P  # hi * 2**16 < 2**62
        s = (x.view(-1, GRAIN) @ wr).to(torch.int64).view(r1 - r0, nb, RANDOM) % P  # < 64 * 2**47 = 2**53
        b = mix[rin_d[r0:r1, None] * nb + blk_in_row]  # [rows, nb, 3]
        res[r0:r1, MOMENTS:] = (s * b % P).sum(1) % P
    return res


def _combine(rows: torch.Tensor, seg_of_row: torch.Tensor, row_in_seg: torch.Tensor, R: int, nseg: int,
             nbytes: torch.Tensor) -> torch.Tensor:
    """Row sums -> per-segment residues [nseg, 8]: moments shifted by the row's start (binomial), the
    random sums added, the length mixed in."""
    q = (row_in_seg * R) % P  # the row's first position, 0-based in its segment
    qp = [torch.ones_like(q)]
    for _ in range(1, MOMENTS):
        qp.append(qp[-1] * q % P)
    terms = []
    for m in range(MOMENTS):  # sum_t (q + t + 1)^m x_t = sum_j C(m,j) q^(m-j) S_j
        acc = torch.zeros_like(q)
        for j in range(m + 1):
            acc = (acc + (_BINOM[m][j] * qp[m - j] % P) * rows[:, j]) % P
        terms.append(acc)
    per_row = torch.cat([torch.stack(terms, 1), rows[:, MOMENTS:]], 1)
    out = torch.zeros(nseg, MOMENTS + RANDOM, dtype=torch.int64, device=rows.device)
    out.index_add_(0, seg_of_row, per_row)  # residues < 2**31, fewer than 2**31 rows: no overflow
    out %= P
    lens = torch.stack([nbytes % P * L % P for L in _L], 1)
    out[:, MOMENTS:] = (out[:, MOMENTS:] + lens) % P
    return out


def _encode(res: torch.Tensor) -> torch.Tensor:
    return (res[:, 0::2] << 31) | res[:, 1::2]


def segment_checksums(buf: torch.Tensor, offsets, sizes) -> torch.Tensor:
    """Checksums of ``buf[o : o + n]`` for every (offset, size), as an int64 [len, WORDS] tensor on
    ``buf``'s device, in one pass of a few kernels whatever the number of segments (no host sync).
    Offsets must be even (staging blocks and buckets align every message and tensor to 8 bytes)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksums want a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    offsets, sizes = list(offsets), list(sizes)
    dev = buf.device
    if not offsets:
        return torch.empty(0, WORDS, dtype=torch.int64, device=dev)
    if any(o % 2 for o in offsets) or any(o < 0 or n < 0 or o + n > buf.numel() for o, n in zip(offsets, sizes)):
        raise ValueError("segments must start at even offsets inside the buffer")
    if buf.data_ptr() % 2 or not buf.is_contiguous():
        buf = buf.clone(memory_format=torch.contiguous_format)  # limbs need a 2-byte aligned start
    R = _row_length([(n + 1) // 2 for n in sizes])
    off = torch.tensor(offsets, dtype=torch.int64)
    nbytes = torch.tensor(sizes, dtype=torch.int64)
    limbs = (nbytes + 1) // 2
    nrows = -(-limbs // R)  # the last row of a segment may be partial (none for an empty segment)
    seg = torch.repeat_interleave(torch.arange(len(sizes)), nrows)
    rin = torch.arange(seg.numel(), dtype=torch.int64) - (torch.cumsum(nrows, 0) - nrows)[seg]
    start = off[seg] // 2 + rin * R
    count = (nbytes[seg] // 2 - rin * R).clamp(max=R)  # whole limbs in the row
    odd_row = (nbytes[seg] % 2 == 1) & (rin == nrows[seg] - 1)
    last = torch.where(odd_row, off[seg] + nbytes[seg] - 1, -1)
    rows = _row_sums(buf, start, count, last, rin, R)
    res = _combine(rows, seg.to(dev), rin.to(dev), R, len(sizes), nbytes.to(dev))
    return _encode(res)


def checksum(buf: torch.Tensor) -> torch.Tensor:
    """Checksum of a 1-D uint8 tensor: int64 [WORDS] on the same device (no host sync)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksum wants a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    if buf.data_ptr() % 2:
        buf = buf.clone()
    return segment_checksums(buf, [0], [buf.numel()])[0]
