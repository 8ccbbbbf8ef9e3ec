"""Phased rounds (plan/reshard.py): where a stage's staging spreads over phases that each fit the bound,
every pair of ranks meets in one round, so a rank's messages grow with its peers, not peers x rounds."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.plan_fixtures import SplitLayout, stage_phases, stage_transfers, toy_model
from helpers.heavy_phases import assert_phase_runs, plan_and_heavy
from reshardctl.plan.planner import build_plan
from reshardctl.plan.reshard import phase_candidates, phase_of, phases_of_stage
from reshardctl.plan.stats import p2p_stats
from reshardctl.topology import Topology


def _loads(src, dst, nbytes, world, phases):
    """Per phase and rank: bytes sent + received, the naive way."""
    load = np.zeros((phases, world))
    for s, d, b in zip(src.tolist(), dst.tolist(), nbytes.tolist()):
        p = (s + d) % phases
        load[p, s] += b
        load[p, d] += b
    return load


@settings(max_examples=200, deadline=None, derandomize=True)
@given(world=st.integers(2, 9), bound=st.integers(1, 60),
       transfers=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(1, 30)), min_size=1, max_size=40))
def test_phase_count_is_the_fewest_that_fit(world, bound, transfers):
    src = np.asarray([s % world for s, _, _ in transfers], dtype=np.int32)
    dst = np.asarray([d % world for _, d, _ in transfers], dtype=np.int32)
    nbytes = np.asarray([min(b, bound) for _, _, b in transfers], dtype=np.float64)
    total = np.bincount(src, nbytes, world) + np.bincount(dst, nbytes, world)
    need = max(1, -(-int(total.max()) // bound))
    phases, loads = phases_of_stage(src, dst, nbytes, world, bound)
    fits = [q for q in phase_candidates(need) if _loads(src, dst, nbytes, world, q).max() <= bound]
    if need == 1 or not fits:
        assert phases == 1 and loads.shape == (0, world)
        return
    assert phases == fits[0]  # the fewest candidate whose every phase fits
    assert np.array_equal(loads, _loads(src, dst, nbytes, world, phases))
    assert loads.max() <= bound
    assert np.array_equal(phase_of(src, dst, phases), (src.astype(np.int64) + dst) % phases)


@given(need=st.integers(1, 100_000))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_phase_candidates_cover_need_to_twice_need(need):
    c = phase_candidates(need)
    assert c[0] == need and c[-1] == 2 * need and c == sorted(set(c)) and len(c) <= 17
    if need <= 16:
        assert c == list(range(need, 2 * need + 1))
    assert all(b - a <= -(-need // 16) for a, b in zip(c, c[1:]))  # steps of at most need / 16


def _rounds_of_pairs(plan, stage):
    pairs = defaultdict(set)
    for index, s, d in stage_transfers(plan, stage):
        pairs[(s, d)].add(index)
    return pairs


@settings(max_examples=60, deadline=None, derandomize=True)
@given(train_shards=st.integers(1, 4), infer_shards=st.integers(1, 4), replicas=st.integers(1, 3),
       bucket=st.sampled_from([16, 48, 64, 128, 256, 1 << 20]), relay=st.booleans(), dims=st.sampled_from([(0,), (1, 0), (1,)]))
def test_phased_stages_meet_every_pair_once_within_the_bound(train_shards, infer_shards, replicas, bucket, relay, dims):
    m = toy_model([(12, 10), (7, 6), (9,), (5, 3)], roles=["ffn", "attention", "norm", "expert"],
                  dtype=["bfloat16", "float32", "float32", "float8_e4m3fn"])
    train = SplitLayout(m, "train", shards=train_shards, dims=(0,))
    infer = SplitLayout(m, "infer", shards=infer_shards, replicas=replicas, dims=dims)
    topo = Topology(train.world_size, infer.world_size, gpus_per_node=2, nodes_per_domain=1)
    plan, heavy, used = plan_and_heavy(m, train, infer, topo, transport="reshard", bucket_bytes=bucket, relay=relay)
    assert p2p_stats(plan).max_staging <= bucket
    for stage in (1, 2):
        phases = stage_phases(plan, stage)
        stage_rounds = [r for r in plan.rounds if r.stage == stage]
        if phases == 1 and stage == 1 and used:
            # heavy pairs (no phase count fits one round per phase): the multi-round form, every pair
            # meets only within one phase, a run of consecutive rounds (test_heavy_phases.py)
            assert_phase_runs(plan, 1, heavy[0])
        if phases > 1:
            pairs = _rounds_of_pairs(plan, stage)
            assert all(len(v) == 1 for v in pairs.values()), "a pair of ranks meets in several rounds"
            assert len(stage_rounds) <= phases
            # no round is empty, and every instance of a phased entry travels in it
            assert all(len(r.entries) for r in stage_rounds)
            assert all(e.inst_lo == 0 and e.inst_hi == len(plan.units[e.unit].tensors)
                       for r in stage_rounds for e in r.records())


def test_a_phased_plan_cuts_messages_per_rank():
    """Four trainers, eight inference ranks, a bound of a few transfers: every rank's staging needs
    several rounds; phased, a rank meets each peer once, so its messages per refit (the cost model's
    MSGS row, summed over rounds) are at most its peers x the four contiguity classes."""
    m = toy_model([(16, 8)] * 6, roles=["ffn"] * 6, dtype=["float32"] * 6)
    train = SplitLayout(m, "train", shards=4, dims=(0,))
    infer = SplitLayout(m, "infer", shards=4, replicas=2, dims=(1,))
    topo = Topology(4, 8, gpus_per_node=4, nodes_per_domain=1)
    plan = build_plan(m, train, infer, topo, transport="reshard", bucket_bytes=200, relay=False)
    assert stage_phases(plan, 1) > 1 and len(plan.rounds) > 1
    stats = p2p_stats(plan)
    pairs = _rounds_of_pairs(plan, 1)
    peers = defaultdict(set)
    for s, d in pairs:
        peers[s].add(d)
        peers[d].add(s)
    msgs = stats.per_rank[4]  # MSGS
    for rank, ps in peers.items():
        assert msgs[rank] <= 4 * len(ps)
    assert stats.max_staging <= 200
