"""planner.plan_for: the plan of another transport, rebuilt from a plan's own inputs (what a Refitter
switches to when the site's ledger names another transport)."""

from __future__ import annotations

import pytest

from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.errors import PlanError
from reshardctl.plan.planner import build_plan, plan_for
from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.runtime.contract import StaticPlan
from reshardctl.topology import Topology


def _inputs():
    m = toy_model([(8, 6), (4, 4), (16,)], roles=["ffn", "attention", "norm"])
    return m, SplitLayout(m, "train", 4, dims=(0,)), SplitLayout(m, "infer", 2, dims=(1,)), Topology(4, 2, 8, 1)


@pytest.mark.parametrize("span", ["root", "stage"])
@pytest.mark.parametrize("have", TRANSPORTS)
@pytest.mark.parametrize("want", TRANSPORTS)
def test_the_same_plan_as_building_it_directly(have, want, span):
    m, train, infer, topo = _inputs()
    kw = dict(bucket_bytes=64, relay=False, broadcast_span=span)
    plan = build_plan(m, train, infer, topo, transport=have, **kw)
    got = plan_for(plan, want)
    direct = build_plan(m, train, infer, topo, transport=want, **kw)
    assert got.transport == want
    assert got.fingerprint == direct.fingerprint
    assert got.broadcast_groups() == direct.broadcast_groups()
    if have == want:
        assert got is plan


def test_a_plan_built_elsewhere_has_its_broadcast_span_read_from_its_buckets():
    """A plan without the recorded span (unpickled from an older build): a bucket group holding other
    trainer ranks besides its root means the stage span."""
    m, train, infer, topo = _inputs()
    spans = {span: build_plan(m, train, infer, topo, transport="hybrid", bucket_bytes=64, broadcast_span=span)
             for span in ("root", "stage")}
    assert spans["root"].fingerprint != spans["stage"].fingerprint  # the span matters for these inputs
    for span in ("root", "stage"):
        plan = build_plan(m, train, infer, topo, transport="gather_broadcast", bucket_bytes=64, broadcast_span=span)
        del plan.__dict__["broadcast_span"]
        want = build_plan(m, train, infer, topo, transport="hybrid", bucket_bytes=64, broadcast_span=span)
        assert plan_for(plan, "hybrid").fingerprint == want.fingerprint


def test_a_static_plan_cannot_be_re_planned():
    m, train, infer, topo = _inputs()
    plan = build_plan(m, train, infer, topo, transport="reshard", bucket_bytes=64)
    static = StaticPlan(m, plan.train_world, plan.infer_world, "reshard", "f", 64,
                        {r: tuple(plan.steps_for(r)) for r in range(topo.world)},
                        {r: plan.src_holdings(r) for r in range(4)}, {r: plan.dst_holdings(r) for r in range(2)})
    assert plan_for(static, "reshard") is static
    with pytest.raises(PlanError, match="a StaticPlan cannot be re-planned for transport 'hybrid'"):
        plan_for(static, "hybrid")
