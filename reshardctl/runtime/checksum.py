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

Integer arithmetic only (every partial sum stays below 2**63), so CPU and CUDA give the same value bit
for bit. ``segment_checksums`` computes every region of a packed message or bucket in one pass of a
few kernels (no per-region launches); ``checksum`` is the one-segment case.
"""

from __future__ import annotations

import torch

P = (1 << 31) - 1
MOMENTS = 5
RANDOM = 3
WORDS = (MOMENTS + RANDOM) // 2  # int64 words per checksum
SUM_BYTES = 8 * WORDS
ROW = 1 << 15  # limbs per row: a row's sum of (limb < 2**16) * (weight < 2**31) stays below 2**63
_MASK64 = (1 << 64) - 1
_L = (0x2545F4914F6CDD1D % P, 0x9E3779B97F4A7C15 % P, 0xBF58476D1CE4E5B9 % P)
_BINOM = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _mix(idx: torch.Tensor, seed: int) -> torch.Tensor:
    """splitmix64 of ``idx`` (int64, wrapping), reduced to [0, p)."""
    x = idx * _signed(0x9E3779B97F4A7C15) + _signed(seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019)
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        x = x * _signed(mul)
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


def _limb_view(buf: torch.Tensor) -> torch.Tensor:
    """The buffer as int16 limbs (a copy only when unaligned, empty or of odd length; pad bytes are zero)."""
    n = buf.numel()
    if n % 2 or n == 0 or buf.data_ptr() % 2 or not buf.is_contiguous():
        padded = torch.zeros(max(2, n + n % 2), dtype=torch.uint8, device=buf.device)
        padded[:n] = buf
        buf = padded
    return buf.view(torch.int16)


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


def _row_sums(x16: torch.Tensor, first: torch.Tensor, k: torch.Tensor, odd: torch.Tensor, rin: torch.Tensor,
              R: int, tab: torch.Tensor) -> torch.Tensor:
    """[rows, 8] residues per row (R limbs of one segment, zero padded past its end): the five moments
    with row-local positions, and the three random sums (already at their global positions)."""
    dev = x16.device
    rows = rin.numel()
    out = torch.empty(rows, MOMENTS + RANDOM, dtype=torch.int64, device=dev)
    ar = torch.arange(R, dtype=torch.int64, device=dev)[None, :]
    nb = R // GRAIN
    step = max(1, (_block_limbs(dev)) // R)
    for r0 in range(0, rows, step):
        sl = slice(r0, min(rows, r0 + step))
        t = rin[sl, None] * R + ar  # limb position inside its segment
        kk = k[sl, None]
        valid = t < kk
        x = x16[torch.where(valid, first[sl, None] + t, 0)].to(torch.int64) & 0xFFFF
        x = torch.where(valid, x, 0)
        x = torch.where((t == kk - 1) & odd[sl, None], x & 0xFF, x)  # an odd segment's last limb: one byte
        for c in range(MOMENTS):
            out[sl, c] = (x * tab[:R, c]).sum(1) % P  # < R * 2**47 <= 2**62
        xg = x.view(-1, nb, GRAIN)
        blk = rin[sl, None] * nb + torch.arange(nb, dtype=torch.int64, device=dev)[None, :]
        for j in range(RANDOM):
            c = MOMENTS + j
            s = (xg * tab[:GRAIN, c]).sum(-1) % P
            out[sl, c] = (s * _mix(blk, 101 + j) % P).sum(1) % P
    return out


def _block_limbs(device: torch.device) -> int:
    """Limbs per pass (bounds the temporaries: a few int64 arrays of this length)."""
    return 1 << 24 if device.type == "cuda" else 1 << 19


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
    Offsets must be even (pack.py aligns every region to 8 bytes)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksums want a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    offsets, sizes = list(offsets), list(sizes)
    dev = buf.device
    if not offsets:
        return torch.empty(0, WORDS, dtype=torch.int64, device=dev)
    if any(o % 2 for o in offsets) or any(o < 0 or n < 0 or o + n > buf.numel() for o, n in zip(offsets, sizes)):
        raise ValueError("segments must start at even offsets inside the buffer")
    tab = _table(dev)
    x16 = _limb_view(buf)
    limbs = [(n + 1) // 2 for n in sizes]
    R = _row_length(limbs)
    nrows = [max(1, -(-k // R)) for k in limbs]
    rows_t = torch.tensor(nrows, dtype=torch.int64)
    seg_of_row = torch.repeat_interleave(torch.arange(len(sizes)), rows_t)
    starts = torch.cumsum(rows_t, 0) - rows_t
    row_in_seg = torch.arange(int(rows_t.sum()), dtype=torch.int64) - starts[seg_of_row]
    seg_d, rin_d = seg_of_row.to(dev), row_in_seg.to(dev)
    first = torch.tensor([o // 2 for o in offsets], dtype=torch.int64, device=dev)[seg_d]
    k = torch.tensor(limbs, dtype=torch.int64, device=dev)[seg_d]
    odd = torch.tensor([n % 2 for n in sizes], dtype=torch.bool, device=dev)[seg_d]
    rows = _row_sums(x16, first, k, odd, rin_d, R, tab)
    res = _combine(rows, seg_d, rin_d, R, len(sizes), torch.tensor(sizes, dtype=torch.int64, device=dev))
    return _encode(res)


def checksum(buf: torch.Tensor) -> torch.Tensor:
    """Checksum of a 1-D uint8 tensor: int64 [WORDS] on the same device (no host sync)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksum wants a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    if buf.data_ptr() % 2:
        buf = buf.clone()
    return segment_checksums(buf, [0], [buf.numel()])[0]


def checksums(segments: list[torch.Tensor]) -> torch.Tensor:
    """Checksums of several buffers as an int64 [len, WORDS] tensor (empty input -> [0, WORDS])."""
    if not segments:
        return torch.empty(0, WORDS, dtype=torch.int64)
    return torch.stack([checksum(s) for s in segments])
