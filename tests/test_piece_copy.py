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
       bad=st.data())
def test_a_wrong_copy_is_caught_and_names_its_piece(shapes, bad):
    tensors = [torch.randint(0, 256, s, dtype=torch.uint8) for s in shapes]
    block = torch.zeros(sum(r * 2 for r, _ in shapes), dtype=torch.uint8)
    pieces = _pieces(tensors, block)
    booked = []
    copy_checked(pieces, lambda flags, what: booked.append((flags, what)), "bucket 3")
    (flags, what), = booked
    assert not flags.any()  # a right copy
    assert all(torch.equal(d, s) for d, s in zip(pieces.dst, pieces.src))
    k = bad.draw(st.integers(0, len(tensors) - 1))
    real = piece_copy.copy_pieces

    def faulty(p):  # a copy that lands one byte wrong (what a real system cannot do on demand)
        real(p)
        p.dst[k].view(-1)[-1] ^= 0x10
    piece_copy.copy_pieces = faulty
    try:
        booked.clear()
        copy_checked(pieces, lambda flags, what: booked.append((flags, what)), "bucket 3")
    finally:
        piece_copy.copy_pieces = real
    (flags, what), = booked
    assert flags.tolist() == [i == k for i in range(len(tensors))]
    assert what[k]() == f"bucket 3: t{k}[:, 1:3] copy"


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
