"""NCCL / CUDA checks, marked ``gpu``: they run only when asked (``make test-gpu``, i.e.
``RESHARDCTL_TEST_GPU=1``) on a machine with enough GPUs; the CPU suite never picks NCCL.

* the checksum gives the same value on CUDA as on the CPU (the pinned values of test_checksum.py);
* a refit on NCCL (data plane) with the gloo control plane is byte exact;
* a killed rank on NCCL ends the refit on every survivor within the bound, with records, and the
  survivors are not killed by the NCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=2: abort, not kill);
* `reshardctl selftest --gpu` passes every check (pack, checksums, stream order, pinned pool; the NCCL
  refit with >= 2 GPUs, skipped with one)."""

from __future__ import annotations

import json

import pytest
import torch

from reshardctl.cli import main
from reshardctl.errors import TransferError
from reshardctl.launch.local import run_local
from reshardctl.runtime.checksum import checksum, segment_checksums
from reshardctl.runtime.contract import RunOptions

from runtime_plans import p2p_plan, rows_cols_case
from test_checksum import PINNED_ARANGE
from test_runtime_faults import assert_previous_weights, drill_time, survivors_detect_within_bound

pytestmark = pytest.mark.gpu


def _gpus(n: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices")


def test_checksum_same_value_on_cuda_and_cpu():
    _gpus(1)
    assert checksum(torch.arange(256, dtype=torch.uint8).repeat(37).cuda()).tolist() == PINNED_ARANGE
    g = torch.Generator().manual_seed(5)
    buf = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=g)
    offs, sizes = [0, 1 << 20, 2 << 20], [1000001, 4097, (1 << 20) - 3]
    assert torch.equal(segment_checksums(buf, offs, sizes), segment_checksums(buf.cuda(), offs, sizes).cpu())


def test_nccl_refit_is_byte_exact(tmp_path):
    _gpus(4)
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda", dump_weights=True,
                                         full_check=True, timeout_s=30))
    assert all(r.ok and r.backend == "nccl" for r in reports)
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


def test_nccl_killed_rank_is_detected_and_survivors_report(tmp_path):
    _gpus(4)
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    timeout = 10.0
    with pytest.raises(TransferError) as info:
        run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=3, device="cuda", dump_weights=True,
                                   timeout_s=timeout, faults="kill:rank=1:phase=transfer:step=2"))
    err = info.value
    assert err.failures[0]["rank"] == 1
    assert len(err.failures) == 4  # three survivors reported (none killed by a watchdog)
    survivors_detect_within_bound(err, drill_time(tmp_path, 1), timeout + 10)
    assert_previous_weights(tmp_path, plan, 1, [2, 3])


def test_selftest_gpu_passes_every_check(capsys):
    _gpus(1)
    code = main(["selftest", "--gpu", "--json"])
    rep = json.loads(capsys.readouterr().out)
    failed = [(c["name"], c["detail"]) for c in rep["checks"] if not c["ok"]]
    assert code == 0 and rep["ok"] and not rep["skipped"] and failed == [], failed
    assert rep["device"].startswith("cuda:")
    checks = {c["name"]: c for c in rep["checks"]}
    assert list(checks) == ["pack_roundtrip", "checksums", "stream_order", "pinned_pool", "nccl_refit"]
    assert all(not c["skipped"] for n, c in checks.items() if n != "nccl_refit")
    assert checks["pinned_pool"]["numbers"]["peak_held"] <= checks["pinned_pool"]["numbers"]["capacity"]
    nccl = checks["nccl_refit"]
    if torch.cuda.device_count() >= 2:
        assert not nccl["skipped"] and nccl["numbers"]["backend"] == "nccl" and nccl["numbers"]["commits"] > 0
    else:
        assert nccl["skipped"]
