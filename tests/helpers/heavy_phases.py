"""Plans with heavy pairs: what ``heavy_phases`` chose, and that a stage's rounds run phase by phase."""

from __future__ import annotations

from unittest import mock

from reshardctl.plan import reshard
from reshardctl.plan.planner import build_plan
from reshardctl.plan.reshard import phase_of


def plan_and_heavy(*args, **kwargs):
    """``build_plan(*args, **kwargs)`` and what ``heavy_phases`` returned for stage 1 (None: not called
    or no schedule), and whether the plan's stage-1 rounds are that schedule (not first fit)."""
    got = []
    real = reshard.heavy_phases

    def spy(*a, **k):
        out = real(*a, **k)
        got.append(out)
        return out

    with mock.patch.object(reshard, "heavy_phases", spy):
        plan = build_plan(*args, **kwargs)
    heavy = got[0] if got else None
    stage1 = [r for r in plan.rounds if r.stage == 1]
    used = heavy is not None and [r.records() for r in stage1] == [ents for ents, _ in heavy[3]]
    return plan, heavy, used


def assert_phase_runs(plan, stage: int, phases: int) -> None:
    """Every round of ``stage`` holds pairs of one phase ((s + d) mod phases) only, and a phase's rounds
    are one run of consecutive rounds: so a pair of ranks meets only within one run."""
    seq = []
    for rnd in plan.rounds:
        if rnd.stage != stage:
            continue
        ph = set()
        for e in rnd.records():
            t = plan.units[e.unit].table
            ph |= set(phase_of(t.src[e.t_lo:e.t_hi], t.dst[e.t_lo:e.t_hi], phases).tolist())
        assert len(ph) == 1, f"round {rnd.index} mixes phases {sorted(ph)}"
        seq.append(ph.pop())
    assert seq == sorted(seq), f"a phase's rounds are not consecutive: {seq}"
