"""Explicit small plans with hand-computed answers (and a check that the checker itself catches
broken plans)."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers.plan_checker import PlanCheckError, check_plan
from helpers.plan_fixtures import BoxLayout, SplitLayout, toy_model
from reshardctl.errors import PlanError
from reshardctl.plan.planner import build_plan
from reshardctl.plan.schedule import P2PRound, PeerRegions, Region
from reshardctl.plan.stats import p2p_stats
from reshardctl.topology import Topology


def transfers(plan):
    return sorted((t, s, d, box, nb, st) for t, s, d, box, nb, st in plan.iter_transfers())


def test_row_split_to_column_split():
    """(4, 6) bf16: trainer rows [0,2)|[2,4) -> inference cols [0,3)|[3,6): 4 transfers of 2x3 = 12 bytes."""
    m = toy_model([(4, 6)])
    plan = build_plan(m, SplitLayout(m, "train", 2, dims=(0,)), SplitLayout(m, "infer", 2, dims=(1,)), Topology(2, 2, 8, 1))
    assert transfers(plan) == [
        (0, 0, 2, ((0, 2), (0, 3)), 12, 1),
        (0, 0, 3, ((0, 2), (3, 6)), 12, 1),
        (0, 1, 2, ((2, 4), (0, 3)), 12, 1),
        (0, 1, 3, ((2, 4), (3, 6)), 12, 1),
    ]
    assert len(plan.rounds) == 1  # 24 bytes staging per rank << 256 MiB
    (step,) = plan.steps_for(2)
    assert step.sends == () and [p.peer for p in step.recvs] == [0, 1]
    assert step.recvs[0].regions == (Region(0, ((0, 2), (0, 3)), 12),)
    (step,) = plan.steps_for(0)
    assert [(p.peer, p.regions[0].box) for p in step.sends] == [(2, ((0, 2), (0, 3))), (3, ((0, 2), (3, 6)))]
    rep = check_plan(plan)
    assert rep.recv_bytes == {2: 24, 3: 24}


def test_replicated_sources_alternate():
    """Two trainer replicas of a (8, 4) bf16 tensor, 4 inference shards of 2 rows (16 bytes each):
    each replica sends two of them."""
    m = toy_model([(8, 4)])
    plan = build_plan(m, SplitLayout(m, "train", 1, replicas=2), SplitLayout(m, "infer", 4), Topology(2, 4, 8, 1))
    sent = Counter()
    for _, s, _, _, nb, _ in plan.iter_transfers():
        sent[s] += nb
    assert sent == {0: 32, 1: 32}
    check_plan(plan)


def test_replicated_sources_alternate_across_tensors():
    """Five identical (6,) tensors, 2 trainer replicas, 1 inference rank: 3 + 2 tensors, i.e. the
    bytes per source differ by at most one transfer (12 bytes)."""
    m = toy_model([(6,)] * 5)
    plan = build_plan(m, SplitLayout(m, "train", 1, replicas=2), SplitLayout(m, "infer", 1), Topology(2, 1, 8, 1))
    sent = Counter()
    for _, s, _, _, nb, _ in plan.iter_transfers():
        sent[s] += nb
    assert set(sent) == {0, 1} and abs(sent[0] - sent[1]) <= 12 and sum(sent.values()) == 60
    check_plan(plan)


def test_same_domain_source_preferred():
    """Trainer ranks 0,1,2 on nodes 0,1,2; inference ranks on nodes 3,4; two nodes per domain:
    domains 0,0,1 | 1,2. Inference rank 0 (node 3, domain 1) has trainer rank 2 in its domain."""
    m = toy_model([(4, 4)])
    topo = Topology(3, 2, 1, 2)
    assert topo.domain_of.tolist() == [0, 0, 1, 1, 2]
    for relay in (False, True):
        plan = build_plan(m, SplitLayout(m, "train", 1, replicas=3), SplitLayout(m, "infer", 1, replicas=2), topo,
                          relay=relay)
        src_of = {d: s for _, s, d, _, _, _ in plan.iter_transfers()}
        assert src_of[3] == 2  # same domain
        assert src_of[4] in (0, 1, 2)  # nobody in domain 2: any replica, over the network
        st = p2p_stats(plan)
        assert st.bytes_by_link == {"intra_node": 0, "intra_domain": 32, "cross_domain": 32}
        check_plan(plan)


def test_relay_one_transfer_into_the_domain():
    """One trainer rank (node 0); two inference replicas on node 1 (another domain). With relay: one
    stage-1 transfer into the domain, one stage-2 forward over NVLink."""
    m = toy_model([(4, 4)], dtype="float32")  # 64 bytes
    topo = Topology(1, 2, 2, 1)
    train, infer = SplitLayout(m, "train", 1), SplitLayout(m, "infer", 1, replicas=2)
    plain = build_plan(m, train, infer, topo, relay=False)
    relayed = build_plan(m, train, infer, topo, relay=True)
    full = ((0, 4), (0, 4))
    assert transfers(plain) == [(0, 0, 1, full, 64, 1), (0, 0, 2, full, 64, 1)]
    assert transfers(relayed) == [(0, 0, 1, full, 64, 1), (0, 1, 2, full, 64, 2)]
    assert [(r.index, r.stage) for r in relayed.rounds] == [(0, 1), (1, 2)]
    assert p2p_stats(plain).cross_domain_bytes == 128
    assert p2p_stats(relayed).bytes_by_link == {"intra_node": 64, "intra_domain": 0, "cross_domain": 64}
    assert [(type(s).__name__, s.index, s.stage) for s in relayed.steps_for(1)] == [("P2PRound", 0, 1), ("P2PRound", 1, 2)]
    check_plan(relayed)
    check_plan(plain)


def test_relay_needs_a_remote_source():
    """The same two replicas with a trainer rank in their domain (multi-node NVLink): no relay."""
    m = toy_model([(4, 4)], dtype="float32")
    topo = Topology(1, 2, 2, 2)  # trainer node 0 and inference node 1 share domain 0
    plan = build_plan(m, SplitLayout(m, "train", 1), SplitLayout(m, "infer", 1, replicas=2), topo, relay=True)
    assert {(s, d, st) for _, s, d, _, _, st in plan.iter_transfers()} == {(0, 1, 1), (0, 2, 1)}
    check_plan(plan)


def test_tensor_larger_than_bucket_is_split():
    """(10, 3) float32 = 120 bytes, bucket 40: pieces of 3 rows (36 bytes) and a last row (12 bytes),
    one per round (two pieces would stage 72 bytes on the single sender)."""
    m = toy_model([(10, 3)], dtype="float32")
    plan = build_plan(m, SplitLayout(m, "train", 1), SplitLayout(m, "infer", 1), Topology(1, 1, 8, 1), bucket_bytes=40)
    got = [(box, nb) for _, _, _, box, nb, _ in plan.iter_transfers()]
    assert got == [(((0, 3), (0, 3)), 36), (((3, 6), (0, 3)), 36), (((6, 9), (0, 3)), 36), (((9, 10), (0, 3)), 12)]
    assert len(plan.rounds) == 4
    assert p2p_stats(plan).max_staging == 36
    check_plan(plan)


def test_row_larger_than_bucket_is_split_inside_the_row():
    """(2, 8) float32 rows are 32 bytes; bucket 10 -> pieces of 2 elements (8 bytes), 8 of them."""
    m = toy_model([(2, 8)], dtype="float32")
    plan = build_plan(m, SplitLayout(m, "train", 1), SplitLayout(m, "infer", 1), Topology(1, 1, 8, 1), bucket_bytes=10)
    boxes = [box for _, _, _, box, _, _ in plan.iter_transfers()]
    assert boxes == [((r, r + 1), (c, c + 2)) for r in range(2) for c in range(0, 8, 2)]
    assert all(nb == 8 for *_, nb, _ in plan.iter_transfers())
    check_plan(plan)


def test_split_pieces_of_several_senders_share_rounds():
    """Two senders, one (4, 4) float32 shard each (2 rows, 32 bytes), bucket 16: each shard in two
    16-byte pieces; the receiver takes 16 bytes a round, so four rounds."""
    m = toy_model([(4, 4)], dtype="float32")
    plan = build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 1), Topology(2, 1, 8, 1), bucket_bytes=16)
    assert len(plan.rounds) == 4 and plan.num_transfers == 4
    check_plan(plan)


def test_bucket_below_one_element_is_an_error():
    """Regression: with a bucket smaller than one element the planner produced 1-element pieces
    larger than the bucket (staging 4 > 2 bytes) instead of refusing."""
    m = toy_model([(4, 3)], dtype="float32")
    with pytest.raises(PlanError, match=r"bucket size 2 bytes is smaller than one element of t0\.weight"):
        build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2, dims=(1,)), Topology(2, 2, 2, 1), bucket_bytes=2)
    # broadcast buckets are allowed to hold one larger tensor
    plan = build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2, dims=(1,)), Topology(2, 2, 2, 1),
                      bucket_bytes=2, transport="gather_broadcast")
    assert [b.tensors for b in plan.buckets] == [(0,)]
    check_plan(plan)


def test_uncovered_destination_element_is_an_error():
    m = toy_model([(4, 3), (5,)])
    train = BoxLayout(m, "train", 2, [[(0, (((0, 2), (0, 3)),)), (1, ())], [(0, (((0, 5),),)), (1, ())]])
    infer = SplitLayout(m, "infer", 1)
    with pytest.raises(PlanError) as ei:
        build_plan(m, train, infer, Topology(2, 1, 8, 1))
    msg = str(ei.value)
    assert "t0.weight" in msg and "12 elements" in msg and "hold 6 of them" in msg


def test_broadcast_buckets():
    """gather_broadcast: sizes 8*4*2=64, 16, 48 bytes with a 200-byte staging bound -> buckets of at most
    100 bytes (two are in flight) -> [t0, t1], [t2]; root is trainer rank 0; gather pieces come from the shards."""
    m = toy_model([(8, 4), (8,), (6, 4)])
    plan = build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2, dims=(1, 0)), Topology(2, 2, 8, 1),
                      transport="gather_broadcast", bucket_bytes=200)
    assert [(b.tensors, b.nbytes, b.root, b.group) for b in plan.buckets] == [((0, 1), 80, 0, (0, 2, 3)), ((2,), 48, 0, (0, 2, 3))]
    g = {p.peer: [(r.tensor, r.box) for r in p.regions] for p in plan.buckets[0].gather}
    assert g == {0: [(0, ((0, 4), (0, 4))), (1, ((0, 4),))], 1: [(0, ((4, 8), (0, 4))), (1, ((4, 8),))]}
    check_plan(plan)


def test_broadcast_buckets_per_pipeline_stage():
    """Two trainer stages (tensor i in stage i % 2, ranks 0-1 and 2-3): one bucket per stage, rooted
    at the stage's lowest rank."""
    m = toy_model([(4, 4), (4, 4), (4,), (4,)])
    plan = build_plan(m, SplitLayout(m, "train", 2, stages=2), SplitLayout(m, "infer", 2), Topology(4, 2, 8, 1),
                      transport="gather_broadcast")
    assert [(b.root, b.tensors) for b in plan.buckets] == [(0, (0, 2)), (2, (1, 3))]
    check_plan(plan)


