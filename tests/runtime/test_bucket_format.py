"""A bucket's bytes (runtime/bucket_format.py): the trailer written after the items, every alignment
padding byte zeroed (the wire bytes are deterministic), no payload byte touched."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.runtime.bucket_format import item_checksums, trailer_view, write_trailer
from reshardctl.runtime.checksum import SUM_BYTES
from reshardctl.runtime.wire import layout_of


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 70), min_size=1, max_size=40), seed=st.integers(0, 1000))
def test_trailer_and_zeroed_padding_leave_every_payload_byte(sizes, seed):
    lay = layout_of(sizes, SUM_BYTES)
    g = torch.Generator().manual_seed(seed)
    buf = torch.randint(0, 256, (lay.size,), dtype=torch.uint8, generator=g)
    before = buf.clone()
    sums = item_checksums(lay, buf)
    write_trailer(buf, lay, sums)
    payload = torch.zeros(lay.size, dtype=torch.bool)
    for off, n in zip(lay.offsets, lay.sizes):
        payload[off : off + n] = True
    trailer = torch.zeros(lay.size, dtype=torch.bool)
    trailer[lay.trailer :] = True
    assert torch.equal(buf[payload], before[payload])
    assert bool((buf[~payload & ~trailer] == 0).all())
    assert torch.equal(trailer_view(lay, buf), sums)
    buf[~payload] = 0xA5  # the next refit's bucket, its padding dirty again: the cached positions serve it
    write_trailer(buf, lay, sums)
    assert torch.equal(buf[payload], before[payload]) and bool((buf[~payload & ~trailer] == 0).all())
    assert torch.equal(trailer_view(lay, buf), sums)
