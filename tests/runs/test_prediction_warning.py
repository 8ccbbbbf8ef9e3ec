"""measured/predicted outside 0.5-2x warns, naming the cost term most likely wrong and the profile key
that sets it: a real run on a profile with a deliberately wrong figure, and the rule itself."""

from __future__ import annotations

import json

import yaml
from hypothesis import given, strategies as st

from reshardctl.cli import main
from reshardctl.runs.summary import PREDICTION_RANGE, prediction_warning

from helpers.runbook_helpers import site_profile


def test_a_wrong_checksum_figure_is_named_in_the_run_output_and_the_summary(tmp_path, capsys):
    from helpers.small_llama import SMALL_LLAMA

    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA))
    prof = tmp_path / "slow-checksum.yaml"
    data = yaml.safe_load(open(site_profile(tmp_path, "base", budget_s=60, state_dir=tmp_path / "state")))
    data["links"]["checksum_gbytes_per_s"] = 1e-4  # 100 kB/s: every checksum predicted thousands of times too slow
    prof.write_text(yaml.safe_dump(data))
    argv = ["run", "--site", str(prof), "--model", str(tmp_path / "config.json"), "--train", "tp=2", "--infer",
            "tp=2", "--transport", "gather_broadcast", "--iters", "1", "--warmup", "0"]
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    s = summary["transports"]["gather_broadcast"]
    assert s["measured_vs_predicted"] < PREDICTION_RANGE[0]
    w = s["prediction_warning"]
    assert w["term"] == "checksum" and w["phase"] == "verify"
    assert w["profile_key"].startswith("links.checksum_gbytes_per_s")
    assert w["term_s"] == s["predicted_breakdown_s"]["checksum"] > 1.0
    assert "warning: gather_broadcast: measured/predicted" in out and "most likely the `checksum` term" in out
    assert "links.checksum_gbytes_per_s" in out and "is too high" in out, out


def _figures(ratio: float, phases: dict[str, float], breakdown: dict[str, float]) -> dict:
    predicted = sum(breakdown.values())
    return {"transport": "reshard", "measured_vs_predicted": ratio, "predicted_s": predicted,
            "predicted_breakdown_s": breakdown, **{ph: {"median": v} for ph, v in phases.items()}}


BR = {"wire": 0.010, "latency": 0.002, "pack": 0.004, "checksum": 0.001, "sync": 0.001, "landing": 0.0}


@given(st.floats(min_value=PREDICTION_RANGE[0], max_value=PREDICTION_RANGE[1]))
def test_within_half_to_twice_there_is_no_warning(ratio):
    assert prediction_warning(_figures(ratio, {"transfer_s": 0.016, "verify_s": 0.002, "commit_s": 0.0}, BR)) is None


@given(st.floats(min_value=2.001, max_value=1e4))
def test_slower_than_twice_names_the_term_of_the_phase_that_took_longer(ratio):
    # the verify phase took 100 ms against 2 ms predicted; the transfer phase as predicted
    w = prediction_warning(_figures(ratio, {"transfer_s": 0.016, "verify_s": 0.100, "commit_s": 0.0}, BR))
    assert w is not None and w["phase"] == "verify" and w["term"] in ("checksum", "sync")
    assert "too low" in w["message"] and w["profile_key"] in w["message"]
    w = prediction_warning(_figures(ratio, {"transfer_s": 0.200, "verify_s": 0.002, "commit_s": 0.0}, BR))
    assert w["phase"] == "transfer" and w["term"] == "wire" and w["profile_key"].startswith("links.nic_gbits_per_s")


def test_a_run_without_a_prediction_has_no_warning():
    assert prediction_warning({"transport": "reshard", "measured_vs_predicted": None}) is None
