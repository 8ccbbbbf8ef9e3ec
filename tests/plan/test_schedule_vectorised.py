"""The batched steps of ``schedule_rounds`` (plan/table_batch.py) equal their one-table-at-a-time references on random tables:
``reordered`` (every table's rows permuted within its block, boxes of mixed dims) against
``TransferTable.take`` per table, ``staging_vectors`` against one ``bincount`` pair per table, and
``pair_bytes``'s dense table against its sort."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.planner_scenarios import SCALE, SETTINGS
from reshardctl.plan import table_batch
from reshardctl.plan.reshard import _phase_order
from reshardctl.plan.table_batch import pair_bytes, reordered, staging_vectors
from reshardctl.plan.routing import TransferTable


@st.composite
def tables(draw, world: int):
    out = []
    for _ in range(draw(st.integers(1, 6))):
        n, ndim = draw(st.integers(0, 7)), draw(st.integers(1, 3))
        ints = lambda lo, hi: np.asarray(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), dtype=np.int64)  # noqa: E731
        lo = np.asarray(draw(st.lists(st.integers(0, 50), min_size=n * ndim, max_size=n * ndim)), dtype=np.int64)
        lo = lo.reshape(n, ndim)
        out.append(TransferTable(ints(0, world - 1).astype(np.int32), ints(0, world - 1).astype(np.int32),
                                 ints(1, 2).astype(np.int8), lo, lo + 1 + ints(0, 9)[:, None], ints(1, 1000)))
    return out


def _same(a: TransferTable, b: TransferTable) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
               for f in ("src", "dst", "stage", "lo", "hi", "nbytes"))


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(data=st.data(), world=st.integers(1, 9), phases=st.integers(2, 5))
def test_reordered_equals_take_per_table(data, world, phases):
    ts = data.draw(tables(world))
    lens = np.asarray([len(t) for t in ts], dtype=np.int64)
    src = np.concatenate([t.src for t in ts])
    dst = np.concatenate([t.dst for t in ts])
    order, _, starts = _phase_order(lens, src, dst, phases)
    got = reordered(ts, order, lens)
    want = [t.take(order[a:a + len(t)] - a) for t, a in zip(ts, starts.tolist())]
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(data=st.data(), world=st.integers(1, 9), batch=st.sampled_from([None, 1, 2]))
def test_staging_vectors_equal_one_table_at_a_time(data, world, batch):
    ts = data.draw(tables(world))
    old = table_batch.DENSE_PAIRS
    if batch is not None:  # batches of one or two tables
        table_batch.DENSE_PAIRS = batch * world
    try:
        got = staging_vectors(ts, world)
    finally:
        table_batch.DENSE_PAIRS = old
    want = [(np.bincount(t.src, weights=t.nbytes, minlength=world)
             + np.bincount(t.dst, weights=t.nbytes, minlength=world)).astype(np.int64) for t in ts]
    assert len(got) == len(want) and all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want))


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(world=st.integers(1, 9), rows=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(1, 10**6)),
                                              min_size=1, max_size=40))
def test_pair_bytes_dense_equals_sorted(world, rows):
    src = np.asarray([s % world for s, _, _ in rows], dtype=np.int32)
    dst = np.asarray([d % world for _, d, _ in rows], dtype=np.int32)
    nb = np.asarray([b for _, _, b in rows], dtype=np.float64)
    dense = pair_bytes(src, dst, nb, world)
    old = table_batch.DENSE_PAIRS
    table_batch.DENSE_PAIRS = 0
    try:
        by_sort = pair_bytes(src, dst, nb, world)
    finally:
        table_batch.DENSE_PAIRS = old
    assert all(np.array_equal(a, b) for a, b in zip(dense, by_sort))


@settings(max_examples=80, deadline=None)
@given(keys=st.lists(st.integers(0, 2**62), max_size=40) | st.lists(st.integers(0, 4), max_size=40))
def test_distinct_is_np_unique(keys):
    """``plan/distinct.py`` (the sort the planner uses for ``np.unique``): the same distinct values,
    ascending, the same inverse, and each value's first occurrence, on keys with many repeats and none."""
    from reshardctl.plan.distinct import distinct

    x = np.asarray(keys, dtype=np.int64)
    want, want_first, want_inv = np.unique(x, return_index=True, return_inverse=True)
    d = distinct(x)
    assert d.values.tolist() == want.tolist() and d.first is None and d.inverse is None
    got, first, inv = distinct(x, first=True, inverse=True)
    assert got.tolist() == want.tolist() and inv.tolist() == want_inv.reshape(-1).tolist()
    assert first.tolist() == want_first.tolist()  # np.unique's index is the first occurrence too
