"""A staged message's regions copied between the arena and a staging block in one indexed copy.

Where every region of a message is one contiguous byte range of the rank's arena (a row block, a whole
box: the usual case of a trainer sending slices of its boxes to many receivers), the message is the
concatenation of those ranges. Cut into chunks of ``g`` bytes (the largest power of two, at most
``MAX_CHUNK``, dividing every range's offset and size), it is ``index_select`` of the arena's chunks into
the block (sending) or ``index_copy_`` of the block's chunks into the arena (landing), with the chunk
index computed once per message and arena layout: one kernel instead of one copy per region. Ranges
whose chunk would be smaller than ``MIN_CHUNK`` bytes (the index would cost more than it saves) and
regions that are not one contiguous range (column slices) keep the region-by-region copy.
"""

from __future__ import annotations

import torch

from reshardctl.runtime.wire import contiguous_span

MIN_CHUNK = 256  # bytes: the index costs at most 8 / MIN_CHUNK of the message (3 %)
MAX_CHUNK = 1 << 16


def chunk_spans(local, regions) -> tuple[int, list[tuple[int, int]]] | None:
    """(chunk bytes g, the regions' (arena offset, bytes) in message order) for ``regions`` of ``local``
    (LocalWeights with an arena), or None where the indexed copy does not apply."""
    if getattr(local, "arena", None) is None or getattr(local, "box_offset", None) is None or len(regions) < 2:
        return None
    spans = []
    g = MAX_CHUNK
    for r in regions:
        span = contiguous_span(local.boxes.get(r.tensor, ()), r.box, local.model.tensors[r.tensor].itemsize)
        if span is None:
            return None
        off = local.box_offset[(r.tensor, span[0])] + span[1]
        spans.append((off, r.nbytes))
        while g >= MIN_CHUNK and (off % g or r.nbytes % g):
            g //= 2
        if g < MIN_CHUNK:
            return None
    return g, spans


def chunk_index(local, regions, device) -> tuple[int, torch.Tensor] | None:
    """(g, int64 index of the arena's g-byte chunks, in message order) on ``device``, or None. The index
    holds 8 bytes per chunk: at most 8 / MIN_CHUNK of the message (3 %), kept for the run."""
    got = chunk_spans(local, regions)
    if got is None:
        return None
    g, spans = got
    idx = torch.cat([torch.arange(off // g, (off + n) // g, dtype=torch.int64) for off, n in spans])
    return g, idx.to(device)


def _chunks(arena: torch.Tensor, g: int) -> torch.Tensor:
    return arena[: (arena.numel() // g) * g].view(-1, g)


def gather(arena: torch.Tensor, g: int, idx: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (the message's bytes) <- the arena's chunks ``idx``, in order."""
    torch.index_select(_chunks(arena, g), 0, idx, out=out.view(-1, g))


def scatter(arena: torch.Tensor, g: int, idx: torch.Tensor, src: torch.Tensor) -> None:
    """The arena's chunks ``idx`` <- ``src`` (the message's bytes), in order."""
    _chunks(arena, g).index_copy_(0, idx, src.view(-1, g))
