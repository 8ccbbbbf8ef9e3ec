"""``lower_bound.needed_bytes`` (per placement class and itemsize) equals the per-tensor loop it replaced
(tests/helpers/lower_bound_reference.py) on random layouts and on real DeepSeek-V3 layers."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from helpers.lower_bound_reference import reference_need
from helpers.planner_scenarios import SETTINGS, SCALE, scenario_plan, scenarios
from reshardctl.plan.lower_bound import needed_bytes


def _same(plan) -> None:
    need, dom_bytes = needed_bytes(plan)
    want_need, want_dom = reference_need(plan)
    assert np.array_equal(need, want_need)
    assert np.array_equal(dom_bytes, want_dom)


@settings(max_examples=80 * SCALE, **SETTINGS)
@given(s=scenarios())
def test_needed_bytes_equal_per_tensor_loop(s):
    _same(scenario_plan(s))


def test_needed_bytes_equal_per_tensor_loop_on_deepseek_layers():
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    model = load_model("deepseek-v3", layers=4)
    train = build_layout(model, "train", "pp=2,ep=4")
    for spec in ("tp=8,dp=2", "tp=4,dp=4", "tp=2,dp=2"):
        infer = build_layout(model, "infer", spec)
        topo = Topology(train.world_size, infer.world_size, 8, 1)
        _same(build_plan(model, train, infer, topo, transport="gather_broadcast", bucket_bytes=64 << 20))
