"""plan_report's parts (each transport's plan reduced to its figures, NeMo RL's refit) in worker
processes when the plans themselves are not kept."""

from __future__ import annotations

import pytest

from reshardctl.errors import PlanError
from reshardctl.plan_report import plan_report
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare

def test_a_parts_error_in_a_worker_is_raised_here_as_itself(monkeypatch):
    monkeypatch.setenv("RESHARDCTL_PLAN_WORKERS", "2")
    inp = prepare(RefitRequest(model="tiny-llama", transport="all"))
    inp.bucket_bytes = 1  # smaller than one element: the p2p parts refuse it
    with pytest.raises(PlanError, match="smaller than one element") as kept:
        plan_report(inp)
    with pytest.raises(PlanError, match="smaller than one element") as forked:
        plan_report(inp, keep_plans=False)
    assert str(kept.value) == str(forked.value) and kept.value.exit_code == forked.value.exit_code


def test_a_candidates_error_in_a_worker_is_raised_as_without_workers(monkeypatch):
    """A candidate layout planned beside the parts fails the report as it fails it planned afterwards."""
    monkeypatch.setenv("RESHARDCTL_PLAN_WORKERS", "2")
    inp = prepare(RefitRequest(model="tiny-llama", transport="all"), compare=["tp=4"])
    import reshardctl.plan_report as pr

    real = pr._candidate_figures

    def failing(inp_, transport, c):
        if c.spec == "tp=4":
            raise PlanError(f"candidate {c.spec} cannot be planned")
        return real(inp_, transport, c)

    monkeypatch.setattr(pr, "_candidate_figures", failing)
    with pytest.raises(PlanError, match="candidate tp=4") as kept:
        plan_report(inp)
    with pytest.raises(PlanError, match="candidate tp=4") as forked:
        plan_report(inp, keep_plans=False)
    assert str(kept.value) == str(forked.value)
