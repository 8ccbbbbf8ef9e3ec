"""RoundPacker's one-instance fast path places a unit exactly where the general first fit would."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.plan.rounds import RoundPacker


@settings(max_examples=150, deadline=None, derandomize=True)
@given(world=st.integers(1, 6), bound=st.integers(1, 40),
       loads=st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=6, max_size=6), st.integers(1, 3)), max_size=30))
def test_single_instance_fast_path_equals_general_first_fit(world, bound, loads):
    fast, general = RoundPacker(world, bound, 1, 0), RoundPacker(world, bound, 1, 0)
    for u, (vec, count) in enumerate(loads):
        load = np.minimum(np.asarray(vec[:world], dtype=np.int64), bound)  # a unit's load fits an empty round
        fast.add_unit(u, load, count, 0, 5)
        nz = np.nonzero(load)[0]
        if nz.size:
            general._place_many(u, nz, load[nz], count, 0, 5)
    (fr, fl), (gr, gl) = fast.finish(), general.finish()
    assert [(r.index, r.stage, r.records()) for r in fr] == [(r.index, r.stage, r.records()) for r in gr]
    assert all(np.array_equal(a, b) for a, b in zip(fl, gl)) and len(fl) == len(gl)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(world=st.integers(2, 6), bound=st.integers(4, 40),
       units=st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(1, 40)),
                                         min_size=1, max_size=12), st.integers(1, 4)), max_size=8))
def test_chunks_of_oversized_instances_go_where_a_plain_first_fit_puts_them(world, bound, units):
    """``add_chunks`` (chunks cut once per unit, the search resumed where the unit's previous instance
    went, in growing windows) places every chunk in the round a first fit from round 0 would."""
    from reshardctl.plan.rounds import chunk_transfers

    packer = RoundPacker(world, bound, 1, 0)
    load = np.zeros((0, world), dtype=np.int64)
    want = []
    for u, (transfers, count) in enumerate(units):
        src = np.asarray([s % world for s, _, _ in transfers])
        dst = (src + 1 + np.asarray([d % (world - 1) for _, d, _ in transfers])) % world  # never src (as in plans)
        nbytes = np.asarray([min(b, bound) for _, _, b in transfers])
        chunks = chunk_transfers(src, dst, nbytes, bound)
        # every chunk fits the bound on every rank, and the chunks cover the transfers in order
        assert [(a, z) for a, z, _, _ in chunks] == list(zip([0] + [z for _, z, _, _ in chunks[:-1]], [z for _, z, _, _ in chunks]))
        assert chunks[-1][1] == len(transfers) and all(v.max() <= bound for _, _, _, v in chunks)
        starts = [0] * len(chunks)
        for inst in range(count):
            packer.add_chunks(u, inst, chunks, starts)
            for a, z, ranks, v in chunks:  # the reference: scan every round from the first
                fits = [r for r in range(len(load)) if (load[r, ranks] + v <= bound).all()]
                r = fits[0] if fits else len(load)
                if r == len(load):
                    load = np.concatenate([load, np.zeros((1, world), dtype=np.int64)])
                load[r, ranks] += v
                want.append((r, u, inst, a, z))
    rounds, loads = packer.finish()
    got = sorted((r.index, *e[:2], *e[3:]) for r in rounds for e in r.records())
    assert got == sorted(want)
    assert all(np.array_equal(a, b) for a, b in zip(loads, load)) and len(loads) == len(load)
