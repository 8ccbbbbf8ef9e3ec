"""Packing regions into one contiguous byte message per peer, and back.

Message layout (computed from the plan alone, identically on both sides):
every region starts at an 8-byte aligned offset (row-major bytes of its box), then an 8-byte aligned
trailer with one checksum (``SUM_BYTES``, checksum.py) per region. Bucket layout (gather-and-broadcast):
every full tensor at an 8-byte aligned offset, then one checksum per tensor.

Copies go through uint8 views of the local box tensors, so any dtype, any alignment and any box
works; torch turns them into row-wise memcpy.

Zero copy (``Wire``): a region of at least ``DIRECT_MIN_BYTES`` that is one contiguous byte range of the
sender's local box (or of the receiver's) travels as its own message, sent straight from the box tensor
and/or received straight into it; the other regions of the same peer are still coalesced into one packed
message. The split is a function of the plan (regions + both sides' holdings) alone, so both ends agree
on every message and its size without talking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from reshardctl.errors import TransferError
from reshardctl.layout.indexset import intersect_boxes
from reshardctl.layout.placement import Box, box_numel, box_shape, full_box, norm_box
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.schedule import Region
from reshardctl.runtime.checksum import SUM_BYTES, WORDS, segment_checksums


def align8(n: int) -> int:
    return (n + 7) & ~7


_norm = norm_box  # a 0-d tensor's box () as ((0, 1),)
_intersect = intersect_boxes  # the layout algebra's box overlap (None when empty)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """uint8 view of a tensor whose last dim is contiguous: shape (..., last * itemsize)."""
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8)


def _byte_slices(inner: Box, origin: Box, itemsize: int) -> tuple[slice, ...]:
    sl = [slice(a - o, b - o) for (a, b), (o, _) in zip(inner, origin)]
    last = sl[-1]
    sl[-1] = slice(last.start * itemsize, last.stop * itemsize)
    return tuple(sl)


def _byte_shape(box: Box, itemsize: int) -> tuple[int, ...]:
    shape = list(box_shape(_norm(box)))
    shape[-1] *= itemsize
    return tuple(shape)


@dataclass(frozen=True)
class Layout:
    offsets: tuple[int, ...]  # start of every item
    sizes: tuple[int, ...]  # bytes of every item
    trailer: int  # offset of the checksums (SUM_BYTES per item)
    size: int  # total message bytes

    @property
    def payload(self) -> int:
        return sum(self.sizes)


def layout_of(sizes: Sequence[int]) -> Layout:
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off = align8(off + n)
    return Layout(tuple(offsets), tuple(sizes), off, off + SUM_BYTES * len(sizes))


def message_layout(model: ModelSpec, regions: Sequence[Region]) -> Layout:
    """The byte layout of one message; checks every region's size against its box first."""
    for r in regions:
        t = model.tensors[r.tensor]
        want = box_numel(r.box) * t.itemsize
        if r.nbytes != want or len(r.box) != len(t.shape):
            raise TransferError(
                f"plan region of {t.name} {r.box}: nbytes {r.nbytes} but the box holds {want} bytes"
                f" ({box_numel(r.box)} x {t.itemsize})"
            )
    return layout_of([r.nbytes for r in regions])


def bucket_layout(model: ModelSpec, tensors: Sequence[int]) -> Layout:
    return layout_of([model.tensors[i].nbytes for i in tensors])


DIRECT_MIN_BYTES = 64 << 10  # smaller regions are coalesced into the packed message (64 KiB: measured best on gloo)

Span = tuple[int, int]  # (local box number, byte offset of the region inside that box's tensor)


def contiguous_span(boxes: Sequence[Box], box: Box, itemsize: int) -> Span | None:
    """Where ``box`` is one contiguous byte range of one of ``boxes`` (row-major local tensors), else None."""
    nb = _norm(box)
    for k, lb in enumerate(boxes):
        lbn = _norm(lb)
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


