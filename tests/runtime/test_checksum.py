"""The checksum's guarantees (reshardctl/runtime/checksum.py, docs/checksums.md), as properties.

Every test here would fail if a stated guarantee were false: any change of <= 5 16-bit limbs (so any
<= 2-bit flip), any swap of two different blocks of <= 4 limbs, and no miss among the structured
corruption families (sign flips at every position pattern, high-bit flips, swapped words and regions,
zeroed tails, NaN payloads) for fp32, bf16, fp16, fp8 and int dtypes. Many corrupted variants are
checked in one ``segment_checksums`` call (one segment per variant)."""

from __future__ import annotations

import contextlib
import itertools
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.runtime import checksum as checksum_module
from reshardctl.runtime import checksum_rows as rows_module
from reshardctl.runtime.checksum import P, SUM_BYTES, WORDS, checksum, segment_checksums
from helpers.pinned_checksums import PINNED_ARANGE, PINNED_EMPTY


def _buf(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def missed(orig: torch.Tensor, variants: list[torch.Tensor]) -> tuple[int, int]:
    """(variants that really differ from ``orig``, how many of them the checksum does not see)."""
    variants = [v for v in variants if not torch.equal(v, orig)]
    if not variants:
        return 0, 0
    n = orig.numel()
    stride = (n + 7) & ~7
    big = torch.zeros(stride * len(variants), dtype=torch.uint8)
    for k, v in enumerate(variants):
        big[k * stride : k * stride + n] = v
    got = segment_checksums(big, [k * stride for k in range(len(variants))], [n] * len(variants))
    ref = checksum(orig)
    return len(variants), int((got == ref).all(1).sum())


# ---- the value itself --------------------------------------------------------------------------------
def test_shape_and_range():
    c = checksum(_buf(1000))
    assert c.shape == (WORDS,) and c.dtype == torch.int64 and SUM_BYTES == 8 * WORDS
    lo, hi = c & P, c >> 31
    assert bool(((lo < P) & (hi < P) & (c >= 0)).all())


def test_same_value_whatever_the_address_the_segmentation_or_the_row_length():
    b = _buf(200_001, seed=3)
    ref = checksum(b)
    big = torch.zeros(200_100, dtype=torch.uint8)
    big[7:7 + b.numel()] = b
    assert torch.equal(checksum(big[7:7 + b.numel()]), ref)  # unaligned view
    # among many tiny segments (a short row length is chosen) and alone: the same value
    buf = torch.zeros(210_000, dtype=torch.uint8)
    buf[0:200_001] = b
    for k in range(100):
        buf[200_008 + 16 * k : 200_008 + 16 * k + 9] = b[:9]
    sums = segment_checksums(buf, [0] + [200_008 + 16 * k for k in range(100)], [200_001] + [9] * 100)
    assert torch.equal(sums[0], ref)
    assert all(torch.equal(s, checksum(b[:9])) for s in sums[1:])


def test_pinned_values():
    """A fixed input's checksum, pinned: the CPU and CUDA implementations must both give these
    (tests/runtime/test_gpu.py compares CUDA against the same numbers)."""
    assert checksum(torch.arange(256, dtype=torch.uint8).repeat(37)).tolist() == PINNED_ARANGE
    assert checksum(torch.zeros(0, dtype=torch.uint8)).tolist() == PINNED_EMPTY


def test_length_is_mixed_in():
    assert not torch.equal(checksum(torch.zeros(100, dtype=torch.uint8)), checksum(torch.zeros(101, dtype=torch.uint8)))
    assert not torch.equal(checksum(torch.zeros(0, dtype=torch.uint8)), checksum(torch.zeros(2, dtype=torch.uint8)))


# ---- guarantee 1: any change of <= 5 limbs ------------------------------------------------------------
def test_every_pair_of_bit_flips_in_a_buffer_is_caught():
    b = _buf(16, seed=1)
    variants = []
    for i, j in itertools.combinations(range(128), 2):
        v = b.clone()
        v[i // 8] ^= 1 << (i % 8)
        v[j // 8] ^= 1 << (j % 8)
        variants.append(v)
    for i in range(128):
        v = b.clone()
        v[i // 8] ^= 1 << (i % 8)
        variants.append(v)
    checked, miss = missed(b, variants)
    assert checked == 128 * 127 // 2 + 128 and miss == 0


@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=1, max_size=5000),
       changes=st.lists(st.tuples(st.integers(0, 10 ** 7), st.integers(1, 0xFFFF)), min_size=1, max_size=5))
def test_any_change_of_at_most_five_limbs_is_caught(data, changes):
    b = torch.tensor(list(data), dtype=torch.uint8)
    n = b.numel()
    limbs = (n + 1) // 2
    v = b.clone()
    for pos, x in changes:
        k = pos % limbs
        v[2 * k] ^= x & 0xFF
        if 2 * k + 1 < n:
            v[2 * k + 1] ^= x >> 8
    if torch.equal(v, b):
        return
    assert not torch.equal(checksum(v), checksum(b))


@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=2, max_size=4000), bits=st.lists(st.integers(0, 10 ** 7), min_size=1, max_size=2))
def test_any_one_or_two_bit_flips_are_caught(data, bits):
    b = torch.tensor(list(data), dtype=torch.uint8)
    v = b.clone()
    for x in bits:
        x %= 8 * b.numel()
        v[x // 8] ^= 1 << (x % 8)
    if not torch.equal(v, b):
        assert not torch.equal(checksum(v), checksum(b))


# ---- guarantee 2: swaps of two different blocks of <= 4 limbs --------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=16, max_size=4000), a=st.integers(0, 10 ** 7), b=st.integers(0, 10 ** 7),
       limbs=st.integers(1, 4))
