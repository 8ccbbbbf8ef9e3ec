"""measured/predicted outside 0.5-2x warns, naming the cost term most likely wrong and the profile key
that sets it: a real run on a profile with a deliberately wrong figure, and the rule itself."""

from __future__ import annotations

import json

import pytest
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
    assert w["term"] == "checksum" and w["factor"] < 0.5  # the checksums ran faster than the figure says
    assert w["profile_key"].startswith("links.checksum_gbytes_per_s")
    assert w["term_s"] == s["predicted_breakdown_s"]["checksum"] > 1.0
    assert "warning: gather_broadcast: measured/predicted" in out and "most likely the `checksum` term is off" in out
    assert "links.checksum_gbytes_per_s" in out, out


TRUE = {"transfer": {"wire": 0.010, "latency": 0.002, "pack": 0.004, "checksum": 0.001},
        "verify": {"checksum": 0.001, "sync": 0.001}, "commit": {"landing": 0.0}}


def _figures(wrong: str, factor: float) -> dict:
    """A transport's figures whose phases took the seconds of ``TRUE`` with ``wrong`` 25 times its share
    there, predicted with ``wrong`` off by ``factor``."""
    true = {ph: {t: v * (25 if t == wrong else 1) for t, v in terms.items()} for ph, terms in TRUE.items()}
    pred = {ph: {t: v * (factor if t == wrong else 1) for t, v in terms.items()} for ph, terms in true.items()}
    breakdown: dict[str, float] = {}
    for terms in pred.values():
        for t, v in terms.items():
            breakdown[t] = breakdown.get(t, 0.0) + v
    measured = sum(sum(t.values()) for t in true.values())
    return {"transport": "reshard", "measured_vs_predicted": measured / sum(breakdown.values()),
            "predicted_s": sum(breakdown.values()), "predicted_breakdown_s": breakdown, "predicted_phases_s": pred,
            **{f"{ph}_s": {"median": sum(terms.values())} for ph, terms in true.items()}}


@given(st.sampled_from(["wire", "checksum", "sync"]), st.floats(min_value=0.6, max_value=1.6))
def test_a_prediction_within_half_to_twice_gives_no_warning(wrong, factor):
    s = _figures(wrong, factor)
    assert PREDICTION_RANGE[0] <= s["measured_vs_predicted"] <= PREDICTION_RANGE[1]
    assert prediction_warning(s) is None


@given(st.sampled_from(["checksum", "sync"]), st.one_of(st.floats(min_value=1e-3, max_value=0.05),
                                                        st.floats(min_value=10, max_value=1e3)))
def test_a_term_off_by_far_is_the_one_named_with_its_profile_key(wrong, factor):
    s = _figures(wrong, factor)
    w = prediction_warning(s)
    assert not PREDICTION_RANGE[0] <= s["measured_vs_predicted"] <= PREDICTION_RANGE[1]
    assert w is not None and w["term"] == wrong, (w, s)
    assert w["factor"] == pytest.approx(1 / factor, rel=1e-6)  # measured over predicted, for that term
    assert w["profile_key"] in w["message"] and f"most likely the `{wrong}` term is off" in w["message"]


def test_a_wire_figure_far_too_slow_is_named():
    w = prediction_warning(_figures("wire", 100.0))
    assert w["term"] == "wire" and w["profile_key"].startswith("links.nic_gbits_per_s")


def test_a_run_without_a_prediction_has_no_warning():
    assert prediction_warning({"transport": "reshard", "measured_vs_predicted": None}) is None


@pytest.mark.parametrize("transport", ["reshard", "gather_broadcast", "hybrid"])
@pytest.mark.parametrize("cpu", [False, True])
def test_the_predicted_phases_split_the_breakdown_term_by_term(transport, cpu):
    from helpers.plan_fixtures import SplitLayout, toy_model
    from reshardctl.plan.cost import Links, predict
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    model = toy_model([(512, 512)] * 3, ["ffn"] * 3)
    train, infer = SplitLayout(model, "train", 4, dims=(0,)), SplitLayout(model, "infer", 4, dims=(0,))
    plan = build_plan(model, train, infer, Topology(4, 4, 4, 1), transport=transport, bucket_bytes=1 << 20)
    links = Links(nvlink=2e9, nic=2e9, node_nic=3e9, nvlink_latency=50e-6, nic_latency=50e-6, launch=300e-6,
                  copy=3e9, checksum=3e9, **(dict(host=3e9, broadcast=2.5e9, cores=2, copy_all=6e9, checksum_all=5e9)
                                             if cpu else {}))
    pred = predict(plan, links, land=False)
    assert set(pred.phases) == {"transfer", "verify", "commit"} and set(pred.phases["verify"]) == {"checksum", "sync"}
    for term, seconds in pred.breakdown.items():
        parts = [terms.get(term, 0.0) for terms in pred.phases.values()]
        assert all(p >= -1e-12 for p in parts) and sum(parts) == pytest.approx(seconds, rel=1e-9, abs=1e-15)
    assert pred.phases["verify"]["sync"] == pred.breakdown["sync"] > 0
    if transport != "gather_broadcast":  # p2p rounds checksum what landed after the last round
        assert pred.phases["verify"]["checksum"] > 0
