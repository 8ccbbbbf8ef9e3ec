"""The grouped m2n compatibility report (one verdict per group of like tensors, numpy totals) equals the
straightforward per-tensor check and summary (tests/helpers/m2n_reference.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.m2n_reference import reference_check, reference_summarize
from helpers.planner_scenarios import SCALE, SETTINGS, scenarios
from reshardctl.plan.m2n_compat import check, m2n_compat
from reshardctl.plan.planner import build_plan


def _same(model, train, infer, topo, units=None) -> None:
    want = reference_check(model, train, infer, topo, units)
    got = check(model, train, infer, topo, units)
    assert [(r.name, r.nbytes, r.reasons, r.values) for r in got] == [(r.name, r.nbytes, r.reasons, r.values) for r in want]
    summary = m2n_compat(model, train, infer, topo, units)
    assert summary == reference_summarize(want)
    assert list(summary["reasons"]) == list(reference_summarize(want)["reasons"])  # the order too


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(s=scenarios(), plan_units=st.booleans())
def test_grouped_report_equals_per_tensor_loop(s, plan_units):
    model, train, infer, topo, bucket = s
    units = build_plan(model, train, infer, topo, bucket_bytes=bucket).units if plan_units else None
    _same(model, train, infer, topo, units)


def test_grouped_report_equals_per_tensor_loop_on_framework_layouts():
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.topology import Topology

    model = load_model("deepseek-v3", layers=4)
    for tspec, ispec in (("pp=2,ep=4", "tp=8,dp=2"), ("tp=2,pp=2,ep=4", "tp=4,dp=4")):
        train, infer = build_layout(model, "train", tspec), build_layout(model, "infer", ispec)
        _same(model, train, infer, Topology(train.world_size, infer.world_size, 8, 1))