@dataclass(frozen=True)
class Wire:
    """How one (sender -> receiver) region list travels: ``packed`` regions (indices) coalesced in one
    message laid out by ``layout`` (no trailer; ``packed_size`` bytes), then every ``direct`` region as its
    own message of exactly ``nbytes``, in region order. ``src``/``dst``: contiguous spans per region."""

    packed: tuple[int, ...]
    layout: Layout
    direct: tuple[int, ...]
    src: tuple[Span | None, ...]
    dst: tuple[Span | None, ...]

    @property
    def packed_size(self) -> int:
        return self.layout.trailer

    def message_sizes(self, regions: Sequence[Region]) -> list[int]:
        return ([self.packed_size] if self.packed else []) + [regions[j].nbytes for j in self.direct]


def wire_of(model: ModelSpec, regions: Sequence[Region], src_boxes: Mapping[int, Sequence[Box]],
            dst_boxes: Mapping[int, Sequence[Box]], direct_min: int = DIRECT_MIN_BYTES) -> Wire:
    message_layout(model, regions)  # size checks
    src, dst, packed, direct = [], [], [], []
    for j, r in enumerate(regions):
        isz = model.tensors[r.tensor].itemsize
        a = contiguous_span(src_boxes.get(r.tensor, ()), r.box, isz)
        b = contiguous_span(dst_boxes.get(r.tensor, ()), r.box, isz)
        src.append(a)
        dst.append(b)
        (direct if r.nbytes >= direct_min and (a is not None or b is not None) else packed).append(j)
    lay = layout_of([regions[j].nbytes for j in packed])
    return Wire(tuple(packed), lay, tuple(direct), tuple(src), tuple(dst))


