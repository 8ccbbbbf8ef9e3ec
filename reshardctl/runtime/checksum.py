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
matrix product of the rows with a fixed ``[R, 8]`` weight table, exact in one of two ways:

* **int8** (the CPU, where ``torch._int_mm`` exists and passes a probe): the rows' bytes are read as
  int8 where they lie (runs of whole rows are views of the buffer, no copy; only a segment's partial
  last row, or rows too scattered to read one by one, are gathered), and each weight per *byte*
  (``w`` for a limb's low byte, ``256 w mod p`` for its high byte, taken in ``(-p, p)``) is written in
  five balanced base-128 digits in ``[-64, 63]``: ``[rows, 2R] int8 @ [2R, 40] int8 -> int32``. Every
  product is at most ``2**13`` in magnitude and every sum at most ``2R * 2**13 <= 2**29``, so no int32
  overflows; a kernel that shifts the data to unsigned bytes and adds pairs of products in int16 (CPUs
  without VNNI) stays below
  ``2 * 255 * 64 < 2**15``. In int64 the digits are recombined (``< 2**61`` in magnitude).
* **float64** (CUDA, and the fallback): the limbs (``s(lo) + 256 s(hi)``, ``|x| <= 32896``) as float64
  times the weights split into 16-bit halves (``w = w_hi * 2**16 + w_lo``, ``w_lo < 2**16``,
  ``w_hi < 2**15``): ``[rows, R] @ [R, 16]``, every product ``< 2**32`` in magnitude and every row sum
  ``< R * 2**32 <= 2**47``: integers below ``2**53``, which float64 holds exactly whatever the BLAS's
  summation order, blocking or use of FMA (CPU BLAS and cuBLAS alike; float64 has no TF32-style
  reduced mode).

Both are exact, so they give the same value bit for bit (tests compare them, and CUDA with pinned
values). The rest is int64 residue arithmetic below ``2**63``, a fixed number of kernels per call: each
row's moments shifted to its place in the segment (one product per power of ``q``), its random sums
times ``g_k**(q / 64)`` (two lookups in tables cached per row length, not a square-and-multiply per
exponent bit), the rows summed per segment, the length mixed in. ``checksum`` is the one-segment case.
"""

from __future__ import annotations

import operator
from collections import Counter

import torch

from reshardctl.runtime.dtypes import signed64

P = (1 << 31) - 1
MOMENTS = 5
RANDOM = 3
SUMS = MOMENTS + RANDOM
WORDS = SUMS // 2  # int64 words per checksum
SUM_BYTES = 8 * WORDS
ROW = 1 << 15  # limbs per row at most (the bounds above)
GRAIN = 64  # limbs per random-weight block: r_k(i) = t_k[i % GRAIN] * g_k**(i // GRAIN)
_L = (0x2545F4914F6CDD1D % P, 0x9E3779B97F4A7C15 % P, 0xBF58476D1CE4E5B9 % P)
_G = tuple(pow(7, e, P) for e in (65537, 1000003, 999983))  # 7 is a primitive root of p; e coprime to p - 1
_BINOM = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]
DIGITS = 5  # balanced base-128 digits per weight (the int8 path)


def _mix(idx: torch.Tensor, seed: int) -> torch.Tensor:
    """splitmix64 of ``idx`` (int64, wrapping), reduced to [0, p)."""
    x = idx * signed64(0x9E3779B97F4A7C15) + signed64(seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019)
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        x = x * signed64(mul)
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    return (x & 0x7FFFFFFF) % P


_table_cache: list[torch.Tensor] = []


def _table() -> torch.Tensor:
    """int64 [ROW, 8] on the CPU: per row-local limb t, (t+1)**m mod p (m = 0..4), then w_k(t)."""
    if not _table_cache:
        t = torch.arange(ROW, dtype=torch.int64)
        cols = [torch.ones_like(t)]
        for _ in range(1, MOMENTS):
            cols.append(cols[-1] * (t + 1) % P)
        for k in range(RANDOM):
            powers = [1]
            for _ in range(ROW // GRAIN - 1):
                powers.append(powers[-1] * _G[k] % P)
            cols.append(_mix(t % GRAIN, 1 + k) * torch.tensor(powers)[t // GRAIN] % P)
        _table_cache.append(torch.stack(cols, 1))
    return _table_cache[0]


def _to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A small CPU tensor (indices, sizes) on ``dev`` without a host sync: on CUDA through pinned memory,
    non-blocking on the current stream (the caching host allocator keeps the pinned block until the
    copy is done); a pageable copy would wait for the stream's work, packs included."""
    if dev.type != "cuda":
        return t
    return t.pin_memory().to(dev, non_blocking=True)


def _row_length(sizes: list[int]) -> int:
    """Limbs per row (a power of two in [GRAIN, ROW]) that minimises the padded work of segments of these
    byte ``sizes``; Python per distinct size (a bucket of experts has few), not per segment."""
    best, best_cost = ROW, None
    counts = [((n + 1) // 2, c) for n, c in Counter(sizes).items()]  # limbs per segment, how many
    r = GRAIN
    while r <= ROW:
        cost = sum(c * max(1, -(-k // r)) for k, c in counts) * (r + 256)  # + a per-row overhead
        if best_cost is None or cost < best_cost:
            best, best_cost = r, cost
        r *= 2
    return best


def _chunk_limbs(device: torch.device, int8: bool) -> int:
    """Rows per pass, in limbs, bounding the temporaries: on the int8 path 8 MiB of data (larger int8
    matmuls run faster; rows read in place cost nothing, gathered ones 2 bytes a limb), on the float64
    path 10 bytes a limb (20 MiB on the CPU; 160 MiB on CUDA)."""
    if device.type == "cuda":
        return 1 << 24
    return 1 << 22 if int8 else 1 << 21


def _key(device: torch.device) -> tuple[str, int]:
    return device.type, device.index if device.index is not None else -1


_constants: dict[tuple, object] = {}


def _constant(name, device: torch.device, make):
    """A constant (tensors) built once per device: ``make(device)``; every table on a device is one."""
    key = (name,) + _key(device)
    got = _constants.get(key)
    if got is None:
        got = _constants[key] = make(device)
    return got


def _float_weights(R: int, device: torch.device) -> torch.Tensor:
    """float64 [R, 16]: the eight row-local weights' low 16 bits, then their high 15 bits."""
    def make(dev):
        w = _table()[:R]
        return torch.cat([w & 0xFFFF, w >> 16], 1).double().to(dev)
    return _constant(("float", R), device, make)


_int8_full: list[torch.Tensor] = []


def _int8_table() -> torch.Tensor:
    """For a row of ROW limbs, on the CPU: int8 [2 ROW, 40], per byte each of the eight weights (``w``
    for a limb's low byte, ``256 w mod p`` for its high byte, as a value in (-p, p)) in five balanced
    base-128 digits in [-64, 63], a weight's five digits side by side. A shorter row's table is its
    first 2R rows (the weights are row-local)."""
    if not _int8_full:
        w = _table()
        v = torch.stack([w, w * 256 % P], 1).reshape(2 * ROW, SUMS)  # byte 2t: w(t); byte 2t+1: 256 w(t)
        v = torch.where(v > P // 2, v - P, v)  # |v| <= p / 2: five digits reach 63 * (128**5 - 1) / 127
        digits = []
        rest = v.clone()
        for _ in range(DIGITS):
            d = (rest + 64) % 128 - 64
            digits.append(d)
            rest = (rest - d) // 128
        if bool((rest != 0).any()):
            raise AssertionError("checksum weights need more than five base-128 digits")
        _int8_full.append(torch.stack(digits, 2).reshape(2 * ROW, SUMS * DIGITS).to(torch.int8))
    return _int8_full[0]


def _int8_weights(R: int, device: torch.device) -> torch.Tensor:
    """The int8 digits [2R, 40] of a row of R limbs (``_int8_table``)."""
    return _constant(("int8", R), device, lambda dev: _int8_table()[: 2 * R].to(dev))


_PLACES = torch.tensor([128 ** d for d in range(DIGITS)], dtype=torch.int64)
_int8_ok: dict[tuple, bool] = {}


def _use_int8(device: torch.device) -> bool:
    """The int8 path on the CPU where ``torch._int_mm`` exists and gives the float64 path's values on a
    probe of extreme and random bytes (once per process); float64 everywhere else."""
    key = _key(device)
    if key not in _int8_ok:
        _int8_ok[key] = False
        if device.type == "cpu" and hasattr(torch, "_int_mm"):
            g = torch.Generator().manual_seed(0)
            probe = torch.cat([torch.full((4 * GRAIN,), 255, dtype=torch.uint8), torch.zeros(2 * GRAIN, dtype=torch.uint8),
                               torch.randint(0, 256, (6 * GRAIN + 3,), dtype=torch.uint8, generator=g)])
            offs, sizes = [0, 2 * GRAIN, 8 * GRAIN], [probe.numel(), 5 * GRAIN + 1, 4 * GRAIN + 3]
            try:
                _int8_ok[key] = bool(torch.equal(_checksums(probe, offs, sizes, True), _checksums(probe, offs, sizes, False)))
            except (RuntimeError, TypeError, ValueError):  # an older torch: no CPU kernel, other signatures
                _int8_ok[key] = False
    return _int8_ok[key]


_VIEW_RUNS = 32  # up to this many runs of gathered rows are copied one by one
_RUN_ROWS = 4  # ... or any number of runs of this many rows on average (one copy per run beats a gather)
_ROW_FILLS = 256  # up to this many partial rows per pass are cleared one by one (else one mask: 2 passes)
_DIRECT_ROWS = 64  # a run of at least this many whole rows goes to the product in place (shorter ones
#                    are gathered: every product call packs the [2R, 40] weights once, ~20 rows' work)
_DIRECT_BYTES = 64 << 20  # the int8 path's bytes per product call read in place (its temporaries are the
_DIRECT_ROWS_MAX = 1 << 16  # [rows, 40] results, 480 bytes a row with their int64 copy: rows are capped);
#                             the float64 path keeps to its passes (its limbs are 4x the bytes)


def _keep(valid: torch.Tensor, W: int, dev: torch.device) -> torch.Tensor:
    """uint8 [m, W]: 0xFF for each row's first ``valid`` bytes, then 0: windows of one cached pattern."""
    pat = _constant(("keep", W), dev, lambda d: torch.cat([torch.full((W,), 0xFF, dtype=torch.uint8),
                                                           torch.zeros(W, dtype=torch.uint8)]).to(d))
    return torch.index_select(pat.unfold(0, W, 1), 0, _to_device(W - valid, dev))


def _gather(out: torch.Tensor, buf: torch.Tensor, start: torch.Tensor, valid: torch.Tensor) -> None:
    """``out`` (uint8 [m, W]) <- m rows: row i holds the ``valid[i]`` bytes from byte ``start[i]`` of
    ``buf``, then zero bytes. ``start``, ``valid``: int64 on the CPU (no host sync). On the CPU a few
    runs of consecutive rows, or runs of several rows each, are copied run by run; otherwise (and
    always on CUDA) one ``index_select`` of W-byte windows (rows that run past the buffer's end from a
    padded copy of its last W bytes). The bytes past ``valid`` are cleared row by row when few rows
    are partial on the CPU, else with one mask (``_keep``)."""
    dev = buf.device
    W = out.shape[1]
    n = buf.numel()
    cuda = dev.type == "cuda"  # a launch per run or per row costs more there than one gather and one mask
    inside = start + W <= n
    runs = torch.nonzero(torch.cat([torch.tensor([True]), start[1:] != start[:-1] + W])).flatten().tolist()
    if not cuda and (len(runs) <= _VIEW_RUNS or start.numel() >= _RUN_ROWS * len(runs)) and bool(inside.all()):
        for a, b in zip(runs, runs[1:] + [start.numel()]):
            s0 = int(start[a])
            out[a:b].copy_(buf[s0 : s0 + (b - a) * W].view(b - a, W))
    else:
        if n >= W:
            torch.index_select(buf.unfold(0, W, 1), 0, _to_device(start.clamp(max=n - W), dev), out=out)
        outside = torch.nonzero(~inside).flatten()
        if outside.numel():
            lo = max(0, n - W)
            tail = torch.zeros(2 * W, dtype=torch.uint8, device=dev)
            tail[: n - lo] = buf[lo:]
            out.index_copy_(0, _to_device(outside, dev), tail.unfold(0, W, 1)[_to_device(start[outside] - lo, dev)])
    part = torch.nonzero(valid < W).flatten()
    if not part.numel():
        return
    if not cuda and part.numel() <= _ROW_FILLS:
        for i in part.tolist():
            out[i, int(valid[i]):] = 0
    else:
        out.bitwise_and_(_keep(valid, W, dev))


def _direct_runs(start: torch.Tensor, valid: torch.Tensor, W: int) -> list[tuple[int, int]]:
    """Runs ``(a, b)`` of at least ``_DIRECT_ROWS`` rows a..b-1 that are whole (``W`` valid bytes) and
    follow one another in the buffer: read in place."""
    whole = valid == W
    if int(whole.sum()) < _DIRECT_ROWS:
        return []
    first = whole.clone()
    first[1:] &= ~(whole[:-1] & (start[1:] == start[:-1] + W))
    a = torch.nonzero(first).flatten()
    b = torch.cat([a[1:], torch.tensor([start.numel()])])
    nw = torch.cumsum(whole, 0)
    count = nw[b - 1] - torch.where(a > 0, nw[(a - 1).clamp(min=0)], 0)  # the whole rows that begin the run
    keep = count >= _DIRECT_ROWS
    return list(zip(a[keep].tolist(), (a + count)[keep].tolist()))


def _row_sums(buf: torch.Tensor, start: torch.Tensor, valid: torch.Tensor, R: int, int8: bool) -> torch.Tensor:
    """[rows, 8] residues per row of ``2R`` bytes (row i: the ``valid[i]`` bytes from ``start[i]``, then
    zeros): its eight row-local sums. Long runs of whole consecutive rows go to the matrix product as
    views of ``buf`` (no copy); the other rows are gathered into a scratch block (``_gather``). Each
    product call takes at most ``_chunk_limbs`` limbs of gathered rows, or ``_DIRECT_BYTES`` read in
    place in at most ``_DIRECT_ROWS_MAX`` rows, and is reduced to residues at once, so the
    temporaries stay bounded whatever the buffer."""
    dev = buf.device
    rows = start.numel()
    res = torch.empty(rows, SUMS, dtype=torch.int64, device=dev)
    if rows == 0:
        return res
    W = 2 * R
    step = max(1, _chunk_limbs(dev, int8) // R)
    direct = torch.zeros(rows, dtype=torch.bool)
    piece = max(step, min(_DIRECT_BYTES // W, _DIRECT_ROWS_MAX)) if int8 else step
    for a, b in _direct_runs(start, valid, W):
        direct[a:b] = True
        for a0 in range(a, b, piece):
            b0 = min(b, a0 + piece)
            s0 = int(start[a0])
            res[a0:b0] = _sums_of(buf[s0 : s0 + (b0 - a0) * W].view(b0 - a0, W), R, int8)
    rest = torch.nonzero(~direct).flatten()
    if rest.numel() == rows:  # every row gathered: passes of consecutive rows, no index
        scratch = torch.empty(min(rows, step), W, dtype=torch.uint8, device=dev)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            _gather(scratch[: r1 - r0], buf, start[r0:r1], valid[r0:r1])
            res[r0:r1] = _sums_of(scratch[: r1 - r0], R, int8)
    elif rest.numel():
        scratch = torch.empty(min(rest.numel(), step), W, dtype=torch.uint8, device=dev)
        for r0 in range(0, rest.numel(), step):
            idx = rest[r0 : r0 + step]
            x = scratch[: idx.numel()]
            _gather(x, buf, start[idx], valid[idx])
            res.index_copy_(0, _to_device(idx, dev), _sums_of(x, R, int8))
    return res


def _sums_of(x: torch.Tensor, R: int, int8: bool) -> torch.Tensor:
    """int64 [m, 8] residues mod p of the row-local sums of the rows ``x`` (uint8 [m, 2R], contiguous):
    one matrix product of the bytes as two's-complement values, reduced at once."""
    b = x.view(torch.int8)
    if int8:  # int32 digit sums [m, 40], recombined in int64: |.| < 2**61
        d = torch._int_mm(b, _int8_weights(R, x.device)).to(torch.int64).view(-1, SUMS, DIGITS)
        return (d * _constant("places", x.device, lambda dev: _PLACES.to(dev))).sum(2) % P
    pairs = b.view(x.shape[0], R, 2)
    limbs = pairs[:, :, 1].double().mul_(256).add_(pairs[:, :, 0])  # s(lo) + 256 s(hi)
    m = torch.mm(limbs, _float_weights(R, x.device)).to(torch.int64)  # |.| < R * 2**32 <= 2**47 each
    return (m[:, SUMS:] * 65536 + m[:, :SUMS]) % P  # |hi| * 2**16 < 2**63


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
    ``buf``'s device, in one pass whatever the number of segments (no host sync): about 40 kernels, and a
    matrix product per run of at least 64 whole rows read in place (a segment of many rows not right
    after the one before), per 64 MiB of such a run, and per pass of gathered rows.
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
    return _checksums(buf, offsets, sizes, _use_int8(dev))


def _checksums(buf: torch.Tensor, offsets: list[int], sizes: list[int], int8: bool) -> torch.Tensor:
    """``segment_checksums`` of checked arguments, on the int8 or the float64 path."""
    dev = buf.device
    R = _row_length(sizes)
    off = torch.tensor(offsets, dtype=torch.int64)
    nbytes = torch.tensor(sizes, dtype=torch.int64)
    nrows = -(-nbytes // (2 * R))  # the last row of a segment may be partial (none for an empty segment)
    seg = torch.repeat_interleave(torch.arange(len(sizes)), nrows)
    rin = torch.arange(seg.numel(), dtype=torch.int64) - (torch.cumsum(nrows, 0) - nrows)[seg]
    start = off[seg] + rin * 2 * R
    valid = (nbytes[seg] - rin * 2 * R).clamp(max=2 * R)
    rows = _row_sums(buf, start, valid, R, int8)
    shifts = _row_shifts(rin, R)
    res = _combine(rows, _to_device(seg, dev), _to_device(rin, dev), R, len(sizes), _to_device(nbytes, dev),
                   _to_device(shifts, dev))
    return _encode(res)


def checksum(buf: torch.Tensor) -> torch.Tensor:
    """Checksum of a 1-D uint8 tensor: int64 [WORDS] on the same device (no host sync)."""
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"checksum wants a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    return segment_checksums(buf, [0], [buf.numel()])[0]