def test_hybrid_reshards_ffn_and_broadcasts_the_rest():
    m = toy_model([(4, 4), (4,), (4, 4)], roles=["ffn", "norm", "expert"])
    plan = build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2, dims=(1,)), Topology(2, 2, 8, 1),
                      transport="hybrid")
    assert {t for t, *_ in plan.iter_transfers()} == {0, 2}
    assert [b.tensors for b in plan.buckets] == [(1,)]
    assert plan.buckets[0].index == len(plan.rounds)
    check_plan(plan)


# ---- the checker catches broken plans -----------------------------------------------------------
class _Mutated:
    """A plan whose ``steps_for`` is altered by ``fn(rank, steps)``."""

    def __init__(self, plan, fn):
        self._plan, self._fn = plan, fn

    def __getattr__(self, name):
        return getattr(self._plan, name)

    def steps_for(self, rank):
        return self._fn(rank, self._plan.steps_for(rank))


def _base():
    m = toy_model([(4, 6), (5,)])
    return build_plan(m, SplitLayout(m, "train", 2, replicas=2), SplitLayout(m, "infer", 2, replicas=2, dims=(1, 0)),
                      Topology(4, 4, 4, 1), relay=True)


def _edit_round(rank_pred, edit):
    def fn(rank, steps):
        out = []
        for s in steps:
            if isinstance(s, P2PRound) and rank_pred(rank, s):
                s = edit(s)
            out.append(s)
        return out

    return fn


