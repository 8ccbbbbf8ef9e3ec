"""The self-test's ``nccl_refit`` check (`reshardctl selftest --gpu`, >= 2 GPUs): a real
`reshardctl run --model tiny-llama --transport reshard` through the local launcher, one NCCL rank per GPU,
in a child process (a fresh CUDA context; the ranks take NCCL through ``RESHARDCTL_BACKEND``). Passes when
the run verified, its record says ``nccl`` and the ranks committed; the run directory is read through
``runs/records.py`` (summary.json, the event logs). With one GPU it is skipped: NCCL needs one device
per rank. ``corrupt`` (``--inject-fault nccl_refit``) adds a corrupt-drill, to prove the check can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from reshardctl.errors import InputError
from reshardctl.runs.records import event_logs, events_dir, read_summary, run_events
from reshardctl.runtime.selftest import CheckResult

NAME = "nccl_refit"


def nccl_layouts(gpus: int) -> tuple[str, str] | None:
    """(--train, --infer) for a refit on at most ``gpus`` GPUs (one rank per GPU), or None."""
    if gpus >= 4:
        return "tp=2", "tp=1,dp=2"  # 2 + 2 ranks: a real reshard (tp halves -> full replicas)
    if gpus >= 2:
        return "tp=1", "tp=1"  # 1 + 1 ranks
    return None


def run_outcome(out: Path) -> dict[str, Any]:
    """What the run in ``out`` left: ``verified`` (summary.json: ok and the reshard transport verified),
    ``backend`` (its record), ``ranks`` (event logs) and ``commits`` (commit events that committed)."""
    verified, backend = False, None
    try:
        run = read_summary(out, flag="selftest")
        backend = (run.summary.get("record") or {}).get("backend")
        verified = bool(run.summary.get("ok")) and run.verified("reshard")
    except InputError:
        pass  # no summary (the run failed before it): verified stays False, the detail says why
    commits = sum(bool(e.get("phase") == "commit" and e.get("committed")) for e in run_events(out))
    return {"verified": verified, "backend": backend, "ranks": len(event_logs(events_dir(out))), "commits": commits}


def check_nccl_refit(device: torch.device, corrupt: bool = False, *, gpus: int | None = None,
                     timeout_s: float = 480.0) -> CheckResult:
    gpus = torch.cuda.device_count() if gpus is None else gpus
    layouts = nccl_layouts(gpus)
    what = "reshardctl run --model tiny-llama (local launcher, one NCCL rank per GPU) committed every refit"
    if layouts is None:
        return CheckResult(NAME, True, what, {"gpus": gpus}, skipped=True,
                           detail=f"{gpus} GPU: one GPU cannot host several NCCL ranks (NCCL needs one device "
                                  "per rank); run on a node with >= 2 GPUs")
    train, infer = layouts
    torch.cuda.empty_cache()  # this process's cached blocks from the other checks, before the ranks start
    with tempfile.TemporaryDirectory(prefix="reshardctl-selftest-") as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "reshardctl", "run", "--model", "tiny-llama", "--train", train, "--infer",
                infer, "--transport", "reshard", "--iters", "2", "--warmup", "1", "--timeout-s", "60",
                "--out", str(out), "--json"]
        if corrupt:
            argv += ["--inject", "corrupt:rank=1"]
        env = {k: v for k, v in os.environ.items() if k != "RESHARDCTL_FORCE_CPU"}
        env["RESHARDCTL_BACKEND"] = "nccl"  # for the ranks; the local launcher itself takes NCCL when each rank has a GPU
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return CheckResult(NAME, False, what, {"gpus": gpus}, detail=f"no result within {timeout_s:g} s")
        numbers: dict[str, Any] = {"gpus": gpus, "train": train, "infer": infer, "exit": proc.returncode,
                                   "wall_s": time.perf_counter() - t0}
        got = run_outcome(out)
        verified, backend, commits = got["verified"], got["backend"], got["commits"]
        numbers.update(backend=backend, ranks=got["ranks"], commits=commits)
        ok = proc.returncode == 0 and verified and backend == "nccl" and commits > 0
        detail = ""
        if not ok:
            why = [] if backend == "nccl" else [f"backend {backend!r}, not nccl"]
            if proc.returncode != 0 or not verified:
                why.append(f"exit {proc.returncode}, verified={verified}: {(proc.stderr or proc.stdout)[-400:].strip()}")
            if commits == 0:
                why.append("no committed refit in the events")
            detail = "; ".join(why)
        return CheckResult(NAME, ok, what, numbers, detail=detail)


GPU_CHECKS = {NAME: check_nccl_refit}  # the CLI's own checks, after the runtime's (runtime/selftest.py)
