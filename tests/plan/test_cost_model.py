"""Behaviour of every term of the cost model (docs/cost-model.md), not its seconds: more messages cost
more latency, a slower link moves the bottleneck, copies and checksums scale with their rates, overlap
only where the executor overlaps, the strong broadcast uses the source node's rails, and no prediction
beats the physical lower bound."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.errors import ProfileError
from reshardctl.plan.cost import TERMS, Links, _round_terms, predict
from reshardctl.plan.lower_bound import lower_bound
from reshardctl.plan.planner import build_plan
from reshardctl.plan.stats import K, MSGS, NIC_RECV, NIC_SEND, NVL_SEND, PACK_SEND, p2p_stats
from reshardctl.topology import Topology

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
GPU = Links(nvlink=380e9, nic=47e9, node_nic=376e9, nvlink_latency=2e-6, nic_latency=5e-6, launch=2e-6,
            copy=1000e9, checksum=500e9, msg_concurrency=8, nics_per_node=8, peak_nvlink=450e9, peak_nic=50e9,
            peak_node_nic=400e9)
CPU = Links(nvlink=2e9, nic=2e9, node_nic=3e9, nvlink_latency=50e-6, nic_latency=50e-6, launch=300e-6, copy=3e9,
            checksum=3e9, host=3e9, broadcast=2.5e9, cores=2, copy_all=6e9, checksum_all=5e9)


def _plan(transport="reshard", train_shards=4, infer_shards=4, gpus=4, span="root", dims=(0,), shape=(512, 512),
          n=3, relay=False, train_replicas=1, infer_replicas=1):
    model = toy_model([shape] * n, ["ffn"] * n)
    train = SplitLayout(model, "train", train_shards, replicas=train_replicas, dims=dims)
    infer = SplitLayout(model, "infer", infer_shards, replicas=infer_replicas, dims=(0,))
    topo = Topology(train.world_size, infer.world_size, gpus, 1)
    return build_plan(model, train, infer, topo, transport=transport, bucket_bytes=1 << 20, relay=relay,
                      broadcast_span=span)


def test_breakdown_has_every_term_and_sums_to_the_prediction():
    for links in (GPU, CPU):
        for t in ("reshard", "gather_broadcast", "hybrid"):
            pred = predict(_plan(t), links)
            assert set(pred.breakdown) == set(TERMS)
            assert all(v >= 0 for v in pred.breakdown.values())
            assert math.isclose(sum(pred.breakdown.values()), pred.predicted_s, rel_tol=1e-9)


@settings(max_examples=40, **SETTINGS)
@given(world=st.integers(2, 16), base=st.integers(0, 50), extra=st.integers(1, 500),
       cpu=st.booleans())
def test_more_messages_cost_more_latency(world, base, extra, cpu):
    links = CPU if cpu else GPU
    tr = np.zeros((1, K, world))
    tr[0, NIC_SEND, 0] = tr[0, NIC_RECV, 1] = 1 << 20
    tr[0, MSGS, :2] = 1 + base
    node_of = np.arange(world) // 2
    lat0 = _round_terms(tr, node_of, int(node_of.max()) + 1, links)[1][0]
    tr[0, MSGS, :2] += extra
    lat1 = _round_terms(tr, node_of, int(node_of.max()) + 1, links)[1][0]
    assert lat1 > lat0 if cpu or (base + 1) // 8 != (base + extra + 1) // 8 else lat1 >= lat0
    wire0 = _round_terms(tr, node_of, int(node_of.max()) + 1, replace(links, nic_latency=links.nic_latency * 10))[0][0]
    assert wire0 == _round_terms(tr, node_of, int(node_of.max()) + 1, links)[0][0]  # latency is its own term


def test_smaller_buckets_mean_more_steps_and_more_latency():
    model = toy_model([(512, 512)] * 4)
    train, infer = SplitLayout(model, "train", 4), SplitLayout(model, "infer", 4, dims=(1,))
    topo = Topology(4, 4, 4, 1)
    big = build_plan(model, train, infer, topo, bucket_bytes=1 << 20)
    small = build_plan(model, train, infer, topo, bucket_bytes=16 << 10)
    assert len(small.rounds) > len(big.rounds)
    assert predict(small, GPU).breakdown["latency"] > predict(big, GPU).breakdown["latency"]


def test_a_slower_link_moves_the_bottleneck():
    # 4 trainer ranks on one node, 4 x 2 inference replicas on the next: one copy per shard crosses the
    # NICs, the relay fans it out over NVLink
    p = _plan(gpus=8, infer_replicas=2, relay=True)
    assert p.relay and {r.stage for r in p.rounds} == {1, 2}
    slow_nic = replace(GPU, nic=1e9, node_nic=8e9)
    slow_nvl = replace(GPU, nvlink=1e9, nic=400e9, node_nic=3200e9)
    assert predict(p, slow_nic).busiest_link.startswith(("nic", "node_nic"))
    assert predict(p, slow_nic).predicted_s > predict(p, GPU).predicted_s
    a, b = predict(p, slow_nvl), predict(p, slow_nic)
    assert a.busiest_link.startswith("nvlink") and not b.busiest_link.startswith("nvlink")


def test_copies_and_checksums_scale_with_their_rates():
    p = _plan(dims=(1,))  # column shards into row shards: pieces contiguous on neither side
    fast = predict(p, CPU)
    slow = predict(p, replace(CPU, copy=CPU.copy / 10, copy_all=CPU.copy_all / 10))
    assert slow.breakdown["pack"] > fast.breakdown["pack"] > 0
    slow_ck = predict(p, replace(CPU, checksum=CPU.checksum / 10, checksum_all=CPU.checksum_all / 10))
    assert slow_ck.breakdown["checksum"] > fast.breakdown["checksum"] > 0
    assert slow_ck.breakdown["wire"] == fast.breakdown["wire"]


def test_in_place_sends_are_summed_in_the_verify_phase_with_both_sides_at_once():
    """As the executor does: a sender sums a staging block before posting it (a transfer-phase term) and
    what it sends in place from its arena in the verify phase, beside the receivers; on a cpu_only site
    that phase is bounded by every rank's rate together (``checksum_world``) where both sides work."""
    same = _plan()  # every region whole on both sides: sent in place, no staging
    cols = _plan(dims=(1,))  # contiguous on neither side: every send staged
    for p in (same, cols):
        st = p2p_stats(p)
        wire, lat, pack, ck, _ = _round_terms(st.rounds, p.topology.node_of, int(p.topology.node_of.max()) + 1, CPU)
        staged = st.rounds[:, PACK_SEND]
        assert np.allclose(ck, np.maximum(staged.max(axis=1) / CPU.checksum, staged.sum(axis=1) / CPU.checksum_all))
    assert p2p_stats(same).per_rank[PACK_SEND].sum() == 0
    slower_world = replace(CPU, checksum_world=CPU.checksum_all / 4)
    # in place on both sides: the verify phase sums senders' and receivers' bytes at the world rate
    base, slow = predict(same, CPU).breakdown["checksum"], predict(same, slower_world).breakdown["checksum"]
    moved = p2p_stats(same).per_rank[NIC_SEND].sum() + p2p_stats(same).per_rank[NVL_SEND].sum()
    assert math.isclose(slow, 2 * moved / slower_world.checksum_world, rel_tol=1e-9)
    assert slow > base
    # every send staged: the verify phase is the receivers alone, at one side's rate; world rate unused
    assert predict(cols, slower_world).breakdown["checksum"] == predict(cols, CPU).breakdown["checksum"]


