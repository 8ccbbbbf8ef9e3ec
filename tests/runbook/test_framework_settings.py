"""promote --write / rollback --write emit NeMo RL settings only for what NeMo RL runs as measured: a measured
hybrid of a MoE model on layouts nccl_reshard accepts -> nccl_reshard; reshard (no NeMo RL value) and any
other hybrid -> the reshardctl.api settings (RESHARDCTL_SITE, refit_transport null), never nccl_reshard;
gather_broadcast -> NeMo RL's null; an inference layout NeMo RL cannot refit -> refused, nothing recorded
or written. Runs are minimal summary.json files promoted with --force (the evidence is not the point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reshardctl.cli import main
from reshardctl.request.request import RefitRequest, RunSettings

from helpers.runbook_helpers import api_settings, ledger_lines, site_profile

MOE_TRAIN = "megatron tp=2,pp=1,dp=1,ep=2,etp=1,edp=1,vocab_divisor=none"
MOE_INFER = "vllm tp=2,pp=1,dp=1,expert_parallel=on,ep=2"
DENSE_TRAIN = "megatron tp=2,pp=1,dp=1,vocab_divisor=none"
DENSE_INFER = "vllm tp=2,pp=1,dp=1"


def _run(tmp_path: Path, name: str, train: str, infer: str) -> str:
    d = tmp_path / name
    d.mkdir()
    fig = {"median": 0.5, "p90": 0.5, "min": 0.5, "all": [0.5]}
    per = {"fingerprint": "f", "iterations": 1, "verified": True, "failures": [], "refit_s": fig}
    (d / "summary.json").write_text(json.dumps({
        "run_dir": str(d), "command": "reshardctl bench", "ok": True,
        "inputs": {"site": "local", "model": "tiny-llama", "train": train, "infer": infer},
        "request": RefitRequest(run=RunSettings(transports=("reshard", "hybrid"))).to_json(),
        "transports": {"reshard": per, "hybrid": per, "gather_broadcast": {**per, "refit_s": {**fig, "median": 1}}}}))
    return str(d)


def _promote(site: str, run: str, transport: str, write: Path) -> int:
    return main(["promote", "--site", site, "--run", run, "--transport", transport, "--force", "--reason", "t",
                 "--write", str(write)])


@pytest.fixture
def site(tmp_path) -> tuple[str, Path]:
    state = tmp_path / "state"
    return site_profile(tmp_path, "fw", budget_s=60, state_dir=state), state


def test_a_measured_moe_hybrid_maps_to_nccl_reshard(tmp_path, site, capsys):
    out = tmp_path / "s.yaml"
    assert _promote(site[0], _run(tmp_path, "moe", MOE_TRAIN, MOE_INFER), "hybrid", out) == 0
    assert yaml.safe_load(out.read_text()) == {
        "policy": {"generation": {"colocated": {"enabled": False}, "refit_transport": "nccl_reshard"}}}
    assert "routed-expert" in out.read_text() and "ETP" in out.read_text()
    assert "refit_transport: nccl_reshard" in capsys.readouterr().out


@pytest.mark.parametrize("transport,train,infer,why", [
    ("reshard", MOE_TRAIN, MOE_INFER, "NeMo RL has no refit_transport that runs reshard"),
    ("reshard", DENSE_TRAIN, DENSE_INFER, "NeMo RL has no refit_transport that runs reshard"),
    ("hybrid", DENSE_TRAIN, DENSE_INFER, "reshards only routed experts and the run's model has none"),
    ("hybrid", MOE_TRAIN.replace("etp=1", "etp=2"), MOE_INFER, "Megatron ETP = 1; the run has etp=2"),
    ("hybrid", MOE_TRAIN, MOE_INFER.replace("pp=1", "pp=2"), "generation-side PP = 1; the run has pp=2"),
    ("hybrid", MOE_TRAIN, MOE_INFER.replace("ep=2", "ep=4"), "ep=4, tp=2"),
    ("hybrid", "dtensor 3 rules, world=2", MOE_INFER, "Megatron policy backend"),
])
def test_what_nemo_rl_would_not_run_as_measured_gets_the_reshardctl_api_settings(
        tmp_path, site, capsys, transport, train, infer, why):
    out = tmp_path / "s.yaml"
    assert _promote(site[0], _run(tmp_path, "r", train, infer), transport, out) == 0
    text = out.read_text()
    assert "nccl_reshard" not in yaml.safe_dump(yaml.safe_load(text)) and why in text
    assert yaml.safe_load(text) == api_settings(str(Path(site[0]).resolve()))
    assert 'site=os.environ["RESHARDCTL_SITE"]' in text
    assert ledger_lines(site[1])[-1]["transport"] == transport


def test_rollback_write_is_nemo_rl_null_and_keeps_a_reshardctl_api_job_on_the_ledger(tmp_path, site, capsys):
    out = tmp_path / "s.yaml"
    assert main(["rollback", "--site", site[0], "--write", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == api_settings(str(Path(site[0]).resolve()))
    assert "NCCL broadcast of full tensors, gather_broadcast" in out.read_text()


def test_an_inference_layout_nemo_rl_cannot_refit_is_refused_before_anything_is_recorded(tmp_path, site, capsys):
    out = tmp_path / "s.yaml"
    run = _run(tmp_path, "sg", DENSE_TRAIN, "sglang tp=2,pp=1,dp=1")
    capsys.readouterr()
    assert _promote(site[0], run, "reshard", out) == 2
    err = capsys.readouterr().err
    assert "NeMo RL refits non-colocated generation only for vLLM" in err and "'sglang tp=2,pp=1,dp=1'" in err
    assert not out.exists() and ledger_lines(site[1]) == []
    # without --write the promotion goes ahead and says why there are no settings
    assert main(["promote", "--site", site[0], "--run", run, "--force", "--reason", "t", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["framework_settings"] is None and "only for vLLM" in res["framework_settings_refused"]
    assert ledger_lines(site[1])[-1]["action"] == "promote"
