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
    assert fr == gr
    assert all(np.array_equal(a, b) for a, b in zip(fl, gl)) and len(fl) == len(gl)
