"""topology.py, the one home of the trainer/inference rank arithmetic: global ranks and side ranks map
both ways, on ints and elementwise on arrays, and nodes and NVLink domains follow the ranks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.topology import (
    Topology, global_of, infer_global, infer_rank_of, is_trainer, side_of_global, train_world_of,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(train=st.integers(1, 64), infer=st.integers(1, 64), gpus=st.integers(1, 9), domain=st.integers(1, 4))
def test_global_and_side_ranks_map_both_ways(train, infer, gpus, domain):
    topo = Topology(train, infer, gpus, domain)
    ranks = [(side, r) for side, n in (("train", train), ("infer", infer)) for r in range(n)]
    globals_ = [global_of(side, r, train) for side, r in ranks]
    assert globals_ == list(range(train + infer))  # trainers first, then the inference ranks, no gap
    for g, (side, r) in zip(globals_, ranks):
        assert side_of_global(g, train) == topo.side_of_global(g) == (side, r)
        assert is_trainer(g, train) == (side == "train")
        if side == "infer":
            assert infer_global(r, train) == topo.infer_global(r) == g
            assert infer_rank_of(g, train) == r and train_world_of(g, r) == train
    g = np.arange(train + infer)
    assert (is_trainer(g, train) == (g < train)).all()
    assert (infer_global(infer_rank_of(g, train), train) == g).all()
    # nodes: trainers fill ceil(train / gpus) nodes, the inference ranks start on the next one
    assert topo.node_of.tolist() == [r // gpus for r in range(train)] + \
        [topo.train_nodes + r // gpus for r in range(infer)]
    assert (topo.domain_of == topo.node_of // domain).all()
