"""A staged message's regions copied between the arena and a staging block in as few copy kernels as
possible: one indexed copy, else one strided copy per run of alike regions.

Every region that lies inside one box of the rank's arena is a set of equal-length contiguous byte
*runs* of the arena: a row block or a whole box is one run; a column slice of a row-major box is
``rows`` runs of ``cols * itemsize`` bytes at the stride of the box's row; in general (N-D boxes) the
runs are spaced by the strides of the dimensions outside the innermost partial one (``region_runs``:
arena offset, outer (count, stride) dimensions, run bytes). The message is those runs concatenated in
message order (regions back to back, row-major inside each). ``copy_spec`` reads that once per
message and arena layout (the executor memoises the ready ``MessageCopy``, not per refit) and picks:

* one ``as_strided`` copy where the whole message is one view: a single region, or consecutive
  regions that are alike (same runs, arena offsets in arithmetic progression, not overlapping: the
  same slice of every expert of a layer), one view with an extra outer dimension;
* else ``index`` where every region lies inside one box and the chunk ``g`` (the largest power of
  two, at most ``MAX_CHUNK``, dividing every run's offset and length and every outer stride) is at
  least ``MIN_CHUNK``: the message is ``index_select`` of the arena's g-byte chunks into the block
  (sending) or ``index_copy_`` of the block's chunks into the arena (landing), ONE kernel whatever
  its regions; with smaller chunks the index (8 bytes per chunk) costs more than it saves;
* else ``strided``: one ``as_strided`` copy per run of alike regions (as above), and a region that is
  not inside one box (it spans several local boxes) alone through ``LocalWeights.read_into`` /
  ``write_from``. A message of one such region keeps the region-by-region path (``copy_spec`` None).

Copies move the widest words (8, 4, 2 bytes) the offsets, runs and strides allow, bytes where a
buffer's start or length does not: on CPU ``index_copy_`` of int64 words is 4-9x faster than of
bytes. Measured on this machine, 1 thread (column slices of 4 [512, 256] bf16 boxes, 64 columns:
128-byte runs): one strided view 14 us, an index of 128-byte chunks 17 us (landing: 45 us), one
view per region 31 us, ``read_into`` per region 62 us.

Nothing here synchronises with the device; index tensors are built once, on the arena's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reshardctl.runtime.local_weights import norm_box

MIN_CHUNK = 256  # bytes: the index costs at most 8 / MIN_CHUNK of the message (3 %)
MAX_CHUNK = 1 << 16

Runs = tuple[int, tuple[tuple[int, int], ...], int]  # (arena offset, ((count, stride), ...), run bytes)


def region_runs(local, region) -> Runs | None:
    """The region's bytes in ``local``'s arena as runs: (offset of its first byte, the outer
    dimensions as (count, byte stride), outermost first, counts > 1 only, each run's bytes), or None
    where the region is not inside one of the rank's boxes."""
    isz = local.model.tensors[region.tensor].itemsize
    nb = norm_box(region.box)
    for k, lb in enumerate(local.boxes.get(region.tensor, ())):
        lbn = norm_box(lb)
        if len(lbn) != len(nb) or not all(l0 <= a and b <= l1 for (a, b), (l0, l1) in zip(nb, lbn)):
            continue
        shape = [l1 - l0 for l0, l1 in lbn]
        ext = [b - a for a, b in nb]
        strides = [isz] * len(shape)
        for j in range(len(shape) - 2, -1, -1):
            strides[j] = strides[j + 1] * shape[j + 1]
        off = local.box_offset[(region.tensor, k)] + sum((a - l[0]) * s for (a, _), l, s in zip(nb, lbn, strides))
        d = len(shape) - 1
        while d > 0 and ext[d] == shape[d]:
            d -= 1
        run = ext[d] * strides[d]
        dims: list[tuple[int, int]] = []
        for j in range(d):
            if ext[j] > 1:
                dims.append((ext[j], strides[j]))
        return off, _fold(dims, run), run
    return None


def _fold(dims: list[tuple[int, int]], run: int) -> tuple[tuple[int, int], ...]:
    """Outer dimensions with adjacent ones merged where they are one (count * count, inner stride)."""
    out: list[tuple[int, int]] = []
    for c, s in dims:
        if out and out[-1][1] == c * s:
            out[-1] = (out[-1][0] * c, s)
        else:
            out.append((c, s))
    return tuple(out)


@dataclass(frozen=True)
class CopySpec:
    """How one staged message meets the arena, from the layout alone (no tensors).

    ``kind == "index"``: ``g`` and ``runs`` (every region's runs, message order).
    ``kind == "strided"``: ``items``: ``("view", message offset, arena offset, sizes, strides)`` (one
    copy of an ``as_strided`` view) or ``("region", message offset, region)`` (``read_into``)."""

    kind: str
    g: int = 0
    runs: tuple = ()
    items: tuple = ()

    @property
    def calls(self) -> int:
        """Copy kernels (calls) per direction for this message."""
        return 1 if self.kind == "index" else len(self.items)


def _chunk(runs: list[Runs]) -> int:
    """The largest power of two (<= MAX_CHUNK) dividing every run's offset, length and outer strides."""
    acc = MAX_CHUNK
    for off, dims, run in runs:
        acc |= off | run
        for _, s in dims:
            acc |= s
    return acc & -acc


def copy_spec(local, regions, offsets) -> CopySpec | None:
    """The copy of a staged message (``regions`` at ``offsets`` in it) of ``local`` (LocalWeights with
    an arena), or None where ``local`` has no arena or nothing is gained (one region not inside one
    box: region by region, as before)."""
    if getattr(local, "arena", None) is None or getattr(local, "box_offset", None) is None or not regions:
        return None
    runs = [region_runs(local, r) for r in regions]
    items: list = []
    # a run of alike regions: the same runs, back to back in the message, arena offsets in arithmetic
    # progression (not overlapping): [message offset, first arena offset, delta, count, dims, run]
    group = None
    for r, o, x in zip(regions, offsets, runs):
        if r.nbytes == 0:
            continue
        if x is None:
            if group is not None:
                items.append(_view(group))
                group = None
            items.append(("region", o, r))
            continue
        off, dims, run = x
        if group is not None and group[4] == dims and group[5] == run and o == group[0] + group[3] * r.nbytes:
            extent = run + sum((c - 1) * s for c, s in dims)  # one region's bytes, first to last
            if group[3] == 1 and off - group[1] >= extent:  # a second alike region, not overlapping
                group[2], group[3] = off - group[1], 2
                continue
            if group[3] > 1 and off == group[1] + group[3] * group[2]:  # the progression goes on
                group[3] += 1
                continue
        if group is not None:
            items.append(_view(group))
        group = [o, off, 0, 1, dims, run]
    if group is not None:
        items.append(_view(group))
    if len(items) == 1:  # one strided copy already, or one region copied as before
        return CopySpec("strided", items=tuple(items)) if items[0][0] == "view" else None
    if items and all(x is not None for x in runs):
        g = _chunk(runs)
        if g >= MIN_CHUNK:
            return CopySpec("index", g=g, runs=tuple(x for r, x in zip(regions, runs) if r.nbytes))
    return CopySpec("strided", items=tuple(items)) if items else None


def _view(group) -> tuple:
    o, off, delta, count, dims, run = group
    outer = ((count, delta),) if count > 1 else ()
    both = outer + dims
    return ("view", o, off, tuple(c for c, _ in both) + (run,), tuple(s for _, s in both) + (1,))


def chunk_index(spec: CopySpec, device) -> torch.Tensor:
    """The int64 index of the arena's g-byte chunks, in message order, on ``device`` (built once: 8
    bytes per chunk, at most 8 / MIN_CHUNK of the message)."""
    g = spec.g
    parts = []
    for off, dims, run in spec.runs:
        idx = torch.arange(run // g, dtype=torch.int64) + off // g
        for c, s in reversed(dims):
            idx = ((torch.arange(c, dtype=torch.int64) * (s // g)).unsqueeze(1) + idx.unsqueeze(0)).reshape(-1)
        parts.append(idx)
    return torch.cat(parts).to(device)


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _word(*values: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing every value: copies move words, not bytes (on
    CPU an ``index_copy_`` of 8-byte words is several times faster than of bytes)."""
    acc = 8
    for v in values:
        acc |= v
    return acc & -acc


def _words(t: torch.Tensor, w: int) -> torch.Tensor | None:
    """``t`` (flat uint8) seen as ``w``-byte words, or None where its start or length does not allow."""
    if w == 1:
        return t
    if t.storage_offset() % w or t.numel() % w:
        return None
    return t.view(_WORDS[w])


class MessageCopy:
    """A staged message's copy, ready to run: ``gather`` (arena -> block), ``scatter`` (block -> arena).
    Built once per message and arena layout (the index, if any, on ``device``); every copy moves the
    widest words the offsets allow, falling back to bytes where a buffer's start or length does not."""

    def __init__(self, spec: CopySpec, device):
        self.spec = spec
        self.idx = chunk_index(spec, device) if spec.kind == "index" else None
        self.w = _word(spec.g) if spec.kind == "index" else 1
        self.items = []
        for it in spec.items:
            if it[0] == "view":
                _, o, off, sizes, strides = it
                w = _word(o, off, sizes[-1], *strides[:-1])
                self.items.append(("view", o, _numel(sizes), off, sizes, strides, w, o // w, off // w,
                                   sizes[:-1] + (sizes[-1] // w,), tuple(x // w for x in strides[:-1]) + (1,)))
            else:
                self.items.append(it)

    @property
    def calls(self) -> int:
        return self.spec.calls

    def gather(self, local, out: torch.Tensor) -> None:
        """``out`` (the message's bytes, flat uint8) <- the regions' bytes in ``local``'s arena."""
        self._run(local, out, True)

    def scatter(self, local, src: torch.Tensor) -> None:
        """The regions' bytes in ``local``'s arena <- ``src`` (the message's bytes, flat uint8)."""
        self._run(local, src, False)

    def _run(self, local, buf: torch.Tensor, reading: bool) -> None:
        arena = local.arena
        if self.idx is not None:
            w, g = self.w, self.spec.g
            a, b = _words(arena[: (arena.numel() // g) * g], w), _words(buf, w)
            if a is None or b is None:
                a, b, w = arena[: (arena.numel() // g) * g], buf, 1
            if reading:
                torch.index_select(a.view(-1, g // w), 0, self.idx, out=b.view(-1, g // w))
            else:
                a.view(-1, g // w).index_copy_(0, self.idx, b.view(-1, g // w))
            return
        seen: dict[int, tuple] = {}
        for it in self.items:
            if it[0] == "region":
                _, o, r = it
                if reading:
                    local.read_into(r.tensor, r.box, buf[o : o + r.nbytes])
                else:
                    local.write_from(r.tensor, r.box, buf[o : o + r.nbytes])
                continue
            _, o, n, off, sizes, strides, w, ow, offw, sizesw, stridesw = it
            views = seen.get(w)
            if views is None:
                views = seen[w] = (_words(arena, w), _words(buf, w))
            a, b = views
            if a is not None and b is not None:
                part = b[ow : ow + n // w].view(sizesw)
                there = a.as_strided(sizesw, stridesw, a.storage_offset() + offw)
            else:
                part = buf[o : o + n].view(sizes)
                there = arena.as_strided(sizes, strides, arena.storage_offset() + off)
            if reading:
                part.copy_(there)
            else:
                there.copy_(part)


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n
