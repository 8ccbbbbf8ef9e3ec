"""The promotion gate looks at the tail too: the candidate's p90 refit must be within the budget and not
worse than gather_broadcast's p90 in the same run, and every verdict quotes both medians and p90s.

One real bench run (tp=2 -> tp=2); each case is a copy of it whose timed refits say what the case needs
(a shared machine cannot produce a faster median with a worse tail on demand): the request, the plan
fingerprints and the verification stay the bench's own, so every other condition passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.runbook_helpers import ledger_lines, site_profile


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    from helpers.small_llama import SMALL_LLAMA

    d = tmp_path_factory.mktemp("tail-bench")
    (d / "config.json").write_text(json.dumps(SMALL_LLAMA))
    out = d / "bench"
    assert main(["bench", "--model", str(d / "config.json"), "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--warmup", "0", "--out", str(out)]) == 0
    return out


def _with_refits(bench_dir: Path, dest: Path, refits: dict[str, list[float]]) -> str:
    """A copy of the bench run whose transports' timed refits (seconds per iteration) are ``refits``."""
    shutil.copytree(bench_dir, dest)
    f = dest / "summary.json"
    summary = json.loads(f.read_text())
    summary["run_dir"] = str(dest)
    for t, values in refits.items():
        s = sorted(values)
        fig = summary["transports"][t]["refit_s"]
        fig.update(all=values, median=s[len(s) // 2], p90=s[-1], min=s[0], slowest_rank=[0] * len(values))
        summary["transports"][t]["iterations"] = len(values)
    f.write_text(json.dumps(summary))
    return str(dest)


def _promote(site: str, run: str, capsys) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["promote", "--site", site, "--run", run, "--transport", "reshard", "--json"])
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    return code, {c["name"]: c for c in out["checks"]}, cap.err


def test_a_faster_median_with_a_worse_p90_is_refused_with_the_numbers(tmp_path, bench_dir, capsys):
    # the case: reshard 2.27x faster at the median, but its p90 worse than gather_broadcast's
    state = tmp_path / "state"
    site = site_profile(tmp_path, "roomy", budget_s=60, state_dir=state)
    run = _with_refits(bench_dir, tmp_path / "run", {"reshard": [0.010, 0.010, 0.050],
                                                     "gather_broadcast": [0.0227, 0.0227, 0.030]})
    code, checks, _ = _promote(site, run, capsys)
    assert code == 1
    beat = checks["beats gather_broadcast"]
    assert not beat["ok"]
    assert beat["detail"] == ("median 10.0 ms vs gather_broadcast 22.7 ms (2.27x faster); p90 50.0 ms vs 30.0 ms "
                              "(1.67x the baseline's time): its p90 is worse than gather_broadcast's")
    assert checks["budget"]["ok"] and checks["budget"]["detail"].startswith("median 10.0 ms, p90 50.0 ms <= budget")
    assert ledger_lines(state)[-1]["verdict"] == "refused"
    assert ledger_lines(state)[-1]["details"]["failed"] == ["beats gather_broadcast"]
    # without --json the refusal says the condition and its numbers on stderr, exit 1
    capsys.readouterr()
    assert main(["promote", "--site", site, "--run", run, "--transport", "reshard"]) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert "beats gather_broadcast:" in err and "p90 50.0 ms vs 30.0 ms" in err, err


def test_a_p90_over_the_budget_is_refused_though_the_median_is_within(tmp_path, bench_dir, capsys):
    site = site_profile(tmp_path, "tight", budget_s=0.04, state_dir=tmp_path / "state")
    run = _with_refits(bench_dir, tmp_path / "run", {"reshard": [0.010, 0.010, 0.045],
                                                     "gather_broadcast": [0.030, 0.030, 0.050]})
    code, checks, _ = _promote(site, run, capsys)
    assert code == 1
    assert not checks["budget"]["ok"]
    assert checks["budget"]["detail"].startswith("p90 45.0 ms > budget 40.0 ms (refit.latency_budget_s of ")
    assert checks["beats gather_broadcast"]["ok"]  # the tail beats the baseline's: only the budget fails
    measured = {e["transport"]: e["verdict"] for e in ledger_lines(tmp_path / "state") if e["action"] == "measure"}
    assert measured["reshard"] == "over_budget"  # recorded on the tail too, not on the median alone


def test_median_and_p90_both_better_and_within_budget_is_promoted_quoting_both(tmp_path, bench_dir, capsys):
    site = site_profile(tmp_path, "roomy", budget_s=60, state_dir=tmp_path / "state")
    run = _with_refits(bench_dir, tmp_path / "run", {"reshard": [0.010, 0.010, 0.030],
                                                     "gather_broadcast": [0.0227, 0.0227, 0.030]})
    code, checks, _ = _promote(site, run, capsys)
    assert code == 0, checks
    assert checks["budget"]["detail"].startswith("median 10.0 ms, p90 30.0 ms <= budget 60.000 s")
    assert checks["beats gather_broadcast"]["detail"] == (
        "median 10.0 ms vs gather_broadcast 22.7 ms (2.27x faster); p90 30.0 ms vs 30.0 ms (1.00x the baseline's time)")