def _edit_regions(prs, f):
    return tuple(PeerRegions(p.peer, f(p.regions)) for p in prs)


def test_checker_accepts_the_base_plan():
    plan = _base()
    assert any(r.stage == 2 for r in plan.rounds)
    check_plan(plan)


@pytest.mark.parametrize(
    "name, fn, match",
    [
        ("receiver drops a region",
         _edit_round(lambda r, s: r == 4 and s.index == 0,
                     lambda s: P2PRound(s.index, s.stage, s.sends, s.recvs[1:] if len(s.recvs) > 1 else _edit_regions(s.recvs, lambda rs: rs[1:]))),
         "regions differ|expects"),
        ("both sides shift a box",
         _edit_round(lambda r, s: s.index == 0,
                     lambda s: P2PRound(s.index, s.stage,
                                        _edit_regions(s.sends, lambda rs: (Region(rs[0].tensor, ((0, 1),) + rs[0].box[1:], rs[0].nbytes),) + rs[1:]),
                                        _edit_regions(s.recvs, lambda rs: (Region(rs[0].tensor, ((0, 1),) + rs[0].box[1:], rs[0].nbytes),) + rs[1:]))),
         "nbytes|never written|more than once|outside"),
        ("a stage-2 round moved before stage 1",
         _edit_round(lambda r, s: s.stage == 2, lambda s: P2PRound(-1 - s.index, 2, s.sends, s.recvs)),
         "not received in an earlier|not increasing"),
        ("a round dropped on every rank",
         _edit_round(lambda r, s: s.index == 0, lambda s: P2PRound(s.index, s.stage, (), ())),
         "empty round"),
    ],
)
def test_checker_rejects(name, fn, match):
    with pytest.raises(PlanCheckError, match=match):
        check_plan(_Mutated(_base(), fn))


