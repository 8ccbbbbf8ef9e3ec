"""Megatron's rank order (``rank_order=``, alias ``use_tp_pp_dp_mapping=``) against megatron-core's own grids.

``megatron_core/rank_order.json`` holds what megatron-core 0.16.1's ``RankGenerator`` gives every rank of 22
configurations (dense, cp, ep/etp, pp up to 4, both orders), as ``initialize_model_parallel`` builds its dense
and expert generators, or the assertion that refuses the configuration (made by
``megatron_core/rank_order.py``, with megatron-core imported from a venv outside the repository; only the JSON
is read here). The layout's ``coords`` must equal it rank by rank, and refuse what megatron-core refuses.
"""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.parallel_models import tiny_llama, tiny_qwen3_moe
from reshardctl.errors import LayoutError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.parallel_spec import parse_parallel as P

DOC = json.loads((Path(__file__).parent / "megatron_core" / "rank_order.json").read_text())
CONFIGS = DOC["configs"]
DENSE, MOE = tiny_llama(layers=12), tiny_qwen3_moe(layers=12)


def spec_of(c: dict) -> str:
    s = f"tp={c['tp']},cp={c['cp']},dp={c['dp']},pp={c['pp']},rank_order={c['order']}"
    if c["ep"] > 1:
        s += f",ep={c['ep']},etp={c['etp']},vocab_divisor=128"
    return s


def build(text: str) -> MegatronLayout:
    ps = P(text)
    return MegatronLayout(MOE if ps.ep > 1 else DENSE, ps)


