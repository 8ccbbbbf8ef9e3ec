"""The vectorised ``p2p_stats`` equals the straightforward per-entry accounting (tests/helpers/stats_reference.py)
on random plans: every round's traffic matrix, the link bytes and the staging maximum."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.stats_reference import reference_p2p_stats
from helpers.planner_scenarios import SETTINGS, SCALE, scenario_plan, scenarios
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
    _same(scenario_plan(s, transport, relay))


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


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data(), ndim=st.integers(1, 4))
def test_contiguity_rule_equals_the_flat_offset_definition(data, ndim):
    """``stats._contiguous`` (extents per dim) agrees with the definition (last flat offset - first + 1
    == element count) on random boxes inside random holding boxes, contiguous or not."""
    from reshardctl.plan.stats import _contiguous
    from helpers.stats_reference import _contiguous as by_definition

    rows = data.draw(st.integers(1, 12))
    lo, hi, hlo, hhi = (np.zeros((rows, ndim), dtype=np.int64) for _ in range(4))
    for i in range(rows):
        for d in range(ndim):
            a, b = sorted(data.draw(st.lists(st.integers(0, 5), min_size=2, max_size=2)))
            b += 1
            x = data.draw(st.integers(a, b - 1))
            y = data.draw(st.integers(x + 1, b))
            hlo[i, d], hhi[i, d], lo[i, d], hi[i, d] = a, b, x, y
    assert np.array_equal(_contiguous(lo.T, hi.T, hlo.T, hhi.T), by_definition(lo, hi, hlo, hhi))  # rows per dim


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans(), transport=st.sampled_from(["reshard", "hybrid"]),
       chunk=st.sampled_from([1, 2, 7, 64]), expand=st.sampled_from([1, 3, 1 << 20]))
def test_p2p_stats_in_runs_of_slices_equals_per_entry_loop(s, relay, transport, chunk, expand):
    """The slices taken a few transfers at a time (down to one slice a run), the entries expanded a few
    pairs at a time: the same figures as the reference."""
    from unittest import mock

    from reshardctl.plan import stats

    with mock.patch.object(stats, "_CHUNK_ROWS", chunk), mock.patch.object(stats, "_EXPAND", expand):
        _same(scenario_plan(s, transport, relay))
