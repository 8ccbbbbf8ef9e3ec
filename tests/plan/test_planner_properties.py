"""Property-based tests of ``build_plan``: random toy models, layouts, topologies and buckets, checked
by the independent checker (tests/helpers/plan_checker.py) and against a naive plan written here."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.plan_checker import check_plan, naive_cross_domain_bytes
from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.plan.cost import Links, predict
from reshardctl.plan.lower_bound import lower_bound
from reshardctl.plan.refit_plan import HYBRID_RESHARD_ROLES
from reshardctl.plan.planner import build_plan
from reshardctl.plan.stats import p2p_stats
from reshardctl.topology import Topology
from helpers.planner_scenarios import DTYPES, ROLES, SCALE, SETTINGS, scenario_plan, scenarios


@pytest.mark.parametrize("transport", ["reshard", "gather_broadcast", "hybrid"])
@settings(max_examples=40 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans())
def test_checker_passes(s, relay, transport):
    plan = scenario_plan(s, transport, relay)
    rep = check_plan(plan, hybrid_roles=HYBRID_RESHARD_ROLES if transport == "hybrid" else None)
    st_ = p2p_stats(plan)
    assert st_.max_staging <= plan.bucket_bytes
    # the planner's own accounting agrees with the checker's (computed from steps_for)
    assert st_.bytes_by_link == rep.bytes_by_link
    assert st_.bytes_total == rep.p2p_bytes
    assert st_.max_staging == rep.max_staging
    assert st_.num_transfers == sum(1 for _ in plan.iter_transfers())


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(s=scenarios())
def test_relay_and_topology_never_add_cross_domain_bytes(s):
    model, train, infer, topo, _ = s
    plain = p2p_stats(scenario_plan(s, relay=False)).cross_domain_bytes
    relayed_plan = scenario_plan(s, relay=True)
    relayed = p2p_stats(relayed_plan).cross_domain_bytes
    naive = naive_cross_domain_bytes(model, train, infer, topo)
    assert relayed <= plain <= naive
    # relay only changes who sends: the bytes every inference rank receives are the same
    check_plan(relayed_plan, replay=False)


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(s=scenarios(), transport=st.sampled_from(["reshard", "gather_broadcast", "hybrid"]), relay=st.booleans(),
       data=st.data())
def test_fingerprint_deterministic_and_sensitive(s, transport, relay, data):
    model, train, infer, _topo, bucket = s
    a, b = scenario_plan(s, transport, relay), scenario_plan(s, transport, relay)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert scenario_plan(s, transport, relay, bucket=bucket + 1).fingerprint != a.fingerprint
    # a different inference layout with the same world size: permuted ranks or another split dim
    # layouts whose describe() is the same for every placement (like a layout file edited in place)
    opaque = dict(train=_Opaque(train), infer=_Opaque(infer))
    base = scenario_plan(s, transport, relay, **opaque).fingerprint
    if infer.world_size > 1 and data.draw(st.booleans()):
        perm = list(infer.perm)
        perm[0], perm[1] = perm[1], perm[0]
        other = SplitLayout(model, "infer", infer.shards, infer.replicas, infer.dims, perm, infer.stages)
    else:
        other = SplitLayout(model, "infer", infer.shards, infer.replicas, infer.dims + (1,), infer.perm, infer.stages)
    changed = any(other.placement(i) != infer.placement(i) for i in range(len(model.tensors)))
    if changed:
        assert scenario_plan(s, transport, relay, train=opaque["train"], infer=_Opaque(other)).fingerprint != base
    other_train = SplitLayout(model, "train", train.shards, train.replicas, train.dims + (2,), train.perm, train.stages)
    changed = any(other_train.placement(i) != train.placement(i) for i in range(len(model.tensors)))
    if changed:
        assert scenario_plan(s, transport, relay, train=_Opaque(other_train), infer=opaque["infer"]).fingerprint != base


class _Opaque(SplitLayout):
    """The same layout, with a describe() that says nothing about its placements."""

    def __init__(self, inner: SplitLayout):
        self.__dict__.update(inner.__dict__)

    def describe(self) -> str:
        return "opaque"


links_st = st.builds(
    lambda nic, nvl_ratio, nics, lat: Links(nic, nic * nvl_ratio, nic * nics, lat, lat * 5),
    st.sampled_from([12.5e9, 25e9, 50e9]),
    st.sampled_from([1.0, 4.0, 18.0]),
    st.integers(1, 8),
    st.sampled_from([0.0, 1e-6]),
)


@settings(max_examples=50 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans(), links=links_st)
def test_prediction_never_beats_lower_bound(s, relay, links):
    plans = {t: scenario_plan(s, t, relay) for t in ("reshard", "gather_broadcast", "hybrid")}
    lbs = {t: lower_bound(p, links) for t, p in plans.items()}
    assert len({(lb.seconds, lb.reason) for lb in lbs.values()}) == 1  # transport-independent
    lb = lbs["reshard"].seconds
    assert lb > 0
    for p in plans.values():  # efficiency <= 1 for every transport
        assert predict(p, links).predicted_s >= lb * (1 - 1e-9)


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(s=scenarios())
def test_hybrid_is_reshard_plus_broadcast(s):
    """Hybrid reshards exactly the tensors reshard would (with the same bytes) and broadcasts the rest."""
    model = s[0]
    hyb = scenario_plan(s, "hybrid")
    ids = {r.tensor for rank in range(hyb.world) for st_ in hyb.steps_for(rank) if hasattr(st_, "sends")
           for p in st_.sends + st_.recvs for r in p.regions}
    assert ids == {i for i, t in enumerate(model.tensors) if t.role in HYBRID_RESHARD_ROLES}
    assert {i for b in hyb.buckets for i in b.tensors} == {
        i for i, t in enumerate(model.tensors) if t.role not in HYBRID_RESHARD_ROLES
    }


# ---- arbitrary box layouts: multi-box holdings, overlapping (non-identical) source replicas, ranks
# holding nothing, several slots on one rank -----------------------------------------------------
@st.composite
def grid_cells(draw, shape):
    cuts = []
    for n in shape:
        inner = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=3)))) if n > 1 else []
        pts = [0, *inner, n]
        cuts.append(list(zip(pts, pts[1:])))
    cells = [()]
    for c in cuts:
        cells = [cell + (iv,) for cell in cells for iv in c]
    return cells


@st.composite
def box_layouts(draw, model, side, world):
    from helpers.plan_fixtures import BoxLayout

    holdings = []
    for t in model.tensors:
        cells = draw(grid_cells(t.shape))
        per_rank: dict[int, list] = {}
        for cell in cells:
            for r in draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=min(3, world))):
                per_rank.setdefault(r, []).append(cell)
        slots = []
        for r in draw(st.permutations(range(world))):
            boxes = per_rank.get(r, [])
            if len(boxes) > 1 and draw(st.booleans()):  # some ranks hold their boxes as two slots
                k = draw(st.integers(1, len(boxes) - 1))
                slots += [(r, tuple(boxes[:k])), (r, tuple(boxes[k:]))]
            else:
                slots.append((r, tuple(boxes)))
        holdings.append(slots)
    return BoxLayout(model, side, world, holdings)


@st.composite
def box_scenarios(draw):
    n = draw(st.integers(1, 3))
    shapes = [tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))) for _ in range(n)]
    model = toy_model(shapes, [draw(st.sampled_from(ROLES)) for _ in range(n)], [draw(st.sampled_from(DTYPES)) for _ in range(n)])
    tw, iw = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    train, infer = draw(box_layouts(model, "train", tw)), draw(box_layouts(model, "infer", iw))
    topo = Topology(tw, iw, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    bucket = draw(st.one_of(st.integers(4, 64), st.sampled_from([1000, 1 << 20])))
    return model, train, infer, topo, bucket


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(s=box_scenarios(), transport=st.sampled_from(["reshard", "gather_broadcast", "hybrid"]), relay=st.booleans())
def test_checker_passes_on_box_layouts(s, transport, relay):
    plan = scenario_plan(s, transport, relay)
    rep = check_plan(plan, hybrid_roles=HYBRID_RESHARD_ROLES if transport == "hybrid" else None)
    st_ = p2p_stats(plan)
    assert st_.max_staging <= plan.bucket_bytes
    assert st_.bytes_by_link == rep.bytes_by_link


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(s=box_scenarios())
def test_box_layouts_cross_domain_bounds(s):
    model, train, infer, topo, _ = s
    plain = p2p_stats(scenario_plan(s, relay=False)).cross_domain_bytes
    relayed = p2p_stats(scenario_plan(s, relay=True)).cross_domain_bytes
    assert relayed <= plain <= naive_cross_domain_bytes(model, train, infer, topo)


@settings(max_examples=30 * SCALE, **SETTINGS)
@given(s=scenarios(), bucket=st.integers(1, 3), transport=st.sampled_from(["reshard", "hybrid", "gather_broadcast"]),
       relay=st.booleans())
def test_bucket_below_one_element(s, bucket, transport, relay):
    """A bucket smaller than one element of a p2p tensor is a PlanError (it used to break the staging
    bound silently); otherwise the plan is valid (broadcast buckets may hold one larger tensor)."""
    from reshardctl.errors import PlanError

    model = s[0]
    p2p = [t for t in model.tensors if transport == "reshard" or (transport == "hybrid" and t.role in HYBRID_RESHARD_ROLES)]
    if any(t.itemsize > bucket for t in p2p):
        with pytest.raises(PlanError, match="smaller than one element"):
            scenario_plan(s, transport, relay, bucket=bucket)
    else:
        check_plan(scenario_plan(s, transport, relay, bucket=bucket))


# ---- the real layouts (Megatron, vLLM, DTensor) on shrunk presets ----------------------------------
def _small_preset(name: str, layers: int = 2):
    """A preset with its structure (heads, experts, MLA ranks) but vocab 1000 (not a multiple of the
    TP padding), 1/8 of the MLP width and 2 layers, so the replay stays fast."""
    from reshardctl.models.catalog import preset_config
    from reshardctl.models.config import spec_from_config

    c = dict(preset_config(name))
    c.update(vocab_size=1000, num_hidden_layers=layers)
    c["intermediate_size"] //= 8
    if "moe_intermediate_size" in c:
        c["moe_intermediate_size"] //= 4
    return spec_from_config(c, f"{name}-small")


def _fsdp2_tp_layout(model, side):
    """DTensor rules: FSDP2+TP (_StridedShard, physical order) on a permuted (dp=2, tp=2) mesh for
    column-parallel weights, Shard(1) over tp for row-parallel ones, plain FSDP Shard(0) otherwise."""
    from reshardctl.layout.dtensor import DTensorLayout, Mesh, Replicate, Rule, Shard, StridedShard

    mesh = Mesh.of((2, 2), ("dp", "tp"), [[3, 1], [2, 0]])
    col = "re:.*(q_proj|k_proj|v_proj|gate_proj|up_proj|embed_tokens|lm_head).weight"
    rules = [
        Rule(col, mesh, (StridedShard(0, 2), Shard(0)), fsdp2_physical=True),
        Rule("re:.*(o_proj|down_proj).weight", mesh, (Replicate(), Shard(1))),
    ]
    return DTensorLayout(model, side, 4, rules, default=Rule("*", mesh, (Shard(0), Replicate())))


REAL = {
    "llama megatron tp2pp2 -> vllm tp2dp2": ("tiny-llama", ("tp=2,pp=2", None), ("tp=2,dp=2", None)),
    "qwen3-moe megatron ep4 -> vllm tp4": ("tiny-qwen3-moe", ("ep=4", None), ("tp=4", None)),
    "deepseek megatron tp2pp2 -> vllm tp2dp2": ("tiny-deepseek", ("tp=2,pp=2", None), ("tp=2,dp=2", None)),
    "llama dtensor tp2dp2 -> dtensor tp4": ("tiny-llama", ("tp=2,dp=2", "dtensor"), ("tp=4", "dtensor")),
    "llama fsdp2+tp rules -> vllm tp2dp2": ("tiny-llama", "fsdp2", ("tp=2,dp=2", None)),
}


@pytest.mark.parametrize("case", list(REAL))
def test_real_layouts(case):
    from reshardctl.layout.build import build_layout

    name, tspec, ispec = REAL[case]
    model = _small_preset(name)
    train = _fsdp2_tp_layout(model, "train") if tspec == "fsdp2" else build_layout(model, "train", *tspec)
    infer = build_layout(model, "infer", *ispec)
    # inference on one 4-GPU node: its replicas share a domain, so relays apply
    topo = Topology(train.world_size, infer.world_size, 4, 1)
    for transport in ("reshard", "gather_broadcast", "hybrid"):
        plan = build_plan(model, train, infer, topo, transport=transport, bucket_bytes=1 << 20, relay=True)
        check_plan(plan, hybrid_roles=HYBRID_RESHARD_ROLES if transport == "hybrid" else None)
        assert p2p_stats(plan).max_staging <= 1 << 20
    relayed = p2p_stats(build_plan(model, train, infer, topo, relay=True)).cross_domain_bytes
    plain = p2p_stats(build_plan(model, train, infer, topo, relay=False)).cross_domain_bytes
    assert relayed <= plain <= naive_cross_domain_bytes(model, train, infer, topo)
    if case.endswith("dp2"):
        assert relayed < plain  # two inference replicas in one domain: relays cut what crosses
    links = Links(25e9, 450e9, 200e9, 2e-6, 5e-6)
    assert predict(build_plan(model, train, infer, topo, relay=True), links).predicted_s >= lower_bound(plan, links).seconds


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(s=box_scenarios(), relay=st.booleans(), links=links_st,
       transport=st.sampled_from(["reshard", "gather_broadcast", "hybrid"]))
def test_box_layouts_prediction_never_beats_lower_bound(s, relay, links, transport):
    """Overlapping (non-identical) inference holdings must not make the bound count bytes twice
    (a broadcast plan beat the bound that did); no transport beats the bound."""
    plan = scenario_plan(s, transport, relay)
    assert predict(plan, links).predicted_s >= lower_bound(plan, links).seconds * (1 - 1e-9)
