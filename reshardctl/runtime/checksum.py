"""Checksums of byte buffers with proven detection guarantees, exact in integer arithmetic (CPU or CUDA).

A buffer of ``n`` bytes is read as ``N = ceil(n / 2)`` limbs ``x_i = s(b_2i) + 256 s(b_2i+1)``, each
byte ``b`` taken as its two's-complement value ``s(b)`` in ``[-128, 127]`` (a zero byte pads an odd
length; a limb is in ``[-32896, 32639]`` and determines its two bytes). With the prime
``p = 2**31 - 1`` and ``u_i = i + 1`` the checksum is eight residues modulo ``p``:

    S_m = sum_i u_i**m * x_i        for m = 0 .. 4      (moments)
    R_k = sum_i r_k(i) * x_i + n * L_k   for k = 0 .. 2  (pseudo-random weights, the length mixed in)
    r_k(i) = t_k[i mod 64] * g_k**(i div 64)            (t_k: splitmix64 tables; g_k: primitive roots)

returned as ``WORDS = 4`` int64 (two 31-bit residues per word; ``SUM_BYTES = 32``).

Guarantees (proofs in docs/checksums.md; every one is a property test in tests/runtime/test_checksum.py), for
buffers of fewer than ``p - 1`` limbs (4 GiB):

1. **Any change of at most 5 limbs anywhere is detected**: the change vector ``d`` (a limb's value
   determines its bytes, so ``0 < |d_i| < 2**16`` and ``d_i != 0 mod p``) has at most 5 non-zero entries
   at distinct positions ``u_i < p``; the 5x5 Vandermonde matrix of ``(u_i ** m)`` is invertible mod
   ``p``, so ``S_0 .. S_4`` cannot all be unchanged.
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
   tests/runtime/test_checksum.py checks the structured families (sign flips at every position pattern,
   high-bit flips, swapped words and regions, zeroed tails, NaN payloads) for fp32, bf16, fp16, fp8 and
   int dtypes and finds no miss.

How it is computed. ``segment_checksums`` cuts every segment into rows of ``R <= 2**15`` limbs
(``2R`` bytes, segment-local positions; a segment's last row zero padded). Every weight is separable
by rows: within a row starting at limb ``q`` (a multiple of ``R``, itself a multiple of 64), position
``q + t`` has the moment weights ``(q + t + 1)**m`` (binomially shifted from the row-local
``(t + 1)**j``) and the random weights ``g_k**(q / 64) * w_k(t)`` with the row-local
``w_k(t) = t_k[t mod 64] * g_k**(t div 64)``. So each row needs its eight row-local sums, which are one
matrix product of the rows with a fixed ``[R, 8]`` weight table, exact in one of four ways
(checksum_rows.py):

* **c-avx2 / c-base** (the CPU, where the install compiled ``_rowsums.c``): the limbs (``|x| <= 32896``)
  times the float64 weights (``w < 2**31``), read where they lie; every product is an integer below
  ``2**46.01`` and every sum of at most 64 of them below ``2**52.01 < 2**53``, so float64 holds each
  exactly, whatever the order of the additions or the use of FMA; each block of 64 goes to int64 at
  once (a row totals ``< 2**61.01``).
* **int8** (the CPU, where ``torch._int_mm`` exists): the rows' bytes are read as
  int8 where they lie (runs of whole rows are views of the buffer, no copy; only a segment's partial
  last row, or rows too scattered to read one by one, are gathered), and each weight per *byte*
  (``w`` for a limb's low byte, ``256 w mod p`` for its high byte, taken in ``(-p, p)``) is written in
  five balanced base-128 digits in ``[-64, 63]``: ``[rows, 2R] int8 @ [2R, 40] int8 -> int32``. Every
  product is at most ``2**13`` in magnitude and every sum at most ``2R * 2**13 <= 2**29``, so no int32
  overflows; a kernel that shifts the data to unsigned bytes and adds pairs of products in int16 (CPUs
  without VNNI) stays below
  ``2 * 255 * 64 < 2**15``. In int64 the digits are recombined (``< 2**61`` in magnitude).
* **float64** (CUDA, and every CPU): the limbs (``s(lo) + 256 s(hi)``, ``|x| <= 32896``) as float64
  times the weights split into 16-bit halves (``w = w_hi * 2**16 + w_lo``, ``w_lo < 2**16``,
  ``w_hi < 2**15``): ``[rows, R] @ [R, 16]``, every product ``< 2**32`` in magnitude and every row sum
  ``< R * 2**32 <= 2**47``: integers below ``2**53``, which float64 holds exactly whatever the BLAS's
  summation order, blocking or use of FMA (CPU BLAS and cuBLAS alike; float64 has no TF32-style
  reduced mode).

All are exact, so they give the same value bit for bit (tests compare them, and CUDA with pinned
values). Which one a CPU process takes is measured on the machine at first use (checksum_choice.py:
the fastest that passes an exactness probe), never picked by which instructions exist. The rest is int64 residue arithmetic below ``2**63``, a fixed number of kernels per call: each
row's moments shifted to its place in the segment (one product per power of ``q``), its random sums
times ``g_k**(q / 64)`` (two lookups in tables cached per row length, not a square-and-multiply per
exponent bit), the rows summed per segment, the length mixed in. ``checksum`` is the one-segment case.
"""