def test_a_measured_control_round_sets_the_sync_term():
    """Calibrated: the exchange, the vote and the acknowledgement cost one measured control round each;
    without the figure the sync term comes from the latencies (and does not move with ``control``)."""
    p = _plan()
    from_latency = predict(p, CPU).breakdown["sync"]
    assert from_latency > 0
    for control in (1e-4, 7e-3):
        got = predict(p, replace(CPU, control=control)).breakdown["sync"]
        assert math.isclose(got, 3 * control, rel_tol=1e-12)
    assert predict(p, replace(CPU, control=None)).breakdown["sync"] == from_latency


def test_zero_copy_transfers_pay_no_pack():
    same = _plan()  # identical row shards on both sides: every region straight from / into the weights
    assert predict(same, CPU).breakdown["pack"] == 0
    cols = _plan(dims=(1,))
    assert predict(cols, CPU).breakdown["pack"] > 0


def test_gpu_sites_overlap_copies_cpu_sites_add_them():
    p = _plan(dims=(1,))
    # the same figures, once as a GPU site (overlap) and once sharing cores (no overlap)
    gpu_like = replace(CPU, host=None, broadcast=None, cores=0, copy_all=None, checksum_all=None)
    cpu_like = replace(gpu_like, cores=2, copy_all=CPU.copy, checksum_all=CPU.checksum)
    assert predict(p, cpu_like).predicted_s > predict(p, gpu_like).predicted_s