def test_checker_rejects_reordered_regions():
    plan = _base()
    target = next((r, s.index) for r in range(plan.world) for s in plan.steps_for(r)
                  if isinstance(s, P2PRound) and any(len(p.regions) > 1 for p in s.sends))
    fn = _edit_round(lambda r, s: (r, s.index) == target,
                     lambda s: P2PRound(s.index, s.stage, _edit_regions(s.sends, lambda rs: rs[::-1]), s.recvs))
    with pytest.raises(PlanCheckError, match="regions differ"):
        check_plan(_Mutated(plan, fn))


def test_checker_rejects_a_lost_round():
    plan = _base()

    def fn(rank, steps):
        return [s for s in steps if not (isinstance(s, P2PRound) and s.index == 0)]

    with pytest.raises(PlanCheckError, match="never written|received"):
        check_plan(_Mutated(plan, fn))


def test_checker_rejects_staging_over_the_bucket():
    plan = _base()
    small = type("Small", (), {"bucket_bytes": 8, "__getattr__": lambda self, n: getattr(plan, n)})()
    with pytest.raises(PlanCheckError, match="staging"):
        check_plan(small)


def test_checker_rejects_a_wrong_bucket():
    m = toy_model([(8, 4), (8,)])
    plan = build_plan(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2), Topology(2, 2, 8, 1),
                      transport="gather_broadcast")

    def drop_gather_piece(rank, steps):
        import dataclasses

        return [dataclasses.replace(s, gather=s.gather[:1]) if not isinstance(s, P2PRound) else s for s in steps]

    with pytest.raises(PlanCheckError, match="gather covers|listed on ranks"):
        check_plan(_Mutated(plan, drop_gather_piece))


def test_fingerprint_sees_placements_not_only_describe(tmp_path):
    """Regression: the fingerprint hashed the layouts only through describe(). A layout file edited
    in place (same path, same describe()) kept the fingerprint, so load_plan accepted the stale plan
    and it moved rows [0, 4) to the rank that now holds rows [4, 8)."""
    import json

    from reshardctl.layout.layout_file import load_layout_file
    from reshardctl.plan_files.serialize import load_plan, save_plan

    m = toy_model([(8, 4)])
    path = tmp_path / "infer.json"

    def layout(ranks):
        mesh = {"shape": [2], "dim_names": ["tp"], "ranks": ranks}
        path.write_text(json.dumps({"world_size": 2, "side": "infer", "default": {"mesh": mesh, "placements": ["Shard(0)"]}}))
        return load_layout_file(path, m, "infer")

    before, after = layout([0, 1]), layout([1, 0])
    assert before.describe() == after.describe() and before.placement(0) != after.placement(0)
    train, topo = SplitLayout(m, "train", 1), Topology(1, 2, 8, 1)
    for transport in ("reshard", "gather_broadcast"):
        assert build_plan(m, train, before, topo, transport=transport).fingerprint != \
            build_plan(m, train, after, topo, transport=transport).fingerprint
    save_plan(build_plan(m, train, before, topo), tmp_path / "plan.npz")
    with pytest.raises(PlanError, match="does not match these inputs"):
        load_plan(tmp_path / "plan.npz", m, train, after, topo)
    check_plan(load_plan(tmp_path / "plan.npz", m, train, layout([0, 1]), topo))


def test_lower_bound_counts_overlapping_holdings_once():
    """Regression: two inference ranks of one domain hold [0, 6k) and [2k, 8k) of an 8k-element bf16
    tensor. The domain needs 16k bytes of distinct bytes, not 24k (the sum over replica classes); with
    one NIC per node the old bound (24k / nic) was above the broadcast plan (16k / nic)."""
    from reshardctl.plan.cost import Links, predict
    from reshardctl.plan.lower_bound import lower_bound

    n = 8 << 16
    m = toy_model([(n,)])
    train = BoxLayout(m, "train", 1, [[(0, (((0, n),),))]])
    infer = BoxLayout(m, "infer", 2, [[(0, (((0, 6 * n // 8),),)), (1, (((2 * n // 8, n),),))]])
    topo = Topology(1, 2, 2, 1)
    links = Links(nvlink=450e9, nic=50e9, node_nic=50e9, nvlink_latency=0.0, nic_latency=0.0)
    bcast = build_plan(m, train, infer, topo, transport="gather_broadcast")
    lb = lower_bound(bcast, links)
    assert lb.seconds == pytest.approx(2 * n / 50e9) and f"{2 * n} distinct bytes" in lb.reason
    assert predict(bcast, links).predicted_s >= lb.seconds
    check_plan(bcast)
