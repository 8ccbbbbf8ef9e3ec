"""Copies of many pieces (box slices of many tensors) with their views built once.

Where the bytes of a step do not lie in one arena (span_copy.py covers those), the step moves one piece
per tensor and box: a trainer's staged message read from the API caller's own tensors, a landing into a
bucket at its root, a bucket root's own pieces, a bucket member's held boxes out of the bucket into its
staged weights. ``PieceViews`` builds the views of both sides once per step, weights and buffer, and
keeps the two most recent per step (an inference rank's staged and current weights swap at every
commit, so they alternate); every refit then copies the pieces with one ``torch._foreach_copy_``: no
Python per piece, and on CUDA the fused multi-tensor kernel wherever both sides of a piece are dense.

``copy_checked`` also compares every piece after the copy, byte for byte, as the bucket steps always
did, into one flag tensor resolved in the verify phase, in multi-tensor operations whatever the number of
pieces: out of a bucket (whose buffer is free after the copy) the differences in place, into a bucket at
its root (the bucket is still to be broadcast, the source is the trainer's weights: neither may change)
the differences into transient tensors, ``COMPARE_BYTES`` at a time (docs/benchmarks.md, "Host work per
refit"). Where torch lacks ``_foreach_max``, one ``ne``/``any`` per piece.

Views hold their tensors' memory: the pool tells ``PieceViews`` before it frees a block (``drop``), so a
freed staging block is never kept alive by a view of it.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from itertools import accumulate
from typing import Callable, Sequence

import torch

from reshardctl.runtime.bucket_format import box_bytes_in, bucket_tensor_view

KEEP = 2  # views kept per step: an inference rank's two weight copies alternate
COMPARE_BYTES = 64 << 20  # transient differences at a time where neither side of a copy may change


class Pieces:
    """The two sides of one step's copies, ``dst[i] <- src[i]``; ``names[i]()`` says what piece ``i`` is
    (failure reports only)."""

    def __init__(self, dst: list[torch.Tensor], src: list[torch.Tensor], names: Sequence[Callable[[], str]] = ()):
        self.dst, self.src, self.names = dst, src, list(names)
        self.nbytes = sum(d.numel() for d in dst)
        self.all_nonempty = all(d.numel() for d in dst)
        self._said: dict[str, list[Callable[[], str]]] = {}
        self._runs: dict[int, list[tuple[int, int]]] = {}

    def runs(self, limit: int) -> list[tuple[int, int]]:
        """The pieces in runs ``(a, b)`` of consecutive ones of at most ``limit`` bytes together (a larger
        piece alone); built once per limit, then reused at every refit."""
        got = self._runs.get(limit)
        if got is None:
            ends = list(accumulate(d.numel() * d.element_size() for d in self.dst))
            got, a, base = [], 0, 0
            while a < len(ends):
                b = max(bisect_right(ends, base + limit, lo=a), a + 1)
                got.append((a, b))
                a, base = b, ends[b - 1]
            self._runs[limit] = got
        return got

    def describe(self, label: str) -> list[Callable[[], str]]:
        """One failure description per piece, built once per label."""
        got = self._said.get(label)
        if got is None:
            got = self._said[label] = [lambda n=n: f"{label}: {n()} copy" for n in self.names]
        return got


class PieceViews:
    """The pieces of every step, built by ``build()`` on first use and reused while the step's weights
    (their tensors dict) and buffer are the same objects."""

    def __init__(self):
        self._steps: dict[object, list[tuple]] = {}

    def get(self, key, data, buf: torch.Tensor, offset: int, build: Callable[[], Pieces]) -> Pieces:
        """The pieces of step ``key`` between the weights whose tensors are ``data`` and ``buf`` (at
        ``offset`` in it); the weights' dict is held (its views hold its tensors anyway), ``buf`` weakly."""
        entries = self._steps.setdefault(key, [])
        for e in entries:
            if e[0] is data and e[1]() is buf and e[2] == offset:
                return e[3]
        pieces = build()
        entries.insert(0, (data, weakref.ref(buf), offset, pieces))
        del entries[KEEP:]
        return pieces

    def drop(self) -> None:
        self._steps.clear()

    def forget(self, data) -> None:
        """Drop every view of the weights whose tensors are ``data`` (a caller that handed over new
        tensors: the old ones must not be kept alive by views of them)."""
        for key, entries in self._steps.items():
            entries[:] = [e for e in entries if e[0] is not data]