def test_strong_broadcast_uses_the_rails_of_the_source_node():
    # 8 trainer ranks (one node of 8 GPUs with 8 NICs) -> 8 inference ranks on the next node
    root = _plan("gather_broadcast", train_shards=1, train_replicas=8, infer_shards=8, gpus=8, span="root")
    stage = _plan("gather_broadcast", train_shards=1, train_replicas=8, infer_shards=8, gpus=8, span="stage")
    assert all(len(b.group) == 16 for b in stage.buckets) and all(len(b.group) == 9 for b in root.buckets)
    assert predict(stage, GPU).breakdown["wire"] < predict(root, GPU).breakdown["wire"]
    one_nic = replace(GPU, nics_per_node=1, node_nic=GPU.nic)
    assert math.isclose(predict(stage, one_nic).breakdown["wire"], predict(root, one_nic).breakdown["wire"], rel_tol=0.05)


def test_broadcast_roots_hold_the_whole_tensor_when_a_rank_does():
    p = _plan("gather_broadcast", train_shards=1, train_replicas=4, infer_shards=4)
    roots = {b.root for b in p.buckets}
    assert len(roots) > 1  # replicated tensors spread over their holders
    for b in p.buckets:
        assert [g.peer for g in b.gather] == [b.root]  # nothing to gather
    sharded = _plan("gather_broadcast")
    assert {b.root for b in sharded.buckets} == {0}
    assert any(g.peer != 0 for b in sharded.buckets for g in b.gather)


@settings(max_examples=30, **SETTINGS)
@given(transport=st.sampled_from(["reshard", "gather_broadcast", "hybrid"]), cpu=st.booleans(),
       gpus=st.sampled_from([1, 2, 4]), dims=st.sampled_from([(0,), (1,)]), span=st.sampled_from(["root", "stage"]),
       slow=st.sampled_from([1.0, 0.1]), relay=st.booleans())
def test_prediction_never_beats_the_lower_bound(transport, cpu, gpus, dims, span, slow, relay):
    links = CPU if cpu else GPU
    links = replace(links, nic=links.nic * slow, node_nic=links.node_nic * slow)
    p = _plan(transport, gpus=gpus, dims=dims, span=span, relay=relay)
    assert predict(p, links).predicted_s >= lower_bound(p, links).seconds * (1 - 1e-9)


def test_lower_bound_uses_nominal_figures():
    p = _plan(gpus=2)
    worse = replace(GPU, nic=GPU.nic / 2, node_nic=GPU.node_nic / 2)  # achievable drops, nominal stays
    assert lower_bound(p, worse).seconds == lower_bound(p, GPU).seconds
    assert predict(p, worse).predicted_s > predict(p, GPU).predicted_s


def test_links_from_site_datasheet_and_calibration():
    from reshardctl.site import load_profile
    from reshardctl.site.measured import parse_measured

    h100 = load_profile("dgx-h100")
    ds = Links.from_site(h100)
    assert ds.source == "datasheet"
    assert ds.nvlink < ds.peak_nvlink and ds.nic < ds.peak_nic  # efficiencies below 1
    local = load_profile("local")
    figs = {k: 1e9 if k.endswith("bytes_per_s") else 1e-4 for k in
            ("intra_node_bytes_per_s", "intra_node_latency_s", "cross_node_bytes_per_s", "cross_node_latency_s",
             "node_aggregate_bytes_per_s", "launch_s", "per_message_s", "broadcast_bytes_per_s", "copy_bytes_per_s",
             "checksum_bytes_per_s", "copy_side_bytes_per_s", "checksum_side_bytes_per_s")}
    m = parse_measured({"format": "reshardctl-calibration/1", "site": "local", "date": "2026-01-01T00:00:00Z",
                        "hosts": ["h"], "versions": {}, "ranks": 8, "cores": 2, "figures": figs}, "f.json", "local")
    cal = Links.from_site(local, m)
    assert cal.source.startswith("calibration f.json") and cal.nvlink == 1e9 and cal.host == 1e9
    assert cal.copy_all == 1e9 and cal.cores == 2
    with pytest.raises(ProfileError, match="format: expected 'reshardctl-calibration/1', got 'x'"):
        parse_measured({**m.__dict__, "format": "x"}, "f.json")