class LocalWeights:
    """One rank's data of several tensors: for every tensor index, its boxes and one tensor per box."""

    def __init__(self, model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]], data: Mapping[int, list[torch.Tensor]]):
        self.model = model
        self.boxes = {i: tuple(b) for i, b in holdings.items()}
        self.data = {i: list(data[i]) for i in self.boxes}
        for i, boxes in self.boxes.items():
            ts = self.data[i]
            if len(ts) != len(boxes):
                raise TransferError(f"{model.tensors[i].name}: {len(ts)} local tensors for {len(boxes)} boxes")
            for b, t in zip(boxes, ts):
                if tuple(t.shape) != box_shape(b):
                    raise TransferError(f"{model.tensors[i].name}: local tensor {tuple(t.shape)} for box {b}")
        self._pieces: dict[tuple[int, Box], tuple[tuple[int, Box], ...]] = {}
        self.coverage: dict[tuple[int, int], list[Box]] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.data.values() for t in ts)

    def pieces(self, index: int, box: Box) -> tuple[tuple[int, Box], ...]:
        """(local box number, intersection) for every local box overlapping ``box``; must cover it."""
        key = (index, box)
        got = self._pieces.get(key)
        if got is None:
            nb = _norm(box)
            out = []
            for k, lb in enumerate(self.boxes.get(index, ())):
                inter = _intersect(_norm(lb), nb)
                if inter is not None:
                    out.append((k, inter))
            covered = sum(box_numel(i) for _, i in out)
            if covered != box_numel(nb):
                name = self.model.tensors[index].name
                raise TransferError(
                    f"{name} {box}: this rank holds {covered} of its {box_numel(nb)} elements"
                    f" (boxes {self.boxes.get(index, ())})"
                )
            got = tuple(out)
            self._pieces[key] = got
        return got

    def _shaped(self, index: int, box: Box, buf: torch.Tensor) -> torch.Tensor:
        """``buf`` as the byte-shaped view of ``box``: a flat contiguous segment is reshaped; an
        already shaped (possibly strided) view is taken as it is."""
        shape = _byte_shape(box, self.model.tensors[index].itemsize)
        if tuple(buf.shape) == shape:
            return buf
        return buf.view(shape)

    def read_into(self, index: int, box: Box, dst: torch.Tensor) -> None:
        """Copy ``tensor[index][box]`` (global coordinates) into ``dst``: a flat uint8 segment of the
        box's bytes (row-major) or a uint8 view already shaped like the box (last dim in bytes)."""
        isz = self.model.tensors[index].itemsize
        nb = _norm(box)
        view = self._shaped(index, box, dst)
        for k, inter in self.pieces(index, box):
            lb = _norm(self.boxes[index][k])
            view[_byte_slices(inter, nb, isz)].copy_(byte_view(self.data[index][k])[_byte_slices(inter, lb, isz)])

    def write_from(self, index: int, box: Box, src: torch.Tensor) -> None:
        """Copy ``tensor[index][box]`` from ``src`` (flat segment or shaped view) into the local tensors,
        recording what was written (``coverage_problems``)."""
        isz = self.model.tensors[index].itemsize
        nb = _norm(box)
        view = self._shaped(index, box, src)
        for k, inter in self.pieces(index, box):
            lb = _norm(self.boxes[index][k])
            byte_view(self.data[index][k])[_byte_slices(inter, lb, isz)].copy_(view[_byte_slices(inter, nb, isz)])
            self.coverage.setdefault((index, k), []).append(inter)

    def differs(self, index: int, box: Box, other: torch.Tensor) -> torch.Tensor:
        """A 1-element bool tensor: does ``tensor[index][box]`` differ from ``other`` (flat segment or
        shaped byte view) anywhere? Compared piece by piece in place (no copy; no host sync)."""
        isz = self.model.tensors[index].itemsize
        nb = _norm(box)
        view = self._shaped(index, box, other)
        out = torch.zeros(1, dtype=torch.bool, device=other.device)
        for k, inter in self.pieces(index, box):
            lb = _norm(self.boxes[index][k])
            mine = byte_view(self.data[index][k])[_byte_slices(inter, lb, isz)]
            out |= (mine != view[_byte_slices(inter, nb, isz)]).any()
        return out

    def span_view(self, index: int, span: Span, nbytes: int) -> torch.Tensor:
        """The flat uint8 view of ``nbytes`` at ``span`` (box number, byte offset) of a local tensor."""
        k, off = span
        t = self.data[index][k]
        if not t.is_contiguous():
            raise TransferError(f"{self.model.tensors[index].name}: local tensor of box {k} is not contiguous")
        return byte_view(t).reshape(-1)[off : off + nbytes]

    def mark_written(self, index: int, k: int, box: Box) -> None:
        """Record a write that bypassed ``write_from`` (a zero-copy receive)."""
        self.coverage.setdefault((index, k), []).append(_norm(box))

    def reset_coverage(self) -> None:
        self.coverage = {}

    def coverage_problems(self, limit: int = 20) -> list[str]:
        """Boxes not exactly covered (each element written once) since the last reset."""
        problems: list[str] = []
        for i, boxes in self.boxes.items():
            for k, b in enumerate(boxes):
                parts = self.coverage.get((i, k), [])
                got, want = sum(box_numel(p) for p in parts), box_numel(_norm(b))
                overlap = None
                if got == want and 1 < len(parts) <= 256:
                    overlap = next(
                        ((p, q) for a, p in enumerate(parts) for q in parts[a + 1 :] if _intersect(p, q)), None
                    )
                if got != want or overlap:
                    name = self.model.tensors[i].name
                    why = f"written twice: {overlap}" if overlap else f"{got} of {want} elements written"
                    problems.append(f"{name} box {b}: {why}")
                    if len(problems) >= limit:
                        return problems
        return problems

    def swap_data(self, other: "LocalWeights") -> None:
        """Exchange tensors with ``other`` (same holdings): the commit's pointer swap."""
        if self.boxes != other.boxes:
            raise TransferError("cannot swap weights of different holdings")
        self.data, other.data = other.data, self.data


