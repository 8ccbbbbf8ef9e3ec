"""`bench --mtp` then `promote`: the runbook re-plans the run from the request recorded in summary.json,
so a run with MTP layers is promoted like any other (issue 28: the command.txt replay forgot --mtp and
refused it as stale). A run without a request (older code) or with a tampered one is bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.runbook_helpers import ledger_lines, site_profile


@pytest.fixture(scope="module")
def mtp_bench(tmp_path_factory) -> tuple[Path, dict]:
    """(run directory, summary) of one real bench of tiny-deepseek with its MTP layer (tp=1 -> tp=1)."""
    d = tmp_path_factory.mktemp("mtp-bench")
    out = d / "bench"
    assert main(["bench", "--model", "tiny-deepseek", "--mtp", "--train", "tp=1", "--infer", "tp=1",
                 "--iters", "1", "--warmup", "0", "--out", str(out)]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_bench_with_mtp_then_promote_and_rollback_verify_keep_mtp(tmp_path, mtp_bench, capsys):
    out, summary = mtp_bench
    state = tmp_path / "state"
    roomy = site_profile(tmp_path, "roomy", budget_s=60, state_dir=state)
    assert summary["request"]["mtp"] is True and summary["request"]["model"] == "tiny-deepseek"
    assert json.loads((out / "session.json").read_text())["request"] == summary["request"]
    # the plan fingerprint re-planned today is the run's: not stale (the bug), whatever the timing says
    capsys.readouterr()
    code = main(["promote", "--site", roomy, "--run", str(out), "--transport", "hybrid", "--force", "--reason",
                 "timing on a shared machine", "--json"])
    res = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["plan fingerprint"]["ok"], checks["plan fingerprint"]
    assert code == 0 and res["decision"]["verdict"] in ("promoted", "forced")
    assert "plan fingerprint" not in res["decision"]["details"]["failed"]
    promoted = [e for e in ledger_lines(state) if e["action"] == "promote"][-1]
    assert promoted["details"]["inputs"]["mtp"] is True
    # rollback --verify replays the promoted run's inputs, MTP layers included
    rb = tmp_path / "rollback-check"
    assert main(["rollback", "--site", roomy, "--verify", "--iters", "1", "--out", str(rb)]) == 0
    rb_summary = json.loads((rb / "summary.json").read_text())
    assert rb_summary["request"]["mtp"] is True and rb_summary["request"]["run"]["transports"] == ["gather_broadcast"]
    assert rb_summary["inputs"]["num_tensors"] == summary["inputs"]["num_tensors"]


@pytest.mark.parametrize("change, says", [
    (lambda s: s.pop("request"), "has no `request`: this run was recorded by an older reshardctl; bench again"),
    (lambda s: s["request"].update(mtp="yes"), "`request.mtp` must be true/false, got 'yes'"),
    (lambda s: s["request"].update(format="reshardctl-request/2"), "written by a newer reshardctl"),
    (lambda s: s["request"]["run"].pop("iterations"), "`request.run.iterations` is missing"),
], ids=["older", "mtp-str", "newer", "run-key-missing"])
def test_a_run_without_or_with_a_bad_request_is_bad_input(tmp_path, mtp_bench, capsys, change, says):
    run = tmp_path / "run"
    shutil.copytree(mtp_bench[0], run)
    s = json.loads((run / "summary.json").read_text())
    change(s)
    (run / "summary.json").write_text(json.dumps(s))
    state = tmp_path / "state"
    site = site_profile(tmp_path, "s", budget_s=60, state_dir=state)
    capsys.readouterr()
    assert main(["promote", "--site", site, "--run", str(run), "--transport", "hybrid"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{run}: summary.json" in err and says in err and "Traceback" not in err, err
    assert ledger_lines(state) == []  # nothing recorded


def test_rollback_verify_assumes_no_model(tmp_path, capsys):
    """Layout flags without --model: bad input, nothing runs (the runbook used to validate tiny-llama
    silently)."""
    state = tmp_path / "state"
    site = site_profile(tmp_path, "s", budget_s=60, state_dir=state)
    capsys.readouterr()
    assert main(["rollback", "--site", site, "--verify", "--train", "tp=1", "--infer", "tp=1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the layout flags name no --model (no model is assumed)" in err and ledger_lines(state) == []
