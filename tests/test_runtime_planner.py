"""The runtime executes the planner's own plans (every transport) byte-exactly."""

from __future__ import annotations

import pytest

from reshardctl.launch.local import run_local
from reshardctl.plan.planner import build_plan
from reshardctl.runtime.contract import ExecutablePlan, RunOptions, StaticPlan
from reshardctl.topology import Topology

from plan_fixtures import SplitLayout, toy_model
from test_runtime_dist import assert_inference_weights


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
    frozen = StaticPlan.freeze(plan)
    reports = run_local(frozen, RunOptions(run_dir=str(tmp_path), iterations=2, timeout_s=15, full_check=True,
                                           dump_weights=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, frozen, 2)
    assert max(r.peak_staging_bytes for r in reports) <= 4 * plan.bucket_bytes + 4096


def test_a_phased_plan_runs_byte_exact(tmp_path):
    """Real gloo ranks execute a plan whose rounds are phases (each pair of ranks meets in one round,
    plan/reshard.py) byte-exactly, within the staging bound."""
    import numpy as np

    from reshardctl.plan.reshard import phases_of_stage

    m = toy_model([(16, 8)] * 6, roles=["ffn"] * 6, dtype=["float32"] * 6)
    train = SplitLayout(m, "train", shards=4, dims=(0,))
    infer = SplitLayout(m, "infer", shards=4, dims=(1,))
    topo = Topology(4, 4, gpus_per_node=4, nodes_per_domain=1)
    plan = build_plan(m, train, infer, topo, transport="reshard", bucket_bytes=200)
    us = plan.units
    phases, _ = phases_of_stage(np.concatenate([u.table.src for u in us]), np.concatenate([u.table.dst for u in us]),
                                np.concatenate([u.table.nbytes * len(u.tensors) for u in us]).astype(np.float64),
                                plan.world, plan.bucket_bytes)
    assert phases > 1 and len(plan.rounds) > 1
    frozen = StaticPlan.freeze(plan)
    reports = run_local(frozen, RunOptions(run_dir=str(tmp_path), iterations=2, timeout_s=15, full_check=True,
                                           dump_weights=True))
    assert all(r.ok for r in reports)
    assert_inference_weights(tmp_path, frozen, 2)
    assert max(r.peak_staging_bytes for r in reports) <= 4 * plan.bucket_bytes + 4096
