"""The vectorised ``p2p_stats`` equals the straightforward per-entry accounting (tests/stats_reference.py)
on random plans: every round's traffic matrix, the link bytes and the staging maximum."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stats_reference import reference_p2p_stats
from test_planner_properties import SETTINGS, SCALE, _plan, scenarios
from reshardctl.plan.stats import p2p_stats


def _same(plan) -> None:
    got, want = p2p_stats(plan), reference_p2p_stats(plan)
    assert np.array_equal(got.rounds, want.rounds)
    assert np.array_equal(got.per_rank, want.per_rank)
    assert got.bytes_by_link == want.bytes_by_link
    assert (got.bytes_total, got.num_transfers, got.num_rounds, got.max_staging) == (
        want.bytes_total, want.num_transfers, want.num_rounds, want.max_staging)


@settings(max_examples=80 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans(), transport=st.sampled_from(["reshard", "hybrid"]))
def test_p2p_stats_equals_per_entry_loop(s, relay, transport):
    _same(_plan(s, transport, relay))


def test_p2p_stats_equals_per_entry_loop_on_deepseek_layers():
    """Real layouts (fused, expert-parallel, replicated, zero-copy sized) on a few DeepSeek-V3 layers."""
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    model = load_model("deepseek-v3", layers=4)
    train = build_layout(model, "train", "pp=2,ep=4")
    for spec, relay in (("tp=8,dp=2", True), ("tp=4,dp=2", False)):
        infer = build_layout(model, "infer", spec)
        topo = Topology(train.world_size, infer.world_size, 8, 1)
        for transport in ("reshard", "hybrid"):
            _same(build_plan(model, train, infer, topo, transport=transport, bucket_bytes=64 << 20, relay=relay))
