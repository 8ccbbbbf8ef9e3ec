"""A gather-and-broadcast bucket's bytes: every full tensor at an 8-byte aligned offset, then one
checksum per tensor (``SUM_BYTES``, checksum.py), written by the root and checked by every receiver."""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from reshardctl.layout.placement import Box, full_box
from reshardctl.models.spec import ModelSpec
from reshardctl.runtime.checksum import SUM_BYTES, WORDS, segment_checksums
from reshardctl.runtime.local_weights import byte_shape, byte_slices, norm_box
from reshardctl.runtime.wire import Layout, layout_of


def bucket_layout(model: ModelSpec, tensors: Sequence[int]) -> Layout:
    return layout_of([model.tensors[i].nbytes for i in tensors], SUM_BYTES)


def bucket_tensor_view(model: ModelSpec, index: int, layout: Layout, pos: int, buf: torch.Tensor) -> torch.Tensor:
    """The uint8 byte view (full shape, last dim in bytes) of the ``pos``-th tensor of a bucket."""
    t = model.tensors[index]
    off = layout.offsets[pos]
    return buf[off : off + t.nbytes].view(byte_shape(full_box(t.shape), t.itemsize))


def box_bytes_in(full_view: torch.Tensor, box: Box, itemsize: int) -> torch.Tensor:
    """``box`` of a full-tensor byte view."""
    nb = norm_box(box)
    return full_view[byte_slices(nb, tuple((0, 0) for _ in nb), itemsize)]


def item_checksums(layout: Layout, buf: torch.Tensor, items=None) -> torch.Tensor:
    """Checksums [len, WORDS] of the layout's items (all, or those numbered in ``items``), one pass."""
    if items is None:
        return segment_checksums(buf, layout.offsets, layout.sizes)
    return segment_checksums(buf, list(map(layout.offsets.__getitem__, items)), list(map(layout.sizes.__getitem__, items)))


def trailer_view(layout: Layout, buf: torch.Tensor) -> torch.Tensor:
    """The trailer as int64 [items, WORDS]."""
    return buf[layout.trailer : layout.size].view(torch.int64).view(-1, WORDS)


def write_trailer(buf: torch.Tensor, layout: Layout, sums: torch.Tensor) -> None:
    """The items' checksums into the trailer; the alignment padding zeroed (deterministic wire bytes) in
    one indexed fill, whatever the number of items."""
    if not len(layout.sizes):
        return
    pad = _padding(layout, buf.device)
    if pad.numel():
        buf.index_fill_(0, pad, 0)
    trailer_view(layout, buf).copy_(sums)


@functools.lru_cache(maxsize=256)
def _padding(layout: Layout, device: torch.device) -> torch.Tensor:
    """The positions of every alignment padding byte before the trailer (int64, on ``device``): built
    once per bucket layout (a bucket is the same at every refit)."""
    nxt = layout.offsets[1:] + (layout.trailer,)
    idx = [b for off, n, x in zip(layout.offsets, layout.sizes, nxt) for b in range(off + n, x)]
    return torch.tensor(idx, dtype=torch.int64).to(device)


class BucketTarget:
    """A bucket at its root, seen like LocalWeights: every tensor of the bucket is one full box.
    ``data`` is the pool block the bucket lies in: what its views hold (piece_copy.py keys its views by
    it, as by a LocalWeights' tensors)."""

    def __init__(self, model: ModelSpec, lay: Layout, pos: dict[int, int], buf: torch.Tensor, block: torch.Tensor):
        self.model, self.lay, self.pos, self.buf = model, lay, pos, buf
        self.arena = buf
        self.data = block

    def piece_views(self, index: int, box: Box, seg: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[(``seg`` shaped like the box, the box's bytes in the bucket)], as ``LocalWeights.piece_views``."""
        t = self.model.tensors[index]
        there = box_bytes_in(bucket_tensor_view(self.model, index, self.lay, self.pos[index], self.buf), box, t.itemsize)
        return [(seg.view(there.shape), there)]