def message_pieces(weights, items, buf: torch.Tensor, *, send: bool) -> Pieces:
    """The pieces of one message in ``buf``: ``items`` are (tensor index, box, offset in ``buf``, bytes)
    per region; ``weights`` (LocalWeights, BucketTarget) gives each region's piece views. ``send``:
    message <- weights, else weights <- message."""
    seg_side: list[torch.Tensor] = []
    weight_side: list[torch.Tensor] = []
    for index, box, off, n in items:
        for seg, there in weights.piece_views(index, box, buf[off : off + n]):
            seg_side.append(seg)
            weight_side.append(there)
    return Pieces(seg_side, weight_side) if send else Pieces(weight_side, seg_side)


def bucket_pieces(model, layout, entries, weights, buf: torch.Tensor, *, into_bucket: bool) -> Pieces:
    """The pieces between a bucket in ``buf`` and ``weights``: ``entries`` are (position in the bucket,
    tensor index, box) per box; ``into_bucket`` (a root's own pieces): bucket <- weights, else (a
    member's held boxes): weights <- bucket. Each piece named for failure reports."""
    bucket_side: list[torch.Tensor] = []
    weight_side: list[torch.Tensor] = []
    names: list[Callable[[], str]] = []
    for pos, index, box in entries:
        t = model.tensors[index]
        there = box_bytes_in(bucket_tensor_view(model, index, layout, pos, buf), box, t.itemsize)
        for v, mine in weights.piece_views(index, box, there):
            bucket_side.append(v)
            weight_side.append(mine)
            names.append(lambda t=t, box=box: f"{t.name} {box}")
    if into_bucket:
        return Pieces(bucket_side, weight_side, names)
    return Pieces(weight_side, bucket_side, names)


def copy_pieces(pieces: Pieces) -> None:
    if pieces.dst:
        torch._foreach_copy_(pieces.dst, pieces.src)


def copy_checked(pieces: Pieces, check: Callable[[torch.Tensor, Sequence[Callable[[], str]]], None],
                 label: str, *, consume_source: bool = False) -> None:
    """Copy the pieces, then compare each with its source byte for byte; ``check(flags, describers)``
    books the result (the checksum exchange resolves it in the verify phase). ``consume_source``: the
    source may be overwritten after the copy (a bucket member's broadcast buffer, released right after):
    the destination is subtracted from the source in place (``_foreach_sub_``), then each piece's
    maximum taken (``_foreach_max``: 0 exactly where every byte is equal). Otherwise (a root's own
    pieces) the differences go to transient tensors, ``COMPARE_BYTES`` of them at a time. Either way a
    few multi-tensor operations per call (per 64 MiB), not two per piece."""
    if not pieces.dst:
        return
    copy_pieces(pieces)
    if _FOREACH_MAX is not None and pieces.all_nonempty:
        if consume_source:
            torch._foreach_sub_(pieces.src, pieces.dst)  # uint8: wraps, 0 where equal
            flags = torch.stack(_FOREACH_MAX(pieces.src)) != 0
        else:
            flags = torch.cat([torch.stack(_FOREACH_MAX(torch._foreach_sub(pieces.dst[a:b], pieces.src[a:b])))
                               for a, b in pieces.runs(COMPARE_BYTES)]) != 0
    else:
        flags = torch.stack([torch.ne(d, x).any() for d, x in zip(pieces.dst, pieces.src)])
    check(flags, pieces.describe(label))


_FOREACH_MAX = getattr(torch, "_foreach_max", None)  # newer torch; the per-piece comparison otherwise