def test_fixture_covers_both_orders_and_refusals():
    """A lost configuration is a failure, not a smaller test: both orders, cp, ep/etp, pp > 2, refusals."""
    assert DOC["megatron_core"].startswith("0.16")
    assert {c["order"] for c in CONFIGS} == {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"}
    ok = [c for c in CONFIGS if "ranks" in c]
    assert len(ok) >= 18 and len(CONFIGS) - len(ok) >= 3
    assert any(c["cp"] > 1 and c["ep"] > 1 and c["order"].endswith("dp") for c in ok)
    assert any(c["pp"] > 2 and c["ep"] > 1 and c["order"].endswith("dp") for c in ok)


@pytest.mark.parametrize("c", CONFIGS, ids=[spec_of(c) for c in CONFIGS])
def test_coords_equal_megatron_core_rank_generator(c):
    if "refused" in c:
        with pytest.raises(LayoutError, match=r"rank_order=tp-cp-ep-pp-dp with pp=\d: .*must be the same"):
            build(spec_of(c))
        return
    lay = build(spec_of(c))
    assert lay.world_size == len(c["ranks"])
    for rank, want in enumerate(c["ranks"]):
        assert want["epp"] == want["pp"]  # megatron-core's own assertion: one pipeline grid
        got = lay.coords(rank)
        assert got == {k: want[k] for k in got}, f"rank {rank}"
        # the stage's slot order is tp + TP*(cp + CP*dp), whatever the rank order
        slot = want["tp"] + c["tp"] * (want["cp"] + c["cp"] * want["dp"])
        assert lay.stage_ranks(want["pp"])[slot] == rank


def test_bridge_order_moves_stages_not_holdings():
    """tp=2,pp=2,dp=2: the default order puts stage 0 on ranks 0-3; Bridge's use_tp_pp_dp_mapping on 0,1,4,5
    (dp outermost); what each (stage, slot) holds is the same."""
    a, b = build("tp=2,pp=2,dp=2"), build("tp=2,pp=2,dp=2,use_tp_pp_dp_mapping=true")
    assert [a.stage_ranks(p) for p in (0, 1)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [b.stage_ranks(p) for p in (0, 1)] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    for i in range(len(DENSE.tensors)):
        pa, pb = a.placement(i), b.placement(i)
        assert pa.template == pb.template
        assert [b.stage_slot(r) for r in pb.ranks] == [a.stage_slot(r) for r in pa.ranks]
    assert b.describe().endswith("rank_order=tp-cp-ep-pp-dp")
    assert "use_tp_pp_dp_mapping=True" in b.framework_rules()


def test_parse_alias_and_refusals():
    assert P("use_tp_pp_dp_mapping=true").rank_order == "tp-cp-ep-pp-dp"
    assert P("use_tp_pp_dp_mapping=0").rank_order == "tp-cp-ep-dp-pp"
    assert P("rank_order=tp-cp-ep-pp-dp") == P("use_tp_pp_dp_mapping=on")
    with pytest.raises(LayoutError, match=r"'use_tp_pp_dp_mapping' given twice"):
        P("rank_order=tp-cp-ep-dp-pp,use_tp_pp_dp_mapping=true")
    with pytest.raises(LayoutError, match=r"use_tp_pp_dp_mapping='maybe' is not a boolean"):
        P("use_tp_pp_dp_mapping=maybe")
    with pytest.raises(LayoutError, match=r"rank_order='tp-pp-dp': expected one of tp-cp-ep-dp-pp, tp-cp-ep-pp-dp"):
        P("rank_order=tp-pp-dp")


def test_dense_cp_with_bridge_order_is_refused_as_megatron_core_does():
    """megatron-core builds the expert grid for a dense model too (etp = tp, ep = 1), so cp > 1 with pp > 1
    breaks its 'same data parallel size' assertion (fixture: tp=2,cp=2,dp=2,pp=2 refused)."""
    with pytest.raises(LayoutError, match=r"etp\(2\) x ep\(1\) = 2 and tp\(2\) x cp\(2\) = 4 \(edp=4, dp=2\)"):
        build("tp=2,cp=2,dp=2,pp=2,rank_order=tp-cp-ep-pp-dp")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 3]),
       pp=st.sampled_from([1, 2, 3, 4]), ep=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([None, 1, 2]),
       order=st.sampled_from(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"]))
def test_every_rank_a_distinct_coordinate_and_stages_a_permutation(tp, cp, dp, pp, ep, etp, order):
    text = f"tp={tp},cp={cp},dp={dp},pp={pp},rank_order={order}"
    if ep > 1:
        text += f",ep={ep},etp={etp or tp},vocab_divisor=128"
    try:
        lay = build(text)
    except LayoutError:
        assume(False)
    world = lay.world_size
    dense = [tuple(lay.coords(r)[k] for k in ("tp", "cp", "dp", "pp")) for r in range(world)]
    expert = [tuple(lay.coords(r)[k] for k in ("etp", "ep", "edp", "pp")) for r in range(world)]
    assert sorted(dense) == sorted(product(range(tp), range(cp), range(lay.dp), range(pp)))
    assert sorted(expert) == sorted(product(range(lay.etp), range(lay.ep), range(lay.edp), range(pp)))
    stages = [r for p in range(pp) for r in lay.stage_ranks(p)]
    assert sorted(stages) == list(range(world))  # the stages partition the ranks: a permutation
    for r in range(world):
        p, s = lay.stage_slot(r)
        assert lay.rank_of(p, s) == r and lay.stage_ranks(p)[s] == r
    if pp == 1:  # one stage: both orders are the same grid
        other = build(text.replace(order, "tp-cp-ep-pp-dp" if order.endswith("pp") else "tp-cp-ep-dp-pp"))
        assert [other.coords(r) for r in range(world)] == [lay.coords(r) for r in range(world)]
    if order.endswith("dp"):  # every tensor: the default order's template, on the same (stage, slot)s
        base = build(text.replace(order, "tp-cp-ep-dp-pp"))
        for i in range(len(lay.model.tensors)):
            pa, pb = base.placement(i), lay.placement(i)
            assert pa.template is pb.template or pa.template == pb.template
            assert [lay.stage_slot(r) for r in pb.ranks] == [base.stage_slot(r) for r in pa.ranks]
