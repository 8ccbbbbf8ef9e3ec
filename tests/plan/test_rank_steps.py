"""A rank's p2p steps from the vectorised pass (``Plan.steps_for``, plan/rank_steps.py) equal the
per-entry loop (tests/helpers/steps_reference.py) on every rank of random plans and of a few DeepSeek-V3
layers (phased rounds, relays, first-fit rounds with split instances)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.planner_scenarios import SCALE, SETTINGS, scenario_plan, scenarios
from helpers.steps_reference import reference_p2p_steps
from reshardctl.plan.schedule import P2PRound


def _same_on_every_rank(plan) -> None:
    for rank in range(plan.world):
        got = [s for s in plan.steps_for(rank) if isinstance(s, P2PRound)]
        assert got == reference_p2p_steps(plan, rank), f"rank {rank}"


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(s=scenarios(), relay=st.booleans(), transport=st.sampled_from(["reshard", "hybrid"]))
def test_steps_for_equals_per_entry_loop(s, relay, transport):
    _same_on_every_rank(scenario_plan(s, transport, relay))


def test_steps_for_equals_per_entry_loop_on_deepseek_layers():
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    model = load_model("deepseek-v3", layers=4)
    train = build_layout(model, "train", "pp=2,ep=4")
    for spec, relay, bucket in (("tp=8,dp=2", True, 256 << 20), ("tp=4,dp=2", False, 8 << 20)):
        infer = build_layout(model, "infer", spec)
        topo = Topology(train.world_size, infer.world_size, 8, 1)
        _same_on_every_rank(build_plan(model, train, infer, topo, transport="reshard", bucket_bytes=bucket,
                                       relay=relay))