from __future__ import annotations

import operator

import torch

from reshardctl.runtime import checksum_choice
from reshardctl.runtime.checksum_rows import (GRAIN, MOMENTS, P, RANDOM, ROW, SUMS, _G, _constant, _to_device,
                                              row_length, row_sums, windows)

WORDS = SUMS // 2  # int64 words per checksum
SUM_BYTES = 8 * WORDS
_L = (0x2545F4914F6CDD1D % P, 0x9E3779B97F4A7C15 % P, 0xBF58476D1CE4E5B9 % P)
_BINOM = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]
__all__ = ["GRAIN", "P", "ROW", "SUM_BYTES", "WORDS", "checksum", "path_for", "segment_checksums"]


def path_for(device: torch.device) -> str:
    """The row-sum path for buffers on ``device``: on the CPU the one measured fastest here
    (checksum_choice.py), on CUDA the float64 path."""
    return checksum_choice.cpu_path() if device.type == "cpu" else "float64"


_POW_LO = 1 << 10  # row shifts g**(j R/64) = low table [j mod 1024] x high table [j div 1024]
_pow_tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _geometric(bases: list[int], n: int) -> torch.Tensor:
    """int64 [n, 3]: ``bases[k] ** j mod p`` for j = 0 .. n-1 (doubling: log2(n) products)."""
    t = torch.ones(1, RANDOM, dtype=torch.int64)
    while t.shape[0] < n:
        step = torch.tensor([pow(b, t.shape[0], P) for b in bases], dtype=torch.int64)
        t = torch.cat([t, t * step % P])
    return t[:n]


