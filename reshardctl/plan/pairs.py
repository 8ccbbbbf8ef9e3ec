"""Slot-space intersection of a source template with a destination template.

For a pair of ``ShardTemplate`` objects (trainer side, inference side) this computes, once, every
*piece*: a box that one destination slot needs and one source replica class holds. Tensors whose
placements use the same two templates share the result (the planner caches it by template identity).

Exactness: source replica classes are made disjoint first (a region held by two different classes
is taken from the first), so every destination element comes from exactly one class; a destination
element held by no class is a ``PlanError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from reshardctl.errors import PlanError
from reshardctl.layout.placement import Box, ShardTemplate

BLOCK_ELEMENTS = 1 << 22  # elements of one box-comparison array (32 MiB of int64; a few alive at once)


@dataclass(frozen=True)
class PairPieces:
    """Pieces in slot space, ordered by destination slot.

    ``piece_key`` is equal for the same piece of two destination replicas (slots with identical
    holdings), which is what the two-stage (relay) routing groups on.
    """

    dst_slot: np.ndarray  # int32 [n]
    src_class: np.ndarray  # int32 [n], index into ``src_classes``
    piece_key: np.ndarray  # int32 [n]
    lo: np.ndarray  # int64 [n, ndim]
    hi: np.ndarray  # int64 [n, ndim]
    src_classes: tuple[tuple[int, ...], ...]  # source slots of each class (replicas)

    @property
    def numel(self) -> np.ndarray:
        return np.prod(self.hi - self.lo, axis=1)

    def __len__(self) -> int:
        return int(self.dst_slot.shape[0])


def _boxes_array(boxes: list[Box], ndim: int) -> tuple[np.ndarray, np.ndarray]:
    if not boxes:
        z = np.zeros((0, ndim), dtype=np.int64)
        return z, z.copy()
    arr = np.asarray(boxes, dtype=np.int64).reshape(len(boxes), ndim, 2)
    return arr[:, :, 0], arr[:, :, 1]


def _subtract_box(a: Box, b: Box) -> list[Box]:
    """a minus b as disjoint boxes (at most 2*ndim)."""
    inter = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return [a]
        inter.append((lo, hi))
    out: list[Box] = []
    rest = list(a)
    for d, (lo, hi) in enumerate(inter):
        a0, a1 = rest[d]
        if a0 < lo:
            out.append(tuple(rest[:d]) + ((a0, lo),) + tuple(rest[d + 1 :]))
        if hi < a1:
            out.append(tuple(rest[:d]) + ((hi, a1),) + tuple(rest[d + 1 :]))
        rest[d] = (lo, hi)
    return out


def _row_blocks(n_rows: int, n_cols: int, ndim: int) -> Iterator[tuple[int, int]]:
    """Row ranges whose (rows x n_cols x ndim) comparison arrays hold at most ``BLOCK_ELEMENTS`` each:
    memory stays bounded for any number of boxes (16,384 x 16,384 one-element boxes would be 4 GiB)."""
    step = max(1, BLOCK_ELEMENTS // max(1, n_cols * ndim))
    for r0 in range(0, n_rows, step):
        yield r0, min(n_rows, r0 + step)


def owners_overlap(lo: np.ndarray, hi: np.ndarray, owner: np.ndarray) -> bool:
    """Do two boxes (rows of ``lo``/``hi``, [n, ndim]) of different owners share an element? Compared in
    blocks of rows (``_row_blocks``), never as one n x n array."""
    n, ndim = lo.shape
    for r0, r1 in _row_blocks(n, n, ndim):
        olo = np.maximum(lo[r0:r1, None, :], lo[None, :, :])
        ohi = np.minimum(hi[r0:r1, None, :], hi[None, :, :])
        if (np.all(olo < ohi, axis=2) & (owner[r0:r1, None] != owner[None, :])).any():
            return True
    return False


def _disjoint_class_boxes(class_boxes: list[tuple[Box, ...]], ndim: int) -> list[list[Box]]:
    """Make classes disjoint: class i keeps its boxes minus everything held by classes < i."""
    lo, hi = _boxes_array([b for boxes in class_boxes for b in boxes], ndim)
    owner = np.repeat(np.arange(len(class_boxes)), [len(b) for b in class_boxes])
    if not owners_overlap(lo, hi, owner):
        return [list(b) for b in class_boxes]
    out: list[list[Box]] = []
    start = 0
    for boxes in class_boxes:
        mine: list[Box] = []
        for j, box in enumerate(boxes, start):
            # only the earlier classes' boxes that meet this one (a vectorised test, not a loop over all)
            meets = np.nonzero(np.all(np.maximum(lo[:start], lo[j]) < np.minimum(hi[:start], hi[j]), axis=1))[0]
            parts = [box]
            for t in meets:
                taken = tuple(zip(lo[t].tolist(), hi[t].tolist()))
                parts = [p for q in parts for p in _subtract_box(q, taken)]
            mine.extend(parts)
        out.append(mine)
        start += len(boxes)
    return out


def intersect_templates(src: ShardTemplate, dst: ShardTemplate, tensor_name: str = "") -> PairPieces:
    """All pieces (dst slot, src class, box) with exact coverage of every destination box."""
    if src.shape != dst.shape:
        raise PlanError(f"{tensor_name}: trainer shape {src.shape} != inference shape {dst.shape}")
    ndim = len(src.shape)
    classes = src.replica_classes()
    cls_boxes = _disjoint_class_boxes([src.holdings[c[0]] for c in classes], ndim)
    s_lo, s_hi = _boxes_array([b for boxes in cls_boxes for b in boxes], ndim)
    s_cls = np.repeat(np.arange(len(classes), dtype=np.int32), [len(b) for b in cls_boxes])

    dst_classes = dst.replica_classes()
    rep_boxes = [(k, b) for k, c in enumerate(dst_classes) for b in dst.holdings[c[0]]]
    d_lo, d_hi = _boxes_array([b for _, b in rep_boxes], ndim)
    d_cls = np.asarray([k for k, _ in rep_boxes], dtype=np.int32)

    parts = []  # per block of destination boxes: (di, si, piece lo, piece hi)
    for r0, r1 in _row_blocks(len(d_lo), len(s_lo), ndim):
        lo = np.maximum(d_lo[r0:r1, None, :], s_lo[None, :, :])
        hi = np.minimum(d_hi[r0:r1, None, :], s_hi[None, :, :])
        bi, bs = np.nonzero(np.all(lo < hi, axis=2))  # row-major: grouped by destination box, then source box
        parts.append((bi + r0, bs, lo[bi, bs], hi[bi, bs]))
    di = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    si = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    p_lo = np.concatenate([p[2] for p in parts]) if parts else np.zeros((0, ndim), dtype=np.int64)
    p_hi = np.concatenate([p[3] for p in parts]) if parts else np.zeros((0, ndim), dtype=np.int64)
    p_dcls, p_scls = d_cls[di], s_cls[si]

    # coverage: every destination box fully covered (sources are disjoint, so sums are exact)
    need = np.prod(d_hi - d_lo, axis=1)
    got = np.bincount(di, weights=np.prod(p_hi - p_lo, axis=1), minlength=len(need))
    short = np.nonzero(got.astype(np.int64) != need)[0]
    if short.size:
        b = short[0]
        box = tuple(zip(d_lo[b].tolist(), d_hi[b].tolist()))
        raise PlanError(
            f"{tensor_name or 'tensor'}: the trainer layout does not hold every element an inference rank "
            f"needs: box {box} has {int(need[b])} elements, the trainer ranks hold {int(got[b])} of them"
            + (f" ({short.size} boxes short)" if short.size > 1 else "")
        )

    # expand representative pieces to every slot of the destination class
    keys = np.arange(len(p_dcls), dtype=np.int32)
    cls_len = np.fromiter(map(len, dst_classes), dtype=np.int64, count=len(dst_classes))
    cls_slots = np.fromiter((s for c in dst_classes for s in c), dtype=np.int32, count=int(cls_len.sum()))
    counts = cls_len[p_dcls]  # each piece once per slot of its destination class, those slots in class order
    rep_idx = np.repeat(np.arange(len(p_dcls)), counts)
    nth = np.arange(rep_idx.size) - np.repeat(np.cumsum(counts) - counts, counts)  # slot number in the class
    dst_slot = cls_slots[np.repeat((np.cumsum(cls_len) - cls_len)[p_dcls], counts) + nth]
    order = np.lexsort((rep_idx, dst_slot))  # by destination slot, pieces in representative order
    rep_idx = rep_idx[order]
    return PairPieces(
        dst_slot=dst_slot[order].astype(np.int32),
        src_class=p_scls[rep_idx].astype(np.int32),
        piece_key=keys[rep_idx],
        lo=p_lo[rep_idx],
        hi=p_hi[rep_idx],
        src_classes=classes,
    )


__all__ = ["PairPieces", "intersect_templates", "owners_overlap"]
