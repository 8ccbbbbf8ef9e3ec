"""Index sets: sorted, disjoint, half-open intervals per dimension, their products, and byte runs.

An ``IntervalSet`` is the set of indices one rank holds along one tensor dimension (``[(0, 3), (6, 9)]``).
The *ordered element list* of a set is its indices in increasing order; DTensor chunking works on that
list (``chunk``), so nested and strided sharding never leave this representation.

An ``IndexSet`` is a product of one ``IntervalSet`` per dimension of a global shape; ``boxes()`` turns it
into the ``Box`` tuples every planning step consumes (see ``placement.py``).

Everything here is vectorised with numpy: no Python loop runs per element, and loops per interval or per
run happen only where the output itself has that many entries.
"""

from __future__ import annotations

import itertools
from math import prod
from typing import Iterable, Iterator, Sequence

import numpy as np

from reshardctl.layout.placement import Box, box_numel

_I64 = np.int64


def _runs(sorted_unique: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of consecutive integers in a sorted, duplicate-free array -> (starts, stops)."""
    if sorted_unique.size == 0:
        return np.empty(0, _I64), np.empty(0, _I64)
    brk = np.flatnonzero(np.diff(sorted_unique) != 1)
    starts = np.concatenate(([sorted_unique[0]], sorted_unique[brk + 1]))
    stops = np.concatenate((sorted_unique[brk] + 1, [sorted_unique[-1] + 1]))
    return starts.astype(_I64), stops.astype(_I64)


def _mask_regions(pos: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Regions ``[pos[i], pos[i+1])`` selected by ``mask`` (len(pos)-1 entries), adjacent ones merged."""
    if not mask.any():
        return np.empty(0, _I64), np.empty(0, _I64)
    m = np.concatenate(([False], mask, [False])).astype(np.int8)
    d = np.diff(m)
    first = np.flatnonzero(d == 1)  # region index where a selected run begins
    last = np.flatnonzero(d == -1)  # one past the region index where it ends
    return pos[first], pos[last]


class IntervalSet:
    """Immutable sorted, disjoint, non-adjacent half-open intervals of non-negative integers."""

    __slots__ = ("_starts", "_stops", "_key", "_size")

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()):
        pairs = [(int(a), int(b)) for a, b in intervals if int(b) > int(a)]
        if pairs:
            arr = np.asarray(pairs, dtype=_I64)
            starts, stops = arr[:, 0], arr[:, 1]
            if len(pairs) > 1 and not (np.all(starts[1:] >= stops[:-1])):
                # overlapping or unsorted: normalise through the coverage sweep
                s, e = _sweep(starts, stops, np.empty(0, _I64), np.empty(0, _I64), lambda c: c >= 1)
            else:
                s, e = _merge_adjacent(starts, stops)
        else:
            s, e = np.empty(0, _I64), np.empty(0, _I64)
        self._set(s, e)

    def _set(self, starts: np.ndarray, stops: np.ndarray) -> None:
        starts.setflags(write=False)
        stops.setflags(write=False)
        self._starts = starts
        self._stops = stops
        self._key = tuple(zip(starts.tolist(), stops.tolist()))
        self._size = int((stops - starts).sum())

    @classmethod
    def _from_arrays(cls, starts: np.ndarray, stops: np.ndarray) -> IntervalSet:
        """Trusted constructor: arrays already sorted, disjoint, non-empty, non-adjacent."""
        obj = cls.__new__(cls)
        obj._set(np.ascontiguousarray(starts, dtype=_I64), np.ascontiguousarray(stops, dtype=_I64))
        return obj

    # construction -------------------------------------------------------------------------------
    @classmethod
    def from_indices(cls, indices: Sequence[int] | np.ndarray) -> IntervalSet:
        """The set of the given indices (any order, duplicates allowed), by numpy run detection."""
        arr = np.unique(np.asarray(indices, dtype=_I64).ravel())
        if arr.size and arr[0] < 0:
            raise ValueError(f"negative index {int(arr[0])}")
        return cls._from_arrays(*_runs(arr))

    @classmethod
    def full(cls, n: int) -> IntervalSet:
        return cls([(0, n)])

    @classmethod
    def empty(cls) -> IntervalSet:
        return cls()

    # queries ------------------------------------------------------------------------------------
    @property
    def starts(self) -> np.ndarray:
        return self._starts

    @property
    def stops(self) -> np.ndarray:
        return self._stops

    @property
    def intervals(self) -> tuple[tuple[int, int], ...]:
        return self._key

    @property
    def size(self) -> int:
        """Number of indices."""
        return self._size

    @property
    def num_intervals(self) -> int:
        return len(self._key)

    def is_empty(self) -> bool:
        return self._size == 0

    def is_contiguous(self) -> bool:
        return len(self._key) <= 1

    def bounds(self) -> tuple[int, int]:
        """``(first, last + 1)``; ``(0, 0)`` when empty."""
        return (self._key[0][0], self._key[-1][1]) if self._key else (0, 0)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"IntervalSet({list(self._key)})"

    def __contains__(self, i: int) -> bool:
        return bool(self.contains(np.asarray([i]))[0])

    def contains(self, indices: np.ndarray) -> np.ndarray:
        """Vectorised membership test -> bool array."""
        idx = np.asarray(indices, dtype=_I64)
        k = np.searchsorted(self._stops, idx, side="right")
        ok = k < self._starts.size
        ok[ok] = self._starts[k[ok]] <= idx[ok]
        return ok

    def to_indices(self) -> np.ndarray:
        """The ordered element list as an int64 array (vectorised: no loop per interval)."""
        lengths = self._stops - self._starts
        if lengths.size == 0:
            return np.empty(0, _I64)
        # arange(size) + per-element (start - position of its interval's first element)
        firsts = np.cumsum(lengths) - lengths
        return np.arange(self._size, dtype=_I64) + np.repeat(self._starts - firsts, lengths)

    # algebra ------------------------------------------------------------------------------------
    def intersect(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet._from_arrays(
            *_sweep(self._starts, self._stops, other._starts, other._stops, lambda c: c >= 2)
        )

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet._from_arrays(
            *_sweep(self._starts, self._stops, other._starts, other._stops, lambda c: c >= 1)
        )

    __and__ = intersect
    __or__ = union

    def shift(self, offset: int) -> IntervalSet:
        """Every index plus ``offset`` (the result must stay non-negative)."""
        if self._key and self._key[0][0] + offset < 0:
            raise ValueError(f"shift by {offset} makes index {self._key[0][0] + offset} negative")
        return IntervalSet._from_arrays(self._starts + offset, self._stops + offset)

    offset = shift

    def select(self, lo: int, hi: int) -> IntervalSet:
        """Elements at positions ``[lo, hi)`` of the ordered element list."""
        lo, hi = max(0, min(lo, self._size)), max(0, min(hi, self._size))
        if hi <= lo:
            return IntervalSet.empty()
        lengths = self._stops - self._starts
        ends = np.cumsum(lengths)  # position one past each interval
        begins = ends - lengths
        k0 = int(np.searchsorted(ends, lo, side="right"))
        k1 = int(np.searchsorted(ends, hi, side="left"))  # interval holding position hi-1
        starts = self._starts[k0 : k1 + 1].copy()
        stops = self._stops[k0 : k1 + 1].copy()
        starts[0] += lo - begins[k0]
        stops[-1] -= ends[k1] - hi
        return IntervalSet._from_arrays(starts, stops)

    def take(self, positions: IntervalSet) -> IntervalSet:
        """Elements at the given positions of the ordered element list (a composition of index maps)."""
        out = IntervalSet.empty()
        for a, b in positions:  # one step per position interval, not per element
            out = out.union(self.select(a, b))
        return out

    def chunk(self, num_chunks: int, i: int) -> IntervalSet:
        """``torch.chunk(elements, num_chunks)[i]``: ceil-sized chunks, trailing chunks may be empty."""
        if num_chunks <= 0 or not 0 <= i < num_chunks:
            raise ValueError(f"chunk {i} of {num_chunks}")
        c = -(-self._size // num_chunks)
        return self.select(i * c, (i + 1) * c)

    def position_of(self, indices: np.ndarray) -> np.ndarray:
        """Position of each (member) index in the ordered element list."""
        idx = np.asarray(indices, dtype=_I64)
        lengths = self._stops - self._starts
        begins = np.cumsum(lengths) - lengths
        k = np.searchsorted(self._stops, idx, side="right")
        return begins[k] + idx - self._starts[k]


def _merge_adjacent(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint intervals -> the same with touching neighbours merged."""
    if starts.size <= 1:
        return starts.copy(), stops.copy()
    keep = np.concatenate(([True], starts[1:] != stops[:-1]))
    first = np.flatnonzero(keep)
    last = np.concatenate((first[1:] - 1, [starts.size - 1]))
    return starts[first].copy(), stops[last].copy()


def _sweep(s1, e1, s2, e2, keep) -> tuple[np.ndarray, np.ndarray]:
    """Coverage sweep over two interval lists: regions whose coverage count satisfies ``keep``."""
    pos = np.concatenate((s1, e1, s2, e2))
    if pos.size == 0:
        return np.empty(0, _I64), np.empty(0, _I64)
    pos, inv = np.unique(pos, return_inverse=True)
    delta = np.zeros(pos.size, _I64)
    n1, n2 = s1.size, s2.size
    np.add.at(delta, inv[:n1], 1)
    np.add.at(delta, inv[n1 : 2 * n1], -1)
    np.add.at(delta, inv[2 * n1 : 2 * n1 + n2], 1)
    np.add.at(delta, inv[2 * n1 + n2 :], -1)
    cover = np.cumsum(delta)[:-1]
    return _mask_regions(pos, keep(cover))


class IndexSet:
    """The product of one ``IntervalSet`` per dimension of ``shape`` (a rank's share of one tensor)."""

    __slots__ = ("shape", "dims", "_hash")

    def __init__(self, shape: Sequence[int], dims: Sequence[IntervalSet]):
        self.shape = tuple(int(n) for n in shape)
        self.dims = tuple(dims)
        if len(self.dims) != len(self.shape):
            raise ValueError(f"{len(self.dims)} interval sets for a {len(self.shape)}-d shape")
        for d, (n, s) in enumerate(zip(self.shape, self.dims)):
            if s.num_intervals and s.bounds()[1] > n:
                raise ValueError(f"dim {d}: interval {s.intervals[-1]} outside size {n}")
        self._hash = hash((self.shape, self.dims))

    @classmethod
    def full(cls, shape: Sequence[int]) -> IndexSet:
        return cls(shape, [IntervalSet.full(n) for n in shape])

    @classmethod
    def from_boxes(cls, shape: Sequence[int], boxes: Iterable[Box]) -> IndexSet:
        """The union of ``boxes`` when that union is a product of per-dim sets; ``ValueError`` otherwise."""
        boxes = [tuple(tuple(iv) for iv in b) for b in boxes if box_numel(b) > 0]
        shape = tuple(shape)
        if not boxes:
            return cls(shape, [IntervalSet.empty() for _ in shape])
        nd = len(shape)
        if any(len(b) != nd for b in boxes):
            raise ValueError(f"box rank differs from shape {shape}")
        arr = np.asarray(boxes, dtype=_I64)  # (nbox, nd, 2)
        dims, grids = [], []
        for d in range(nd):
            dims.append(IntervalSet(arr[:, d, :].tolist()))
            grids.append(np.unique(arr[:, d, :]))
        # mark covered atoms of the refined grid, then require every atom of the product to be covered
        cover = np.zeros([g.size - 1 for g in grids], dtype=bool)
        lo = [np.searchsorted(grids[d], arr[:, d, 0]) for d in range(nd)]
        hi = [np.searchsorted(grids[d], arr[:, d, 1]) for d in range(nd)]
        for k in range(len(boxes)):  # one slice assignment per box
            cover[tuple(slice(int(lo[d][k]), int(hi[d][k])) for d in range(nd))] = True
        in_prod = [dims[d].contains(grids[d][:-1]) for d in range(nd)]
        if not cover[np.ix_(*in_prod)].all():
            raise ValueError(f"the union of {len(boxes)} boxes is not a product of per-dim index sets")
        return cls(shape, dims)

    @property
    def size(self) -> int:
        return prod(s.size for s in self.dims)

    def nbytes(self, itemsize: int) -> int:
        return self.size * itemsize

    def is_empty(self) -> bool:
        return self.size == 0

    def local_shape(self) -> tuple[int, ...]:
        return tuple(s.size for s in self.dims)

    def intersect(self, other: IndexSet) -> IndexSet:
        if self.shape != other.shape:
            raise ValueError(f"shapes differ: {self.shape} vs {other.shape}")
        return IndexSet(self.shape, [a.intersect(b) for a, b in zip(self.dims, other.dims)])

    __and__ = intersect

    def boxes(self) -> tuple[Box, ...]:
        """The product of the per-dim intervals, row-major order; ``()`` when empty."""
        if self.is_empty():
            return ()
        return tuple(itertools.product(*(s.intervals for s in self.dims)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IndexSet) and self.shape == other.shape and self.dims == other.dims

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"IndexSet({self.shape}, {[list(s.intervals) for s in self.dims]})"


# boxes -------------------------------------------------------------------------------------------
def intersect_boxes(a: Box, b: Box) -> Box | None:
    """Overlap of two boxes, or ``None`` when it is empty."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def box_contains(outer: Box, inner: Box) -> bool:
    """``inner`` is a subset of ``outer`` (an empty ``inner`` is contained in anything)."""
    if any(lo >= hi for lo, hi in inner):
        return True
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def split_box(box: Box, max_elems: int) -> tuple[Box, ...]:
    """Cut ``box`` into row-major pieces of at most ``max_elems`` elements.

    Cuts along the outermost dim with extent > 1; when even one slice of that dim is too big, every slice
    is split recursively along the next dims.
    """
    if max_elems < 1:
        raise ValueError(f"max_elems must be >= 1, got {max_elems}")
    n = box_numel(box)
    if n == 0:
        return ()
    if n <= max_elems:
        return (box,)
    d = next(i for i, (a, b) in enumerate(box) if b - a > 1)
    a, b = box[d]
    row = n // (b - a)
    per = max_elems // row
    if per >= 1:
        return tuple(box[:d] + ((s, min(s + per, b)),) + box[d + 1 :] for s in range(a, b, per))
    out: list[Box] = []
    for s in range(a, b):
        out.extend(split_box(box[:d] + ((s, s + 1),) + box[d + 1 :], max_elems))
    return tuple(out)


# byte runs ---------------------------------------------------------------------------------------
def byte_runs(
    box: Box,
    local_shape: Sequence[int],
    itemsize: int,
    local_offset: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Byte runs of ``box`` inside a row-major local buffer of ``local_shape`` -> ``(starts, lengths)``.

    ``local_offset`` (per dim, default zeros) is added to the box coordinates to get local coordinates:
    for a ``LocalSegment`` pass ``seg.offset[d] - seg.box[d][0]`` and any sub-box of ``seg.box``.
    Runs of a row-major (C-contiguous, numpy / ``torch.Tensor.contiguous()``) buffer: ``j`` = last dim the
    box does not fully cover; one run per index
    combination of the dims before ``j`` (row-major order), each ``(b_j - a_j) * prod(d_{>j}) * itemsize``
    bytes. A box that covers the whole buffer, or whose dims before ``j`` have extent 1, is one run.
    """
    shape = tuple(int(n) for n in local_shape)
    nd = len(shape)
    if len(box) != nd:
        raise ValueError(f"box {box} has rank {len(box)}, buffer shape {shape}")
    off = tuple(local_offset) if local_offset is not None else (0,) * nd
    lb = tuple((a + o, b + o) for (a, b), o in zip(box, off))
    for d, ((a, b), n) in enumerate(zip(lb, shape)):
        if b > a and (a < 0 or b > n):
            raise ValueError(f"dim {d}: local interval [{a}, {b}) outside size {n}")
    if any(b <= a for a, b in lb):
        return np.empty(0, _I64), np.empty(0, _I64)
    strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    partial = [d for d, ((a, b), n) in enumerate(zip(lb, shape)) if a > 0 or b < n]
    if not partial:
        return np.zeros(1, _I64), np.full(1, prod(shape) * itemsize, _I64)
    j = partial[-1]
    run = (lb[j][1] - lb[j][0]) * strides[j] * itemsize
    # O(#dims) numpy steps: the grid of outer indices grows with the earlier dim first (row-major order)
    start = np.array(lb[j][0] * strides[j], dtype=_I64)
    for d in range(j):
        a, b = lb[d]
        start = np.add.outer(start, np.arange(a, b, dtype=_I64) * strides[d])
    start = start.ravel() * itemsize
    return start, np.full(start.size, run, _I64)
