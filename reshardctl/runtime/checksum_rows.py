"""The checksum's row sums: every path that computes them, each exact (checksum.py, docs/checksums.md).

A row is a window of ``2R`` bytes of the buffer (``R <= ROW`` limbs, a power of two, at least
``GRAIN``): the ``valid`` bytes from ``start``, then zero bytes. Its eight row-local sums are
``sum_t x_t * w_k(t)`` mod ``p`` over its limbs ``x_t = s(b_2t) + 256 s(b_2t+1)``, with the fixed table
``w`` (``_table``: ``(t+1)**m`` for the moments, ``t_k[t mod 64] * g_k**(t div 64)`` for the random
sums). checksum.py shifts them to the row's place and adds them up per segment.

Paths (``row_sums(buf, start, valid, R, path)``), all giving the same residues bit for bit:

* ``c-avx2``, ``c-base``: the compiled kernel (_rowsums.c, built at install where a C compiler is
  found): the limbs times float64 weights, at most 64 products per vector lane summed exactly in
  float64 (every partial sum an integer below ``2**53``), read where they lie (no gather, no padding
  copied); ``c-avx2`` 4 limbs per FMA vector where the CPU has AVX2 and FMA, ``c-base`` 2 per vector.
* ``int8``: ``torch._int_mm`` of the rows' bytes with the weights in five base-128 digits per byte.
* ``float64``: ``torch.mm`` of the limbs with the weights in 16-bit halves (the only path on CUDA).

Which path a CPU process takes is measured on the machine (checksum_choice.py), never assumed from
which instructions exist: the int8 path ran at 2.3 GB/s on a CPU with AVX-512 VNNI and at 58 MB/s on
one with AVX2 only.
"""

from __future__ import annotations

from collections import Counter

import torch

from reshardctl.runtime.dtypes import signed64

try:  # the compiled kernel, where the install built it (setup.py: optional)
    from reshardctl.runtime import _rowsums
except ImportError:  # pragma: no cover - a machine without a C compiler at install time
    _rowsums = None

P = (1 << 31) - 1
MOMENTS = 5
RANDOM = 3
SUMS = MOMENTS + RANDOM
ROW = 1 << 15  # limbs per row at most (the bounds in checksum.py)
GRAIN = 64  # limbs per random-weight block: r_k(i) = t_k[i % GRAIN] * g_k**(i // GRAIN)
_G = tuple(pow(7, e, P) for e in (65537, 1000003, 999983))  # 7 is a primitive root of p; e coprime to p - 1
DIGITS = 5  # balanced base-128 digits per weight (the int8 path)
C_ROW = 1 << 12  # limbs per row on the compiled paths: an [8, R] float64 table of 256 KiB stays in L2
TORCH_PATHS = ("int8", "float64")
ALL_PATHS = ("c-avx2", "c-base") + TORCH_PATHS  # every path on some machine


def compiled_variants() -> tuple[str, ...]:
    """The compiled paths this process can run (``c-avx2`` first where the CPU has AVX2 and FMA)."""
    return tuple(f"c-{v}" for v in _rowsums.variants()) if _rowsums is not None else ()


def paths(device: torch.device) -> tuple[str, ...]:
    """Every path that can run on ``device``: CUDA has the float64 path only."""
    if device.type != "cpu":
        return ("float64",)
    return compiled_variants() + (("int8",) if hasattr(torch, "_int_mm") else ()) + ("float64",)


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


def row_length(sizes: list[int], path: str) -> int:
    """Limbs per row for segments of these byte ``sizes`` on ``path`` (the value does not depend on it):
    ``C_ROW`` on the compiled paths (they never read or sum the padding), else ``_row_length``."""
    return C_ROW if path.startswith("c-") else _row_length(sizes)


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



def windows(offsets: list[int], sizes: list[int], R: int):
    """The rows of segments (byte ``offsets``, ``sizes``) cut at ``R`` limbs, as int64 CPU tensors:
    ``start``, ``valid`` (bytes; a segment's last row may be partial, an empty segment has none), and
    per row its segment ``seg`` and its index in it ``rin``."""
    off = torch.tensor(offsets, dtype=torch.int64)
    nbytes = torch.tensor(sizes, dtype=torch.int64)
    nrows = -(-nbytes // (2 * R))
    seg = torch.repeat_interleave(torch.arange(len(sizes)), nrows)
    rin = torch.arange(seg.numel(), dtype=torch.int64) - (torch.cumsum(nrows, 0) - nrows)[seg]
    return off[seg] + rin * 2 * R, (nbytes[seg] - rin * 2 * R).clamp(max=2 * R), seg, rin


def row_sums(buf: torch.Tensor, start: torch.Tensor, valid: torch.Tensor, R: int, path: str) -> torch.Tensor:
    """int64 [rows, 8]: the residues of each row's eight row-local sums (row i: the ``valid[i]`` bytes of
    the contiguous uint8 ``buf`` from ``start[i]``, zero padded to ``2R``; int64 CPU tensors), on
    ``path`` (one of ``paths(buf.device)``)."""
    if path.startswith("c-"):
        return _compiled_row_sums(buf, start, valid, R, path[2:])
    if path not in TORCH_PATHS:
        raise ValueError(f"unknown checksum path {path!r}: one of {', '.join(paths(buf.device))}")
    return _row_sums(buf, start, valid, R, path == "int8")


def _compiled_row_sums(buf: torch.Tensor, start: torch.Tensor, valid: torch.Tensor, R: int,
                       variant: str) -> torch.Tensor:
    """The compiled kernel (_rowsums.c) on the CPU, reading every row where it lies; it checks every
    window against the buffer before it reads any."""
    if _rowsums is None:
        raise ValueError("the compiled checksum kernel was not built at install (no C compiler?)")
    if buf.device.type != "cpu" or buf.dtype != torch.uint8 or not buf.is_contiguous():
        raise ValueError(f"the compiled checksum kernel reads a contiguous uint8 CPU buffer, not {buf.dtype} "
                         f"on {buf.device}")
    w = _constant(("c", R), buf.device, lambda dev: _table()[:R].double().t().contiguous())  # [8, R]
    start, valid = start.contiguous(), valid.contiguous()
    out = torch.empty(start.numel(), SUMS, dtype=torch.int64)
    _rowsums.row_sums(buf.data_ptr(), buf.numel(), start.data_ptr(), valid.data_ptr(), start.numel(), R,
                      w.data_ptr(), out.data_ptr(), variant)
    return out
