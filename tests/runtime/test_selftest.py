"""`reshardctl selftest`: the CPU checks pass through the real CLI, `--gpu` without CUDA is skipped (exit 0,
"skipped": true), and every check can fail (a fault injected on purpose: FAILED, exit 1)."""

from __future__ import annotations

import json

import pytest
import torch

from reshardctl.cli import main
from reshardctl.commands.selftest_refit import check_nccl_refit, nccl_layouts
from reshardctl.runtime import selftest
from reshardctl.runtime.selftest import CPU_CHECKS, run_selftest


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_cpu_selftest_passes_through_the_cli(capsys):
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.split() and line.split()[0] in CPU_CHECKS]
    assert [line.split()[0] for line in lines] == list(CPU_CHECKS)
    assert all(line.split()[1] == "ok" for line in lines)
    assert f"all {len(CPU_CHECKS)} checks passed" in out and "FAILED" not in out
    assert main(["selftest", "--json"]) == 0
    rep = _json(capsys)
    assert rep["ok"] and not rep["skipped"] and rep["device"] == "cpu"
    assert [c["name"] for c in rep["checks"]] == list(CPU_CHECKS) and all(c["ok"] for c in rep["checks"])
    nums = {c["name"]: c["numbers"] for c in rep["checks"]}
    assert nums["pack_roundtrip"]["regions"] == 16 and nums["checksums"]["corruptions_detected"] == "4/4"
    assert nums["pinned_pool"]["peak_held"] <= nums["pinned_pool"]["capacity"]


def test_gpu_without_cuda_is_skipped_and_says_why(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["selftest", "--gpu"]) == 0
    out = capsys.readouterr().out
    assert "GPU checks skipped: no CUDA device" in out and "torch.cuda.is_available() is False" in out
    assert main(["selftest", "--gpu", "--json"]) == 0
    rep = _json(capsys)
    assert rep["skipped"] is True and rep["ok"] is True and rep["checks"] == [] and "no CUDA device" in rep["why"]


@pytest.mark.parametrize("check", CPU_CHECKS)
def test_each_check_can_fail(capsys, check):
    assert main(["selftest", "--json", "--inject-fault", check]) == 1
    rep = _json(capsys)
    status = {c["name"]: c["ok"] for c in rep["checks"]}
    assert rep["ok"] is False and status[check] is False
    assert all(ok for name, ok in status.items() if name != check)
    failed = next(c for c in rep["checks"] if c["name"] == check)
    assert failed["detail"]  # says what differed
    assert main(["selftest", "--inject-fault", check]) == 1
    out = capsys.readouterr().out
    assert f"{check}" in out and "FAILED" in out and f"1 of {len(CPU_CHECKS)} checks FAILED" in out


def test_a_check_that_raises_is_failed_and_the_others_still_run(monkeypatch):
    def boom(device, corrupt=False):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setitem(selftest._CHECK_FUNCS, "checksums", boom)
    rep = run_selftest(False)
    assert not rep.ok and [c.ok for c in rep.checks] == [name != "checksums" for name in CPU_CHECKS]
    assert "RuntimeError: no kernel image" in rep.checks[CPU_CHECKS.index("checksums")].detail


def test_unknown_fault_name_is_a_usage_error(capsys):
    assert main(["selftest", "--inject-fault", "bogus"]) == 2
    assert "the checks are" in capsys.readouterr().err


def test_nccl_refit_is_skipped_on_one_gpu_and_sized_to_the_gpus():
    res = check_nccl_refit(torch.device("cpu"), gpus=1)
    assert res.skipped and res.ok and "one GPU cannot host several NCCL ranks" in res.detail
    assert nccl_layouts(1) is None and nccl_layouts(0) is None
    assert nccl_layouts(2) == nccl_layouts(3) == ("tp=1", "tp=1")
    assert nccl_layouts(8) == ("tp=2", "tp=1,dp=2")
