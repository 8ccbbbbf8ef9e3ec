"""How one (sender -> receiver) list of regions travels: at most four messages, from the plan alone.

A link (the regions one rank sends another in one step) is split by where each region is one
contiguous byte range of a box: on both sides, on the sender only, on the receiver only, on neither
(``split_link``); each non-empty class is ONE message, its regions back to back in plan order,
row-major inside each box. Both ends compute the split from the plan and both sides' holdings
(looked up tensor by tensor), so every message size agrees without talking (gloo aborts the process
on a size mismatch, NCCL hangs). Each end then decides alone how a message meets its memory: where
its regions lie back to back in its arena (``arena.py`` orders a rank's boxes as its program first
uses them, message by message, so whole boxes usually do), it is sent from / received into that range
directly (zero copy); otherwise it goes through a staging block (span_copy.py: one indexed copy, or
one strided copy per run of alike regions; region by region only where a region spans boxes). Messages
(and checksums, one per message) grow with peers and steps, not with tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from reshardctl.errors import TransferError
from reshardctl.layout.indexset import intersect_boxes
from reshardctl.layout.placement import Box, box_numel
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.schedule import Region
from reshardctl.runtime.local_weights import norm_box


def align8(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class Layout:
    """A bucket's layout: every item at an 8-byte aligned offset, then ``trailer`` (checksums)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    trailer: int
    size: int

    @property
    def payload(self) -> int:
        return sum(self.sizes)


def layout_of(sizes: Sequence[int], trailer_bytes_per_item: int = 0) -> Layout:
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off = align8(off + n)
    return Layout(tuple(offsets), tuple(sizes), off, off + trailer_bytes_per_item * len(sizes))


def link_offsets(model: ModelSpec, regions: Sequence[Region], numel=box_numel) -> tuple[tuple[int, ...], int]:
    """Each region's offset in the link's message (back to back) and the message size; checks every
    region's byte count against its box first (a plan from elsewhere could say otherwise).
    ``numel``: a (memoised) ``box_numel``."""
    offsets, off = [], 0
    for r in regions:
        t = model.tensors[r.tensor]
        want = numel(r.box) * t.itemsize
        if r.nbytes != want or len(r.box) != len(t.shape):
            raise TransferError(
                f"plan region of {t.name} {r.box}: nbytes {r.nbytes} but the box holds {want} bytes"
                f" ({box_numel(r.box)} x {t.itemsize})"
            )
        offsets.append(off)
        off += r.nbytes
    return tuple(offsets), off


def contiguous_span(boxes: Sequence[Box], box: Box, itemsize: int) -> tuple[int, int] | None:
    """(local box number, byte offset) where ``box`` is one contiguous byte range of one of ``boxes``
    (row-major local tensors), else None."""
    nb = norm_box(box)
    for k, lb in enumerate(boxes):
        lbn = norm_box(lb)
        if len(lbn) != len(nb) or not all(l0 <= a and b <= l1 for (a, b), (l0, l1) in zip(nb, lbn)):
            continue
        shape = [l1 - l0 for l0, l1 in lbn]
        ext = [b - a for a, b in nb]
        d = len(shape) - 1
        while d > 0 and ext[d] == shape[d]:
            d -= 1
        if any(ext[j] != 1 for j in range(d)):
            return None
        off = 0
        for j, (a, _) in enumerate(nb):
            off = off * shape[j] + (a - lbn[j][0])
        return k, off * itemsize
    return None


def split_link(model: ModelSpec, regions: Sequence[Region], src_boxes: Callable[[int], Sequence[Box]],
               dst_boxes: Callable[[int], Sequence[Box]], contiguous=None) -> list[tuple[Region, ...]]:
    """The link's messages: its regions by class (contiguous in a box on both sides, sender only,
    receiver only, neither), plan order kept inside a class; empty classes dropped.
    ``contiguous(boxes, box, itemsize) -> bool``: a (memoised) test, by default ``contiguous_span``."""
    if contiguous is None:
        contiguous = lambda bx, box, isz: contiguous_span(bx, box, isz) is not None  # noqa: E731
    classes: list[list[Region]] = [[], [], [], []]
    for r in regions:
        isz = model.tensors[r.tensor].itemsize
        a = contiguous(src_boxes(r.tensor), r.box, isz)
        b = contiguous(dst_boxes(r.tensor), r.box, isz)
        classes[(0 if b else 1) if a else (2 if b else 3)].append(r)
    return [tuple(c) for c in classes if c]


def first_box(boxes: Sequence[Box], box: Box) -> int | None:
    """The first of ``boxes`` that overlaps ``box`` (where a region's bytes first land)."""
    nb = norm_box(box)
    for k, lb in enumerate(boxes):
        if intersect_boxes(norm_box(lb), nb) is not None:
            return k
    return None


def place(model: ModelSpec, boxes: Mapping[int, Sequence[Box]], box_offset: Mapping[tuple[int, int], int],
          regions: Sequence[Region], offsets: Sequence[int]) -> int | None:
    """Where a link's regions lie back to back in one flat buffer whose boxes start at ``box_offset``
    (an arena, a bucket): the offset of the message's first byte, else None (copy through staging)."""
    start = None
    for r, o in zip(regions, offsets):
        span = contiguous_span(boxes.get(r.tensor, ()), r.box, model.tensors[r.tensor].itemsize)
        if span is None:
            return None
        at = box_offset[(r.tensor, span[0])] + span[1]
        if start is None:
            start = at - o
        elif at != start + o:
            return None
    return start