class BufferPool:
    """Reusable uint8 buffers (no page faults after the first refit); tracks the staging high-water mark."""

    def __init__(self, device: torch.device, limit_bytes: int | None = None):
        self.device = device
        self.limit = limit_bytes
        self._free: list[torch.Tensor] = []
        self.in_use = 0
        self.peak = 0
        self.reserved = 0

    def acquire(self, n: int) -> torch.Tensor:
        best = None
        for j, b in enumerate(self._free):
            if n <= b.numel() <= 2 * n + 4096 and (best is None or b.numel() < self._free[best].numel()):
                best = j
        if best is not None:
            block = self._free.pop(best)
        else:
            if self.limit is not None:
                self._free.sort(key=lambda b: b.numel())
                while self._free and self.reserved + n > self.limit:
                    self.reserved -= self._free.pop().numel()
            block = torch.empty(max(n, 8), dtype=torch.uint8, device=self.device)
            self.reserved += block.numel()
        self.in_use += block.numel()
        self.peak = max(self.peak, self.in_use)
        return block

    def release(self, block: torch.Tensor) -> None:
        self.in_use -= block.numel()
        self._free.append(block)

    def clear(self) -> None:
        self.reserved -= sum(b.numel() for b in self._free)
        self._free.clear()


def item_checksums(layout: Layout, buf: torch.Tensor, items=None) -> torch.Tensor:
    """Checksums [len, WORDS] of the layout's items (all, or those numbered in ``items``), one pass."""
    ks = range(len(layout.sizes)) if items is None else items
    return segment_checksums(buf, [layout.offsets[k] for k in ks], [layout.sizes[k] for k in ks])


def trailer_view(layout: Layout, buf: torch.Tensor) -> torch.Tensor:
    """The trailer as int64 [items, WORDS]."""
    return buf[layout.trailer : layout.size].view(torch.int64).view(-1, WORDS)


def _write_trailer(buf: torch.Tensor, layout: Layout, sums) -> None:
    if len(sums):
        gaps = buf[: layout.trailer]
        # zero the alignment padding so the wire bytes are deterministic
        for off, n, nxt in zip(layout.offsets, layout.sizes, layout.offsets[1:] + (layout.trailer,)):
            if off + n < nxt:
                gaps[off + n : nxt].zero_()
        trailer_view(layout, buf).copy_(sums if isinstance(sums, torch.Tensor) else torch.stack(list(sums)))


def bucket_tensor_view(model: ModelSpec, index: int, layout: Layout, pos: int, buf: torch.Tensor) -> torch.Tensor:
    """The uint8 byte view (full shape, last dim in bytes) of the ``pos``-th tensor of a bucket."""
    t = model.tensors[index]
    off = layout.offsets[pos]
    return buf[off : off + t.nbytes].view(_byte_shape(tuple((0, n) for n in t.shape), t.itemsize))


def box_bytes_in(full_view: torch.Tensor, box: Box, itemsize: int) -> torch.Tensor:
    """``box`` of a full-tensor byte view."""
    nb = _norm(box)
    return full_view[_byte_slices(nb, tuple((0, 0) for _ in nb), itemsize)]


def write_trailer(buf: torch.Tensor, layout: Layout, sums) -> None:
    _write_trailer(buf, layout, sums)


class BucketTarget:
    """A bucket seen like LocalWeights: every tensor of the bucket is one full box."""

    def __init__(self, model, lay, pos: dict[int, int], buf: torch.Tensor):
        self.model, self.lay, self.pos, self.buf = model, lay, pos, buf

    def span_view(self, index: int, span, nbytes: int) -> torch.Tensor:
        off = self.lay.offsets[self.pos[index]] + span[1]
        return self.buf[off : off + nbytes]

    def write_from(self, index: int, box, seg: torch.Tensor) -> None:
        t = self.model.tensors[index]
        full = bucket_tensor_view(self.model, index, self.lay, self.pos[index], self.buf)
        dst = box_bytes_in(full, box, t.itemsize)
        dst.copy_(seg.view(dst.shape))

    def read_into(self, index: int, box, dst: torch.Tensor) -> None:
        t = self.model.tensors[index]
        full = bucket_tensor_view(self.model, index, self.lay, self.pos[index], self.buf)
        src = box_bytes_in(full, box, t.itemsize)
        dst.view(src.shape).copy_(src)

    def mark_written(self, index: int, k: int, box) -> None:
        pass


class FullBoxes(dict):
    """Holdings of a bucket's receiver view: every tensor of the bucket as one full box."""

    def __init__(self, model, tensors):
        super().__init__({t: (full_box(model.tensors[t].shape),) for t in tensors})
