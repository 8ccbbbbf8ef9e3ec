"""plan_report's parts (each transport's plan reduced to its figures, NeMo RL's refit) and how they are
dealt to worker processes when the plans themselves are not kept."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from reshardctl.errors import PlanError
from reshardctl.plan_report import PART_WEIGHT, _dealt, plan_report
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare

PARTS = ["reshard", "gather_broadcast", "hybrid"]


@given(st.lists(st.sampled_from(PARTS), unique=True, min_size=1), st.integers(1, 6))
def test_every_part_is_dealt_once_in_report_order_and_the_heaviest_goes_alone(chosen, workers):
    parts = chosen + ["framework"]
    groups = _dealt(parts, workers)
    assert sorted(x for g in groups for x in g) == sorted(parts)
    assert len(groups) == min(workers, len(parts)) and all(groups)
    for g in groups:
        assert g == sorted(g, key=parts.index)
    loads = sorted(sum(PART_WEIGHT[x] for x in g) for g in groups)
    # greedy, heaviest first: no group exceeds the lightest by more than the heaviest single part
    assert loads[-1] - loads[0] <= max(PART_WEIGHT[x] for x in parts)
    if workers == 2 and len(parts) == 4:  # --transport all on two workers: two lanes of equal weight
        assert {frozenset(g) for g in groups} == {frozenset({"reshard", "framework"}),
                                                   frozenset({"gather_broadcast", "hybrid"})}


def test_a_parts_error_in_a_worker_is_raised_here_as_itself(monkeypatch):
    monkeypatch.setenv("RESHARDCTL_PLAN_WORKERS", "2")
    inp = prepare(RefitRequest(model="tiny-llama", transport="all"))
    inp.bucket_bytes = 1  # smaller than one element: the p2p parts refuse it
    with pytest.raises(PlanError, match="smaller than one element") as kept:
        plan_report(inp)
    with pytest.raises(PlanError, match="smaller than one element") as forked:
        plan_report(inp, keep_plans=False)
    assert str(kept.value) == str(forked.value) and kept.value.exit_code == forked.value.exit_code