def test_any_swap_of_two_different_words_is_caught(data, a, b, limbs):
    t = torch.tensor(list(data), dtype=torch.uint8)
    ln = 2 * limbs
    slots = (t.numel() - ln) // 2 + 1
    i, j = sorted((2 * (a % slots), 2 * (b % slots)))
    if j < i + ln:
        return
    if torch.equal(t[i:i + ln], t[j:j + ln]):
        return
    s = t.clone()
    s[i:i + ln], s[j:j + ln] = t[j:j + ln].clone(), t[i:i + ln].clone()
    assert not torch.equal(checksum(s), checksum(t))


def test_word_swaps_that_defeat_moment_sums_are_caught():
    """y = c * (-1, 3, -3, 1) zeroes three moments of a 4-limb difference: the fourth catches it."""
    t = torch.zeros(64, dtype=torch.int16)
    t[4:8] = torch.tensor([-1, 3, -3, 1]) * 5
    u = t.view(torch.uint8)
    s = u.clone()
    s[8:16], s[40:48] = u[40:48].clone(), u[8:16].clone()
    assert not torch.equal(checksum(s), checksum(u))


# ---- the structured families, per dtype ---------------------------------------------------------------
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8, torch.int32, torch.int64]


def _values(dtype, n: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if kind == "random":
        x = torch.randn(n, generator=g) * 3
    elif kind == "constant":
        x = torch.full((n,), 0.5)
    else:  # "ramp": equal sums in many blocks
        x = torch.arange(n, dtype=torch.float32) % 4
    if dtype.is_floating_point:
        return x.to(dtype)
    return (x * 10).round().to(dtype)


def _families(t: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    n, isz = t.numel(), t.element_size()
    raw = t.view(torch.uint8).reshape(n, isz)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("sign", "high_bit", "swap_word", "swap_region",
                                                        "zero_tail", "nan_payload")}
    top = isz - 1  # byte holding the sign bit (little endian)

    def var(f):
        r = raw.clone()
        f(r)
        return r.reshape(-1)

    patterns = [list(p) for p in itertools.combinations(range(n), 2)]
    patterns += [list(range(s, n, k)) for k in (2, 3, 4, 8) for s in range(k)] + [list(range(n))]
    for p in patterns:
        def flip(r, p=p):
            r[p, top] ^= 0x80
        out["sign"].append(var(flip))
    for i, j in itertools.combinations(range(n), 2):
        for bit in (7, 6):
            def hb(r, i=i, j=j, bit=bit):
                r[i, top] ^= 1 << bit
                r[j, top] ^= 1 << bit
            out["high_bit"].append(var(hb))
        def sw(r, i=i, j=j):
            r[[i, j]] = r[[j, i]].clone()
        out["swap_word"].append(var(sw))
    for ln in (2, 3, 5, 8):
        for i in range(0, n - 2 * ln + 1):
            for j in range(i + ln, n - ln + 1):
                def swr(r, i=i, j=j, ln=ln):
                    a, b = r[i:i + ln].clone(), r[j:j + ln].clone()
                    r[i:i + ln], r[j:j + ln] = b, a
                out["swap_region"].append(var(swr))
    for k in range(1, n + 1):
        def zt(r, k=k):
            r[n - k:] = 0
        out["zero_tail"].append(var(zt))
    if t.dtype.is_floating_point:
        nan = torch.tensor([float("nan")], dtype=torch.float32).to(t.dtype).view(torch.uint8)
        for i in range(n):
            for payload in range(1, 4):
                def nanp(r, i=i, payload=payload):
                    r[i] = nan
                    r[i, 0] ^= payload  # a NaN with another payload (or still NaN: fp8 has one NaN)
                out["nan_payload"].append(var(nanp))
                def nan2(r, i=i):
                    r[i] = nan
                out["nan_payload"].append(var(nan2))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("kind", ["random", "constant", "ramp"])
def test_structured_corruptions_are_all_caught(dtype, kind):
    t = _values(dtype, 24, kind)
    orig = t.view(torch.uint8).reshape(-1)
    total = 0
    for family, variants in _families(t).items():
        checked, miss = missed(orig, variants)
        assert miss == 0, (family, dtype, kind, checked)
        total += checked
    assert total > 500


# ---- the fast implementation against the definition, in plain Python integers ---------------------------
_M64 = (1 << 64) - 1
_LEN_WEIGHTS = (0x2545F4914F6CDD1D % P, 0x9E3779B97F4A7C15 % P, 0xBF58476D1CE4E5B9 % P)
_BASES = (pow(7, 65537, P), pow(7, 1000003, P), pow(7, 999983, P))  # primitive roots of p


def _splitmix(i: int, seed: int) -> int:
    """splitmix64 of ``i`` with the stream ``seed``, reduced to [0, p) (the weights' definition)."""
    x = (i * 0x9E3779B97F4A7C15 + seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return ((x ^ (x >> 31)) & 0x7FFFFFFF) % P


def reference_checksum(data: bytes) -> list[int]:
    """The checksum straight from its definition (module docstring, docs/checksums.md)."""
    n = len(data)
    padded = data + b"\0" * (n % 2)
    x = [int.from_bytes(padded[i : i + 1], "little", signed=True) + 256 * int.from_bytes(padded[i + 1 : i + 2], "little", signed=True)
         for i in range(0, len(padded), 2)]  # signed bytes: x_i = s(lo) + 256 s(hi)
    res = [sum((i + 1) ** m * v for i, v in enumerate(x)) % P for m in range(5)]
    for k in range(3):
        r = sum(_splitmix(i % 64, 1 + k) * pow(_BASES[k], i // 64, P) * v for i, v in enumerate(x))
        res.append((r + n * _LEN_WEIGHTS[k]) % P)
    return [(res[2 * w] << 31) | res[2 * w + 1] for w in range(WORDS)]


def test_reference_matches_the_pinned_value():
    assert reference_checksum(bytes(range(256)) * 37) == PINNED_ARANGE


PATHS = rows_module.paths(torch.device("cpu"))  # every path this machine can run (the compiled ones first)
TORCH_PATHS = [p for p in PATHS if not p.startswith("c-")]


@settings(max_examples=120, deadline=None)
@given(data=st.data(), length=st.integers(1, 6000), shift=st.integers(0, 1), chunk=st.sampled_from([None, 1, 200]),
       cuts=st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 2000)), min_size=1, max_size=70),
       path=st.sampled_from(PATHS), R=st.sampled_from([None, 64, 1024]))
def test_segment_checksums_match_the_definition(data, length, shift, chunk, cuts, path, R):
    """Any even offsets and any sizes (odd, empty, overlapping, up to the buffer's odd end), in a buffer
    at an odd or even address, on every path, in passes of the default size, of one row or of a few
    rows, at the path's row length or another: every segment's value is the definition's. Many segments
    make the rows non-consecutive (the gather path), few the view path; segments that end near the
    buffer's end take the padded tail (the torch paths) or stop at it (the compiled ones)."""
    raw = data.draw(st.binary(min_size=length, max_size=length))
    big = torch.zeros(length + 1, dtype=torch.uint8)
    big[shift : shift + length] = torch.tensor(list(raw), dtype=torch.uint8)
    buf = big[shift : shift + length]
    offsets = [2 * (o % (length // 2 + 1)) for o, _ in cuts]
    sizes = [min(n, length - o) for o, (_, n) in zip(offsets, cuts)]
    rows_at = contextlib.nullcontext() if R is None else mock.patch.object(checksum_module, "row_length",
                                                                              lambda sizes, path: R)
    with _passes_of(chunk), _on_path(path), rows_at:
        got = segment_checksums(buf, offsets, sizes)
    assert got.tolist() == [reference_checksum(raw[o : o + n]) for o, n in zip(offsets, sizes)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("chunk", [None, 1, 5000])
def test_many_packed_regions_match_the_definition(chunk, path):
    """300 packed regions of odd and even sizes (more non-consecutive and partial rows per pass than are
    copied one by one) and a last one to the buffer's odd end, in passes of each size."""
    g = torch.Generator().manual_seed(5)
    sizes = torch.randint(0, 900, (300,), generator=g).tolist()
    offsets = [sum((n + 7) & ~7 for n in sizes[:k]) for k in range(len(sizes) + 1)]
    sizes.append(1001)
    buf = _buf(offsets[-1] + 1001, seed=6)
    with _passes_of(chunk), _on_path(path):
        got = segment_checksums(buf, offsets, sizes)
    raw = bytes(buf.tolist())
    assert got.tolist() == [reference_checksum(raw[o : o + n]) for o, n in zip(offsets, sizes)]


@pytest.mark.parametrize("path", PATHS)
def test_consecutive_partial_rows_match_the_definition(path):
    """300 segments of 1000 bytes at every 1024th byte: their rows (512 limbs) follow one another, so they
    are read as one view, and every row is partial (more than are cleared one by one: their last 24
    bytes cleared by one mask)."""
    buf = _buf(1024 * 300, seed=8)
    offsets, sizes = [1024 * k for k in range(300)], [1000] * 300
    with _on_path(path):
        got = segment_checksums(buf, offsets, sizes)
    raw = bytes(buf.tolist())
    assert got.tolist() == [reference_checksum(raw[o : o + n]) for o, n in zip(offsets, sizes)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 16), lengths=st.lists(st.one_of(st.integers(0, 2_000), st.integers(64 * 128, 24_000)), min_size=1,
                                       max_size=6).filter(lambda ls: max(ls) >= 64 * 128),
       gaps=st.lists(st.sampled_from([0, 8, 136]), min_size=6, max_size=6), chunk=st.sampled_from([None, 64, 3000]),
       path=st.sampled_from(TORCH_PATHS))
def test_rows_read_in_place_match_the_definition(seed, lengths, gaps, chunk, path):
    """Rows of 64 limbs: a segment of >= 64 whole rows goes to the product as a view of the buffer (no
    copy), split at the passes' boundaries on the float64 path; its partial last row, short segments
    and the rest are gathered and put back among them. Every value is the definition's, and runs were
    read in place wherever a segment has 64 whole rows."""
    offsets, pos = [], 0
    for n, gap in zip(lengths, gaps):
        offsets.append(pos)
        pos += (n + gap + 1) & ~1
    buf = _buf(pos + 1, seed)
    raw = bytes(buf.tolist())
    seen = []
    real_runs = rows_module._direct_runs

    def spy(*args):
        runs = real_runs(*args)
        seen.extend(runs)
        return runs

    with _passes_of(chunk), _on_path(path), mock.patch.object(rows_module, "_row_length", lambda sizes: 64), \
            mock.patch.object(rows_module, "_direct_runs", spy):
        got = segment_checksums(buf, offsets, lengths)
    assert got.tolist() == [reference_checksum(raw[o : o + n]) for o, n in zip(offsets, lengths)]
    assert seen  # at least one segment has 64 whole rows
    assert sum(b - a for a, b in seen) >= sum(n // 128 for n in lengths if n // 128 >= rows_module._DIRECT_ROWS)


@pytest.mark.parametrize("R", [64, 4096, checksum_module.ROW])
def test_row_shifts_are_the_powers_they_stand_for(R):
    """The random weights' shift of a row starting at limb ``j R`` of its segment is ``g_k ** (j R / 64)``
    mod p: from two cached tables, for rows far past the first table (1,024 rows) and past the
    second table's size at first use (it grows), checked against Python's ``pow``."""
    checksum_module._pow_tables.pop(R, None)
    small = torch.tensor([0, 1, 2, 1023, 1024, 1025])
    big = torch.tensor([0, 5000, 123_456, 2 ** 20 + 7, 3 * 2 ** 21 - 1])
    for rin in (small, big, small):
        got = checksum_module._row_shifts(rin, R)
        want = [[pow(g, int(j) * (R // 64), P) for g in checksum_module._G] for j in rin]
        assert got.tolist() == want


@pytest.mark.parametrize("path", TORCH_PATHS)
def test_every_product_call_is_bounded_whatever_the_buffer(path):
    """``_row_sums``' promise: each product (and its temporaries) takes at most a pass of gathered rows or
    a capped piece of rows read in place, however long the segment; the values stay the definition's.
    Rows of 64 limbs, a 1 MiB segment (8,192 rows) and a pass of 256 limbs (4 rows): with the in-place
    caps lowered to 512 rows, no call may see more."""
    buf = _buf((1 << 20) + 300, seed=11)
    offsets, sizes = [0, (1 << 20) + 8], [1 << 20, 250]
    seen = []
    real = rows_module._sums_of

    def spy(x, R, path):
        seen.append(x.shape[0])
        return real(x, R, path)
    with _passes_of(256), _on_path(path), mock.patch.object(rows_module, "_row_length", lambda sizes: 64), \
            mock.patch.object(rows_module, "_DIRECT_ROWS_MAX", 512), mock.patch.object(rows_module, "_sums_of", spy):
        got = segment_checksums(buf, offsets, sizes)
    cap = 512 if path == "int8" else 4
    assert seen and max(seen) <= cap and sum(seen) == 8192 + 2  # every row once, none in an unbounded call
    raw = bytes(buf.tolist())
    assert got.tolist() == [reference_checksum(raw[o : o + n]) for o, n in zip(offsets, sizes)]


def _passes_of(limbs: int | None):
    """Limbs per pass of the row sums (None: the default), to check the passes' boundaries on small data."""
    if limbs is None:
        return contextlib.nullcontext()
    return mock.patch.object(rows_module, "_chunk_limbs", lambda device, int8: limbs)


def _on_path(path: str):
    """Row sums on ``path`` on the CPU (checksum_rows.py; every path must give the definition's values)."""
    return mock.patch.object(checksum_module, "path_for", lambda device: path)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "float64"])
@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x80, 0x7F])
def test_every_path_at_the_extremes_of_its_bounds(fill, path):
    """Whole rows of one byte value (every product at its largest magnitude: int8 digits, float64 limbs
    of -32896 or 32639; every sum at its bound for the longest row, 2**15 limbs, on the torch paths'
    row length and the compiled paths' own): each path gives the float64 path's value."""
    buf = torch.full((2 * rows_module.ROW * 3 + 5,), fill, dtype=torch.uint8)
    offs, sizes = [0, 2 * rows_module.ROW, 6], [buf.numel(), 2 * rows_module.ROW + 5, 2 * rows_module.ROW]
    with _on_path("float64"):
        slow = segment_checksums(buf, offs, sizes)
    for R in (None, rows_module.ROW):
        at = contextlib.nullcontext() if R is None else mock.patch.object(checksum_module, "row_length",
                                                                          lambda sizes, path: R)
        with _on_path(path), at:
            assert torch.equal(segment_checksums(buf, offs, sizes), slow), (path, R)


def test_int8_digits_stay_in_the_bounds_the_module_states():
    """The arithmetic behind the int8 path's exactness (checksum.py): every weight digit is in [-64, 63],
    the five digits give back a value in (-p/2, p/2] congruent to the byte's weight (``w`` for a limb's
    low byte, ``256 w`` for its high byte), and so no product of a data byte (its two's-complement value
    in [-128, 127], or shifted to [0, 255] on a u8 x s8 kernel) and a digit passes 2**13 in magnitude, no
    pair of u8 x s8 products passes int16, and no row sum passes 2**29 (int32)."""
    mat = rows_module._int8_table()
    d = mat.to(torch.int64).view(-1, rows_module.SUMS, rows_module.DIGITS)
    assert int(d.min()) >= -64 and int(d.max()) <= 63
    v = (d * torch.tensor([128 ** k for k in range(rows_module.DIGITS)])).sum(2)
    assert bool((v.abs() <= P // 2).all())
    w = rows_module._table()
    assert torch.equal(v[0::2] % P, w) and torch.equal(v[1::2] % P, w * 256 % P)
    top = int(d.abs().max())
    assert 128 * top <= 2 ** 13 and 2 * 255 * top < 2 ** 15
    assert 2 * rows_module.ROW * 128 * top <= 2 ** 29


@pytest.mark.parametrize("offsets, sizes", [([0, 3], [2, 2]), ([-2], [2]), ([0], [-1]), ([4], [6]), ([0, 8], [2, 2])])
def test_segments_off_even_offsets_or_outside_the_buffer_are_refused(offsets, sizes):
    buf = torch.zeros(9, dtype=torch.uint8)
    with pytest.raises(ValueError, match="even offsets inside the buffer"):
        segment_checksums(buf, offsets, sizes)
    segment_checksums(buf, [0, 4, 8], [4, 5, 1])  # up to the buffer's odd end: accepted
