"""The local test cluster (tests/slurm/cluster-up.sh) as the Slurm tests see it: is it there, and small
helpers of tests that run on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest


def cluster_problem() -> str | None:
    """Why no Slurm cluster answers here (None: one does)."""
    if shutil.which("sbatch") is None:
        return "no Slurm client (sbatch) on PATH: start the test cluster with tests/slurm/cluster-up.sh (root)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    if "UP" not in ping.stdout:
        return f"slurmctld does not answer (scontrol ping: {ping.stdout.strip() or ping.stderr.strip()})"
    return None


def require_cluster() -> None:
    """Skip the test when no cluster answers; fail it instead under RESHARDCTL_REQUIRE_SLURM=1 (CI)."""
    why = cluster_problem()
    if why is not None:
        if os.environ.get("RESHARDCTL_REQUIRE_SLURM", "") not in ("", "0"):
            pytest.fail(f"RESHARDCTL_REQUIRE_SLURM is set but {why}")
        pytest.skip(why)


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def wait_for(cond, timeout_s: float = 120.0, what: str = "") -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.3)
