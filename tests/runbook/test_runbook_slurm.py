"""`rollback --verify` on a site whose profile says `launcher: slurm`: the validation refit runs as Slurm
jobs on the local test cluster (tests/slurm/cluster-up.sh), and the report shows the job. Skips when no
cluster answers, unless RESHARDCTL_REQUIRE_SLURM is set (as in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from reshardctl.cli import main
from reshardctl.site.loading import shipped_dir

from helpers.runbook_helpers import ledger_lines

pytestmark = pytest.mark.slurm  # jobs on the local test cluster


@pytest.fixture
def slurm_site(tmp_path) -> str:
    why = None
    if shutil.which("sbatch") is None:
        why = "no Slurm client (sbatch) on PATH: start the test cluster with tests/slurm/cluster-up.sh (root)"
    else:
        try:
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
            if "UP" not in ping.stdout:
                why = f"slurmctld does not answer (scontrol ping: {ping.stdout.strip() or ping.stderr.strip()})"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scontrol ping failed: {exc}"
    if why is not None:
        if os.environ.get("RESHARDCTL_REQUIRE_SLURM", "") not in ("", "0"):
            pytest.fail(f"RESHARDCTL_REQUIRE_SLURM is set but {why}")
        pytest.skip(why)
    data = yaml.safe_load((shipped_dir() / "slurm-local.yaml").read_text())
    assert data["launcher"] == "slurm"
    data["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "slurm-local.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_rollback_verify_runs_its_validation_refit_on_the_sites_slurm_launcher(tmp_path, slurm_site, small_llama,
                                                                              capsys):
    out = tmp_path / "check"
    assert main(["rollback", "--site", slurm_site, "--verify", "--model", small_llama, "--train", "tp=2", "--infer",
                 "tp=2", "--iters", "2", "--out", str(out), "--reason", "slurm drill"]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    sl = summary["slurm"]
    assert sl["job_ids"] and set(sl["states"].values()) == {"COMPLETED"}
    (e,) = [e for e in ledger_lines(tmp_path / "state", "slurm-local") if e["action"] == "rollback"]
    assert e["verdict"] == "rolled_back" and e["details"]["verified"] is True
    assert main(["report", str(out)]) == 0
    md = (out / "report" / "report.md").read_text()
    job = next(iter(sl["job_ids"].values()))
    assert "## Slurm jobs" in md and f"| {job} | COMPLETED |" in md
