"""IntervalSet / IndexSet / byte runs / box helpers against plain-Python set references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.layout.indexset import (
    IndexSet,
    IntervalSet,
    box_contains,
    byte_runs,
    intersect_boxes,
    split_box,
)
from reshardctl.layout.placement import box_numel

index_lists = st.lists(st.integers(0, 60), max_size=40)


@settings(max_examples=300, deadline=None)
@given(index_lists, index_lists, st.integers(0, 9))
def test_interval_set_algebra_matches_python_sets(a, b, off):
    A, B = IntervalSet.from_indices(a), IntervalSet.from_indices(b)
    assert A.to_indices().tolist() == sorted(set(a))
    assert A.size == len(set(a))
    assert A.intersect(B).to_indices().tolist() == sorted(set(a) & set(b))
    assert A.union(B).to_indices().tolist() == sorted(set(a) | set(b))
    assert A.shift(off).to_indices().tolist() == sorted(x + off for x in set(a))
    # canonical: disjoint, sorted, non-adjacent, so equality == set equality
    iv = list(A)
    assert all(s < e for s, e in iv) and all(e0 < s1 for (_, e0), (s1, _) in zip(iv, iv[1:]))
    assert (A == IntervalSet.from_indices(list(reversed(a)))) and hash(A) == hash(IntervalSet(iv))
    assert (A == B) == (set(a) == set(b))
    for x in (0, 7, 33, 61):
        assert (x in A) == (x in set(a))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=12))
def test_from_unsorted_overlapping_intervals(pairs):
    want = set().union(*(range(a, b) for a, b in pairs)) if pairs else set()
    assert IntervalSet(pairs).to_indices().tolist() == sorted(want)


@settings(max_examples=300, deadline=None)
@given(index_lists, st.integers(1, 9))
def test_chunk_is_torch_chunk_of_element_list(a, k):
    A = IntervalSet.from_indices(a)
    elems = torch.tensor(sorted(set(a)), dtype=torch.int64)
    pieces = list(torch.chunk(elems, k)) if elems.numel() else []
    for i in range(k):
        want = pieces[i].tolist() if i < len(pieces) else []
        assert A.chunk(k, i).to_indices().tolist() == want
    got = np.concatenate([A.chunk(k, i).to_indices() for i in range(k)])
    assert got.tolist() == elems.tolist()


def test_chunk_examples_and_helpers():
    full = IntervalSet.full(5)
    assert [full.chunk(4, i).size for i in range(4)] == [2, 2, 1, 0]
    assert [IntervalSet.full(6).chunk(4, i).size for i in range(4)] == [2, 2, 2, 0]
    assert IntervalSet.empty().is_empty() and IntervalSet.full(0).is_empty()
    s = IntervalSet([(2, 5), (8, 10)])
    assert s.select(1, 4).intervals == ((3, 5), (8, 9))
    assert s.take(IntervalSet([(0, 1), (4, 5)])).intervals == ((2, 3), (9, 10))
    assert s.position_of(np.array([2, 4, 8, 9])).tolist() == [0, 2, 3, 4]
    assert s.offset(1) == s.shift(1)
    assert s.contains(np.array([1, 2, 5, 8, 10, 99])).tolist() == [False, True, False, True, False, False]
    with pytest.raises(ValueError):
        s.chunk(0, 0)
    with pytest.raises(ValueError):
        IntervalSet.from_indices([-1])


@st.composite
def index_set(draw, shape=None):
    shape = shape or tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    dims = [IntervalSet.from_indices(draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n))) if n else IntervalSet.empty() for n in shape]
    return IndexSet(shape, dims)


def _elements(s: IndexSet) -> set:
    return set(itertools.product(*(d.to_indices().tolist() for d in s.dims)))


def _box_elements(boxes) -> list:
    return [e for b in boxes for e in itertools.product(*(range(a, z) for a, z in b))]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_index_set_boxes_size_intersect(data):
    a = data.draw(index_set())
    b = data.draw(index_set(a.shape))
    els = _box_elements(a.boxes())
    assert len(els) == len(set(els)) == a.size == len(_elements(a))  # boxes are disjoint and cover
    assert set(els) == _elements(a)
    assert list(a.boxes()) == sorted(a.boxes())  # row-major order
    assert a.nbytes(2) == 2 * a.size and a.is_empty() == (a.size == 0)
    assert _elements(a.intersect(b)) == _elements(a) & _elements(b)
    assert IndexSet.from_boxes(a.shape, a.boxes()) == (a if a.size else IndexSet(a.shape, [IntervalSet.empty()] * len(a.shape)))


def test_from_boxes_rejects_non_products_and_merges():
    with pytest.raises(ValueError, match="not a product"):
        IndexSet.from_boxes((4, 4), [((0, 1), (0, 1)), ((1, 2), (1, 2))])
    s = IndexSet.from_boxes((4, 6), [((0, 2), (0, 3)), ((0, 2), (3, 4)), ((2, 3), (0, 4))])
    assert s.boxes() == (((0, 3), (0, 4)),)
    # overlapping boxes whose union is a product
    s = IndexSet.from_boxes((4, 4), [((0, 2), (0, 4)), ((1, 3), (0, 4))])
    assert s.boxes() == (((0, 3), (0, 4)),)
    with pytest.raises(ValueError):
        IndexSet((3,), [IntervalSet([(0, 4)])])


@st.composite
def box_in_shape(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    box = []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        box.append((a, draw(st.integers(a + 1, n))))
    return shape, tuple(box)


@settings(max_examples=300, deadline=None)
@given(box_in_shape(), st.sampled_from([1, 2, 4]))
def test_byte_runs_match_flat_reference(case, itemsize):
    shape, box = case
    starts, lengths = byte_runs(box, shape, itemsize)
    # reference: the byte offsets of every element of the box, in row-major order
    flat = np.arange(int(np.prod(shape))).reshape(shape)[tuple(slice(a, b) for a, b in box)].ravel()
    ref = (flat[:, None] * itemsize + np.arange(itemsize)).ravel()
    got = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]) if len(starts) else np.empty(0)
    assert got.tolist() == ref.tolist()
    # runs are maximal: no run ends where the next begins
    assert not np.any(starts[1:] == starts[:-1] + lengths[:-1])
    assert len(set(lengths.tolist())) <= 1


def test_byte_runs_rules_examples():
    # RowParallel slice along dim 1 of a 2-D weight: one run per row
    s, n = byte_runs(((0, 4), (2, 4)), (4, 8), 2)
    assert s.tolist() == [4, 20, 36, 52] and n.tolist() == [4] * 4
    # full dims merge; a leading extent-1 dim gives one run
    assert byte_runs(((1, 2), (0, 3), (0, 5)), (4, 3, 5), 1)[0].tolist() == [15]
    assert byte_runs(((0, 4), (0, 8)), (4, 8), 2)[1].tolist() == [64]
    # local offset: the segment of an HF box at rows 8..10 stored at local rows 1..3 of a fused param
    s, n = byte_runs(((8, 10), (0, 4)), (5, 4), 2, local_offset=(-7, 0))
    assert s.tolist() == [8] and n.tolist() == [16]
    assert byte_runs(((0, 0), (0, 4)), (5, 4), 2)[0].size == 0
    with pytest.raises(ValueError, match="outside"):
        byte_runs(((0, 6), (0, 4)), (5, 4), 2)


def test_byte_runs_vectorised_many_runs_fast():
    s, n = byte_runs(((0, 4096), (0, 64), (3, 5)), (4096, 64, 8), 2)
    assert s.size == 4096 * 64 and s[1] - s[0] == 16 and n[0] == 4


@settings(max_examples=300, deadline=None)
@given(box_in_shape(), box_in_shape(), st.integers(1, 70))
def test_box_helpers(c1, c2, max_elems):
    _shape, a = c1
    _, b = c2
    if len(a) == len(b):
        ea, eb = set(_box_elements([a])), set(_box_elements([b]))
        ib = intersect_boxes(a, b)
        assert (set(_box_elements([ib])) if ib else set()) == ea & eb
        assert box_contains(a, b) == eb.issubset(ea)
    pieces = split_box(a, max_elems)
    assert all(0 < box_numel(p) <= max_elems for p in pieces)
    assert _box_elements(pieces) == _box_elements([a])  # exact row-major cover, in order
    assert all(box_contains(a, p) for p in pieces)


def test_split_box_examples():
    assert split_box(((0, 4), (0, 10)), 25) == (((0, 2), (0, 10)), ((2, 4), (0, 10)))
    assert split_box(((0, 1), (0, 10)), 4) == (((0, 1), (0, 4)), ((0, 1), (4, 8)), ((0, 1), (8, 10)))
    assert split_box(((0, 3), (0, 2)), 100) == (((0, 3), (0, 2)),)
    assert split_box(((0, 0), (0, 2)), 1) == ()
    with pytest.raises(ValueError):
        split_box(((0, 1),), 0)
