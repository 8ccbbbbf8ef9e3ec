"""Piece copies (runtime/piece_copy.py): views built once and reused only while their tensors are the
same, copies in one ``_foreach_copy_``, and a copy that went wrong is caught and named."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from reshardctl.runtime import piece_copy
from reshardctl.runtime.piece_copy import PieceViews, Pieces, copy_checked


def _pieces(src_tensors, block):
    """Column slices of every source tensor, packed back to back in ``block``."""
    dst, src, names, off = [], [], [], 0
    for k, t in enumerate(src_tensors):
        s = t[:, 1:3]
        n = s.numel()
        dst.append(block[off : off + n].view(s.shape))
        src.append(s)
        names.append(lambda k=k: f"t{k}[:, 1:3]")
        off += n
    return Pieces(dst, src, names)


@settings(max_examples=30, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(3, 9)), min_size=1, max_size=6),
       mode=st.sampled_from(["keep", "keep-in-runs", "keep-without-foreach-max", "consume",
                             "consume-without-foreach-max"]), bad=st.data())
def test_a_wrong_copy_is_caught_and_names_its_piece(shapes, mode, bad):
    """Every mode of the comparison: the source kept (a bucket root's own pieces: the differences into
    transient tensors, in one run or, with a small limit, in runs of a few pieces), the source consumed
    (a bucket member's buffer: _foreach_sub_ then _foreach_max), and both on a torch without
    _foreach_max (one ne/any per piece)."""
    consume = mode.startswith("consume")
    k = bad.draw(st.integers(0, len(shapes) - 1))
    real_copy, real_max, real_limit = piece_copy.copy_pieces, piece_copy._FOREACH_MAX, piece_copy.COMPARE_BYTES
    if mode.endswith("without-foreach-max"):
        piece_copy._FOREACH_MAX = None
    if mode == "keep-in-runs":
        piece_copy.COMPARE_BYTES = bad.draw(st.integers(1, 20))
    try:
        for wrong in (False, True):
            tensors = [torch.randint(0, 256, s, dtype=torch.uint8) for s in shapes]
            want = [t[:, 1:3].clone() for t in tensors]
            block = torch.zeros(sum(r * 2 for r, _ in shapes), dtype=torch.uint8)
            pieces = _pieces(tensors, block)

            def faulty(p):  # a copy that lands one byte wrong (what a real system cannot do on demand)
                real_copy(p)
                p.dst[k].view(-1)[-1] ^= 0x10
            piece_copy.copy_pieces = faulty if wrong else real_copy
            booked = []
            copy_checked(pieces, lambda flags, what: booked.append((flags, what)), "bucket 3", consume_source=consume)
            (flags, what), = booked
            if not wrong:
                assert not flags.any()  # a right copy
                assert all(torch.equal(d, w) for d, w in zip(pieces.dst, want))
            else:
                assert flags.tolist() == [i == k for i in range(len(tensors))]
                assert what[k]() == f"bucket 3: t{k}[:, 1:3] copy"
            if not consume:
                assert all(torch.equal(s, w) for s, w in zip(pieces.src, want))  # the source untouched
    finally:
        piece_copy.copy_pieces, piece_copy._FOREACH_MAX, piece_copy.COMPARE_BYTES = real_copy, real_max, real_limit


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30), limit=st.integers(1, 120))
def test_runs_cover_every_piece_once_within_the_limit(sizes, limit):
    """``Pieces.runs``: consecutive, covering every piece exactly once, each run within ``limit`` bytes
    unless it is one larger piece, and no run could take the next piece too."""
    dst = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    runs = Pieces(dst, dst).runs(limit)
    assert [a for a, _ in runs] == [0] + [b for _, b in runs[:-1]] and runs[-1][1] == len(sizes)
    for i, (a, b) in enumerate(runs):
        total = sum(sizes[a:b])
        assert total <= limit or b == a + 1
        if i + 1 < len(runs):
            assert total + sizes[b] > limit


def test_views_are_reused_only_for_the_same_weights_and_buffer():
    views = PieceViews()
    built = []

    def build():
        built.append(1)
        return Pieces([], [])
    a, b, c = {}, {}, {}
    blk = torch.zeros(8, dtype=torch.uint8)
    first = views.get("m", a, blk, 0, build)
    assert views.get("m", a, blk, 0, build) is first and len(built) == 1
    views.get("m", a, blk, 8, build)  # another offset: other views
    assert len(built) == 2
    views.get("m", b, blk, 0, build)  # the other weight copy (staged and current alternate)
    views.get("m", a, blk, 0, build)
    assert len(built) == 4  # only two kept: b and (a, 8) pushed (a, 0) out
    views.get("m", b, blk, 0, build)
    views.get("m", a, blk, 0, build)
    assert len(built) == 4  # a and b alternating: both kept
    views.get("m", c, blk, 0, build)
    assert len(built) == 5
    blk2 = torch.zeros(8, dtype=torch.uint8)
    views.get("m", a, blk2, 0, build)  # another block (the pool's): other views
    assert len(built) == 6
    views.drop()
    views.get("m", a, blk2, 0, build)
    assert len(built) == 7


def test_views_of_a_dead_buffer_are_not_reused():
    views = PieceViews()
    built = []

    def build():
        built.append(1)
        return Pieces([], [])
    a = {}
    blk = torch.zeros(8, dtype=torch.uint8)
    views.get("m", a, blk, 0, build)
    del blk
    views.get("m", a, torch.zeros(8, dtype=torch.uint8), 0, build)  # may even get the same id
    assert len(built) == 2


def _split(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    edges = sorted({0, n, *(c for c in cuts if 0 < c < n)})
    return list(zip(edges, edges[1:]))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_message_pieces_move_every_region_byte_exact(data):
    """A message of regions of two tensors, each held as boxes split along columns on the sending side
    and along rows on the receiving side (regions span several boxes): packed with one
    ``_foreach_copy_`` and landed with another, every region's bytes arrive and nothing else is written."""
    from helpers.runtime_plans import model as hand_model

    from reshardctl.layout.placement import box_shape
    from reshardctl.runtime.local_weights import LocalWeights, byte_view
    from reshardctl.runtime.piece_copy import copy_pieces, message_pieces

    dtypes = data.draw(st.lists(st.sampled_from(["bfloat16", "float32", "int8", "float64"]), min_size=2, max_size=2))
    shapes = [(data.draw(st.integers(1, 7)), data.draw(st.integers(1, 9))) for _ in dtypes]
    m = hand_model([(f"t{k}", s, d) for k, (s, d) in enumerate(zip(shapes, dtypes))])
    full = [torch.randint(0, 256, (r, c * m.tensors[k].itemsize), dtype=torch.uint8) for k, (r, c) in enumerate(shapes)]
    src_hold, dst_hold, src_data, dst_data = {}, {}, {}, {}
    for k, (r, c) in enumerate(shapes):
        cols = _split(c, data.draw(st.lists(st.integers(1, 8), max_size=3)))
        rows = _split(r, data.draw(st.lists(st.integers(1, 6), max_size=3)))
        src_hold[k] = tuple(((0, r), cc) for cc in cols)
        dst_hold[k] = tuple((rr, (0, c)) for rr in rows)
        isz = m.tensors[k].itemsize
        src_data[k] = [full[k][:, a * isz : b * isz].contiguous().view(torch.uint8).view(m.tensors[k].shape[0], -1)
                       .view(_dt(dtypes[k])) for _, (a, b) in src_hold[k]]
        dst_data[k] = [torch.zeros(box_shape(b), dtype=_dt(dtypes[k])) for b in dst_hold[k]]
    src = LocalWeights(m, src_hold, src_data)
    dst = LocalWeights(m, dst_hold, dst_data)
    items, off = [], 0
    for k, (r, c) in enumerate(shapes):
        r0, r1 = sorted(data.draw(st.lists(st.integers(0, r), min_size=2, max_size=2)))
        c0, c1 = sorted(data.draw(st.lists(st.integers(0, c), min_size=2, max_size=2)))
        if r0 == r1 or c0 == c1:
            continue
        n = (r1 - r0) * (c1 - c0) * m.tensors[k].itemsize
        items.append((k, ((r0, r1), (c0, c1)), off, n))
        off = (off + n + 7) // 8 * 8
    buf = torch.zeros(max(off, 8), dtype=torch.uint8)
    copy_pieces(message_pieces(src, items, buf, send=True))
    for k, box, o, n in items:
        (r0, r1), (c0, c1) = box
        isz = m.tensors[k].itemsize
        assert torch.equal(buf[o : o + n], full[k][r0:r1, c0 * isz : c1 * isz].reshape(-1))
    copy_pieces(message_pieces(dst, items, buf, send=False))
    for k, (r, c) in enumerate(shapes):
        isz = m.tensors[k].itemsize
        want = torch.zeros_like(full[k])
        for kk, ((r0, r1), (c0, c1)), _, _ in items:
            if kk == k:
                want[r0:r1, c0 * isz : c1 * isz] = full[k][r0:r1, c0 * isz : c1 * isz]
        got = torch.cat([byte_view(t) for t in dst_data[k]], 0)
        assert torch.equal(got, want)


def _dt(name: str) -> torch.dtype:
    return getattr(torch, name)


def test_the_pool_freeing_a_block_drops_the_views_of_it():
    """The executor registers ``PieceViews.drop`` with its pool: views of a block the pool frees are
    built anew, never kept (they would keep the freed block's memory)."""
    from reshardctl.runtime.buffer_pool import BufferPool

    pool = BufferPool(torch.device("cpu"), limit_bytes=1 << 20)
    views = PieceViews()
    pool.notify_on_free(views.drop)
    built = []

    def build():
        built.append(1)
        return Pieces([block[:16]], [torch.zeros(16, dtype=torch.uint8)])
    data = {}
    block = pool.acquire(600 << 10)
    views.get("m", data, block, 0, build)
    pool.release(block)
    views.get("m", data, block, 0, build)
    assert len(built) == 1  # the block is the pool's still: its views kept
    pool.acquire(700 << 10)  # over the limit: the pool frees the 600 KiB block
    assert views._steps == {}