def _gather_sent(p) -> np.ndarray:
    """Bytes each rank sends to bucket roots (its own pieces excluded at the root), from the plan."""
    out = np.zeros(p.world)
    for b in p.buckets:
        for g in b.gather:
            if g.peer != b.root:
                out[g.peer] += g.nbytes
    return out


@settings(max_examples=25, **SETTINGS)
@given(transport=st.sampled_from(["gather_broadcast", "hybrid"]), cpu=st.booleans(), gpus=st.sampled_from([1, 2, 4]),
       dims=st.sampled_from([(0,), (1,)]), shards=st.sampled_from([2, 4]), n=st.integers(1, 4))
def test_bucket_senders_sum_their_in_place_pieces_in_the_verify_phase(transport, cpu, gpus, dims, shards, n):
    """As the executor does (``_post_sends`` books a gather sender's pieces on its arena): on GPUs summed
    by ``settle_all`` in the verify phase, so the predicted verify phase holds every gather sender's bytes
    at the checksum rate (the busiest sender alone), beside the rounds' deferred checksums; on the CPU
    summed right after the post (``_sum_sent_in_place``), so the same seconds (all senders over one side's
    rate at least) are in the transfer phase and verify has none. The phases still add up."""
    links = CPU if cpu else GPU
    p = _plan(transport, train_shards=shards, gpus=gpus, dims=dims, n=n)
    pred = predict(p, links)
    sent = _gather_sent(p)
    ck = pred.phases["verify"]["checksum"]
    if cpu:
        assert ck == 0.0
        ck = pred.phases["transfer"]["checksum"]
    if transport == "gather_broadcast" and not cpu:
        assert math.isclose(ck, sent.max() / links.checksum, rel_tol=1e-9, abs_tol=1e-15)
    elif transport == "gather_broadcast":  # the roots' gathered bytes come on top in the transfer phase
        assert ck >= max(sent.max() / links.checksum, sent.sum() / links.checksum_all) * (1 - 1e-9)
    else:  # the rounds' deferred checksums come on top, never less than the buckets' alone
        assert ck >= sent.max() / links.checksum * (1 - 1e-9)
    if sent.sum() > 0:
        assert ck > 0
    phases = pred.phases
    total = sum(v for ph in phases.values() for v in ph.values())
    assert math.isclose(total, pred.predicted_s, rel_tol=1e-9)
    for t in TERMS:
        assert math.isclose(sum(ph.get(t, 0.0) for ph in phases.values()), pred.breakdown[t], rel_tol=1e-9,
                            abs_tol=1e-15)
        assert all(ph.get(t, 0.0) >= -1e-15 for ph in phases.values())


def test_a_gather_broadcast_plans_senders_checksum_their_pieces_once():
    """A bucket sender's pieces are summed once, not also in the gather: on a cpu_only site (terms add up)
    the whole checksum term is the roots' work during the gathers plus the senders' (right after their
    post, in the transfer phase on the CPU)."""
    p = _plan("gather_broadcast")
    sent = _gather_sent(p)
    assert sent.sum() > 0
    pred = predict(p, CPU)
    from reshardctl.plan.bucket_stats import bucket_stats
    bs = bucket_stats(p)
    root = bs.nbytes + bs.gather_send_total
    gather = np.maximum(root / CPU.checksum, root / CPU.checksum_all).sum()
    unpack = np.maximum(bs.held_full_max / CPU.checksum, bs.held_full_total / CPU.checksum_all).sum()
    verify = max(sent.max() / CPU.checksum, sent.sum() / CPU.checksum_all)
    assert math.isclose(pred.breakdown["checksum"], gather + unpack + verify, rel_tol=1e-9)
    # the CPU executor sums the senders' pieces right after their post: the transfer phase holds them
    assert pred.phases["verify"]["checksum"] == 0.0
    assert math.isclose(pred.phases["transfer"]["checksum"], gather + unpack + verify, rel_tol=1e-9)
