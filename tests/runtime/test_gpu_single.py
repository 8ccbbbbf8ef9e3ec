"""The GPU tests one device can run (marked ``gpu``, no ``gpus(n)``: ``make test-gpu-one``): four ranks on
ONE GPU with gloo carrying the bytes through host memory (``RunOptions.device = "cuda-gloo"``,
runtime/host_staging.py): the executor's CUDA path (side stream, stream waits, release events), the
device checksums, the verify phase and the commit for real; and the bounded abort of a one-rank NCCL
group (benchmarks/one_device_nccl.py). NCCL itself between ranks needs one device per rank: test_gpu.py's
``gpus(4)`` tests. Not run yet: no GPU has been lent to this project."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from reshardctl.launch.local import run_local
from reshardctl.runtime.contract import RunOptions

from helpers.runtime_plans import alternating_plan, p2p_plan, rows_cols_case
from helpers.weight_checks import assert_previous_weights

pytestmark = pytest.mark.gpu
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _on_one_gpu(reports) -> None:
    assert all(r.ok and r.backend == "gloo" and r.device.startswith("cuda:") for r in reports), \
        [(r.global_rank, r.ok, r.backend, r.device, r.error_message) for r in reports]


def test_four_ranks_on_one_gpu_over_host_staged_gloo_refit_byte_exact(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda-gloo", dump_weights=True,
                                         full_check=True, timeout_s=30))
    _on_one_gpu(reports)
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


def test_buckets_over_two_sub_groups_on_one_gpu_with_the_baseline(tmp_path):
    plan = alternating_plan()
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda-gloo", dump_weights=True,
                                         full_check=True, timeout_s=30, baseline=True))
    _on_one_gpu(reports)
    assert all(r.baseline.get("broadcast_bytes", 0) > 0 for r in reports if r.global_rank in (2, 3))
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


def test_a_corrupted_byte_on_one_gpu_fails_verification_and_the_retry_commits(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=3, device="cuda-gloo", dump_weights=True,
                                         timeout_s=15, retries=1, faults="corrupt:rank=2:step=2"))
    _on_one_gpu(reports)
    assert [(a["step"], a["attempt"]) for a in reports[0].attempts] == [(2, 0), (2, 1)]
    assert "VerificationError" in reports[2].attempts[0]["outcome"]
    assert_previous_weights(tmp_path, plan, 3, [2, 3])


def test_a_one_rank_nccl_group_is_aborted_within_the_bound_and_the_process_lives(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import one_device_nccl
    finally:
        sys.path.remove(str(BENCHMARKS))
    detail = one_device_nccl.step_nccl_abort({"cpu": False, "out": tmp_path, "device": torch.device("cuda", 0)})
    assert detail["exit"] == 0 and detail["child"]["finished"], detail
    assert any(p["outcome"] == "timeout" and p["groups_aborted"] for p in detail["child"]["phases"]), detail
