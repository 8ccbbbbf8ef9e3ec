"""The runtime executes the planner's own plans (every transport) byte-exactly."""

from __future__ import annotations

import pytest

from reshardctl.launch.local import run_local
from reshardctl.plan.planner import build_plan
from reshardctl.runtime.contract import ExecutablePlan, RunOptions
from reshardctl.topology import Topology

from helpers.plan_fixtures import SplitLayout, stage_phases, toy_model
from helpers.weight_checks import assert_inference_weights


@pytest.mark.parametrize("transport,relay", [("reshard", False), ("reshard", True), ("gather_broadcast", False),
                                             ("hybrid", False)])
def test_planner_plans_run_byte_exact(tmp_path, transport, relay):
    m = toy_model([(12, 10), (7, 6), (9,), (5, 3)], roles=["ffn", "attention", "norm", "expert"],
                  dtype=["bfloat16", "float32", "float32", "float8_e4m3fn"])
    train = SplitLayout(m, "train", shards=2, dims=(0,))
    infer = SplitLayout(m, "infer", shards=2, replicas=2, dims=(1, 0))
    topo = Topology(2, 4, gpus_per_node=2, nodes_per_domain=1)
    plan = build_plan(m, train, infer, topo, transport=transport, bucket_bytes=256, relay=relay)
    assert isinstance(plan, ExecutablePlan)
    _runs_byte_exact(tmp_path, plan)


def test_a_phased_plan_runs_byte_exact(tmp_path):
    """Real gloo ranks execute a plan whose rounds are phases (each pair of ranks meets in one round,
    plan/reshard.py) byte-exactly, within the staging bound."""
    m = toy_model([(16, 8)] * 6, roles=["ffn"] * 6, dtype=["float32"] * 6)
    train = SplitLayout(m, "train", shards=4, dims=(0,))
    infer = SplitLayout(m, "infer", shards=4, dims=(1,))
    topo = Topology(4, 4, gpus_per_node=4, nodes_per_domain=1)
    plan = build_plan(m, train, infer, topo, transport="reshard", bucket_bytes=200)
    assert stage_phases(plan, 1) > 1 and len(plan.rounds) > 1
    _runs_byte_exact(tmp_path, plan)


def test_a_heavy_phased_plan_runs_byte_exact(tmp_path):
    """Real gloo ranks execute a plan whose (src, dst) pairs each exceed the small bucket, so its phases
    take several consecutive rounds each (plan/reshard.py ``heavy_phases``), byte-exactly, within the
    staging bound."""
    from helpers.heavy_phases import assert_phase_runs, plan_and_heavy

    m = toy_model([(16, 8)] * 6, roles=["ffn"] * 6, dtype=["float32"] * 6)
    train = SplitLayout(m, "train", shards=4, dims=(0,))
    infer = SplitLayout(m, "infer", shards=4, dims=(1,))
    topo = Topology(4, 4, gpus_per_node=4, nodes_per_domain=1)
    plan, heavy, used = plan_and_heavy(m, train, infer, topo, transport="reshard", bucket_bytes=48, relay=False)
    assert used and heavy[0] > 1 and stage_phases(plan, 1) == 1
    assert len(plan.rounds) > heavy[0]  # some phase takes several rounds
    assert_phase_runs(plan, 1, heavy[0])
    _runs_byte_exact(tmp_path, plan)


def _runs_byte_exact(tmp_path, plan) -> None:
    """Two refits on real gloo ranks, fully checked; every inference rank's weights are the trainer's
    step-2 weights; staging stayed within the bound (plus the checksum trailers)."""
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, timeout_s=15, full_check=True,
                                           dump_weights=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, plan, 2)
    assert max(r.peak_staging_bytes for r in reports) <= 4 * plan.bucket_bytes + 4096
