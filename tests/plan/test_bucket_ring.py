"""The vectorised broadcast ring of bucket_stats equals the hop-by-hop loop it replaced."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.plan.bucket_stats import Ring, _ring
from reshardctl.topology import Topology


def reference_ring(plan, group: tuple[int, ...]) -> Ring:
    topo = plan.topology
    node, dom = topo.node_of, topo.domain_of
    members = np.asarray(group)
    per_node = np.bincount(node[members], minlength=int(node.max()) + 1)
    intra = net = 0
    rails = None
    by_link = [0, 0, 0]
    for a, c in zip(group, group[1:]):
        if dom[a] == dom[c]:
            intra += 1
            by_link[0 if node[a] == node[c] else 1] += 1
        else:
            net += 1
            by_link[2] += 1
            m = int(min(per_node[node[a]], per_node[node[c]]))
            rails = m if rails is None else min(rails, m)
    return Ring(len(group) - 1, intra, net, rails or 1, tuple(by_link))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data(), train=st.integers(1, 24), infer=st.integers(1, 24), gpus=st.integers(1, 8),
       nodes_per_domain=st.integers(1, 3))
def test_ring_equals_hop_loop(data, train, infer, gpus, nodes_per_domain):
    topo = Topology(train, infer, gpus, nodes_per_domain)
    group = tuple(data.draw(st.lists(st.integers(0, topo.world - 1), min_size=1, max_size=40, unique=True)))
    plan = SimpleNamespace(topology=topo)
    assert _ring(plan, group) == reference_ring(plan, group)