def _row_shifts(rin: torch.Tensor, R: int) -> torch.Tensor:
    """int64 [rows, 3] on the CPU: ``g_k ** (rin * R / 64) mod p``, the random weights' shift for a row
    that starts at limb ``rin * R`` of its segment: two lookups in tables cached per row length (a
    high table grown by doubling as longer segments come), whatever the exponents."""
    need = (int(rin.max()) // _POW_LO + 1) if rin.numel() else 1
    got = _pow_tables.get(R)
    if got is None or got[1].shape[0] < need:
        step = [pow(g, R // GRAIN, P) for g in _G]
        lo = _geometric(step, _POW_LO)
        hi = _geometric([pow(x, _POW_LO, P) for x in step], max(need, 2 * got[1].shape[0] if got else 1))
        got = _pow_tables[R] = (lo, hi)
    lo, hi = got
    return lo[rin % _POW_LO] * hi[rin // _POW_LO] % P  # < 2**62


def _binomial(dev: torch.device) -> list[torch.Tensor]:
    """Per power ``d`` of the row's start: int64 [5 - d] on ``dev``, ``C(j + d, j)`` for j = 0 .. 4 - d
    (the factor of the row-local moment ``j`` in moment ``j + d``)."""
    return _constant("binomial", dev, lambda d: [torch.tensor([_BINOM[j + k][j] for j in range(MOMENTS - k)]).to(d)
                                                 for k in range(MOMENTS)])


def _combine(rows: torch.Tensor, seg_of_row: torch.Tensor, row_in_seg: torch.Tensor, R: int, nseg: int,
             nbytes: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Row sums -> per-segment residues [nseg, 8]: moments shifted by the row's start (binomial), random
    sums times ``shifts`` (``g_k**(start / 64)``, [rows, 3]), summed per segment, the length mixed in.
    A fixed number of kernels, whatever the rows and segments."""
    q = (row_in_seg * R) % P  # the row's first position, 0-based in its segment
    # moment m at the row's place: sum_j C(m, j) q^(m-j) S_j, taken by powers d = m - j of q: each
    # product < 2**62 reduced, times C <= 6, at most five terms summed (< 25 * 2**31) before one reduction
    moments = rows[:, :MOMENTS].clone()
    qd = q
    for d, binom in enumerate(_binomial(rows.device)[1:], start=1):
        moments[:, d:] += qd[:, None] * rows[:, : MOMENTS - d] % P * binom
        if d < MOMENTS - 1:
            qd = qd * q % P
    moments %= P
    terms = torch.cat([moments, rows[:, MOMENTS:] * shifts % P], 1)
    out = torch.zeros(nseg, SUMS, dtype=torch.int64, device=rows.device)
    out.index_add_(0, seg_of_row, terms)  # residues < 2**31, fewer than 2**31 rows
    out %= P
    lens = (nbytes % P)[:, None] * _constant("lengths", rows.device, lambda d: torch.tensor(_L).to(d)) % P
    out[:, MOMENTS:] = (out[:, MOMENTS:] + lens) % P
    return out



def _encode(res: torch.Tensor) -> torch.Tensor:
    return (res[:, 0::2] << 31) | res[:, 1::2]


def segment_checksums(buf: torch.Tensor, offsets, sizes) -> torch.Tensor:
    """Checksums of ``buf[o : o + n]`` for every (offset, size), as an int64 [len, WORDS] tensor on
    ``buf``'s device, in one pass whatever the number of segments (no host sync): about 40 kernels, and
    the row sums: one call of the compiled kernel, or (torch paths) a matrix product per run of at least
    64 whole rows read in place (a segment of many rows not right after the one before), per 64 MiB of
    such a run, and per pass of gathered rows.
    Offsets must be even (staging blocks and buckets align every message and tensor to 8 bytes)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksums want a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    offsets, sizes = list(offsets), list(sizes)
    dev = buf.device
    if not offsets:
        return torch.empty(0, WORDS, dtype=torch.int64, device=dev)
    # C-level passes (no Python per segment): even offsets, inside the buffer
    if (any(map((1).__and__, offsets)) or min(offsets) < 0 or min(sizes) < 0
            or max(map(operator.add, offsets, sizes)) > buf.numel()):
        raise ValueError("segments must start at even offsets inside the buffer")
    if not buf.is_contiguous():
        buf = buf.contiguous()
    return _checksums(buf, offsets, sizes, path_for(dev))


def _checksums(buf: torch.Tensor, offsets: list[int], sizes: list[int], path: str) -> torch.Tensor:
    """``segment_checksums`` of checked arguments, with the row sums of ``path`` (checksum_rows.py)."""
    dev = buf.device
    R = row_length(sizes, path)
    start, valid, seg, rin = windows(offsets, sizes, R)
    rows = row_sums(buf, start, valid, R, path)
    shifts = _row_shifts(rin, R)
    nbytes = torch.tensor(sizes, dtype=torch.int64)
    res = _combine(rows, _to_device(seg, dev), _to_device(rin, dev), R, len(sizes), _to_device(nbytes, dev),
                   _to_device(shifts, dev))
    return _encode(res)


def checksum(buf: torch.Tensor) -> torch.Tensor:
    """Checksum of a 1-D uint8 tensor: int64 [WORDS] on the same device (no host sync)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksum wants a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    return segment_checksums(buf, [0], [buf.numel()])[0]
