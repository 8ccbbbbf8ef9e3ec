"""`--from FILE` through reshardctl.cli.main(argv): the derived flags and their provenance on stderr, the
plan (or layout) built from them, --json on stdout, and refusals as exit 2 without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reshardctl.cli import main

NEMO = Path(__file__).parents[1] / "request" / "recipes" / "nemo_rl" / "examples" / "configs" / "recipes" / "llm"
LLAMA = NEMO / "performance" / "grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml"
DSV3 = NEMO / "grpo-dapomath17k-dsv3-megatron.yaml"


@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


def test_plan_from_a_nemo_rl_recipe_json(capsys):
    code = main(["plan", "--from", str(LLAMA), "--site", "slurm-local", "--transport", "reshard", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    inputs = json.loads(out)["inputs"]  # stdout is the JSON report alone
    assert inputs["model"] == "llama-3.1-8b"
    assert inputs["train"].startswith("megatron tp=1,pp=1,dp=8") and inputs["infer"].startswith("vllm tp=1,pp=1,dp=8")
    assert inputs["topology"]["train_world"] == 8 and inputs["topology"]["infer_world"] == 8
    # stderr: the derived flags, then where each value came from
    assert "--train-style megatron --train tp=1,pp=1,cp=1,ep=1,etp=1,dp=8" in err
    assert "--infer-style vllm --infer tp=1,pp=1,dp=8,dp_mode=engines" in err
    assert "--model llama-3.1-8b  (meta-llama/Llama-3.1-8B-Instruct -> preset llama-3.1-8b)" in err
    assert "grpo_math_1B.yaml: policy.megatron_cfg.tensor_model_parallel_size = 1" in err
    assert "grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml: cluster.num_nodes = 2" in err


def test_plan_from_prints_the_plan_too(capsys):
    code = main(["plan", "--from", str(LLAMA), "--site", "slurm-local", "--transport", "reshard"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "where each value came from:" in err and "reshard" in out and "lower bound" in out


def test_layout_show_from_dsv3_on_separate_pools(tmp_path, capsys):
    child = tmp_path / "dsv3-separate.yaml"
    child.write_text(f"defaults: {DSV3}\npolicy:\n  generation:\n    colocated:\n      enabled: false\n"
                     "      resources: {gpus_per_node: 8, num_nodes: 32}\ncluster:\n  num_nodes: 64\n")
    code = main(["layout", "show", "--from", str(child), "--model", "deepseek-v3", "--side", "infer",
                 "--tensor", "model.layers.3.mlp.experts.0.down_proj.weight"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "rank 0,32,64,96,128,160,192,224: [0:7168, 0:64]" in out
    assert "--model deepseek-v3  (the command line's; the config's model is not used)" in err


@pytest.mark.parametrize("extra, says", [
    ([], "colocated deployments are out of scope"),
    (["--train", "tp=2"], "with --train: the config decides it"),
])
def test_refusals_exit_2_without_a_traceback(capsys, extra, says):
    code = main(["plan", "--from", str(DSV3), *extra])
    out, err = capsys.readouterr()
    assert code == 2 and says in err and "Traceback" not in err + out


def test_refusal_as_json(capsys):
    code = main(["plan", "--from", str(DSV3), "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert "colocated deployments are out of scope" in json.loads(out)["error"]["message"]


def test_the_option_is_on_every_refit_command(capsys):
    for cmd in (["plan"], ["run"], ["bench"], ["layout", "show"], ["layout", "export"]):
        assert main([*cmd, "--help"]) == 0
        out, _ = capsys.readouterr()
        assert "--from" in out, cmd


def test_an_fsdp_trainer_takes_its_layout_file_beside_from(tmp_path, capsys):
    dtensor = NEMO / "grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml"
    assert main(["plan", "--from", str(dtensor), "--site", "slurm-local"]) == 2
    assert "needs a layout file" in capsys.readouterr().err
    layout = tmp_path / "fsdp.yaml"  # docs/deployments.md's file: FSDP2 over the 8 trainer GPUs, tp 1
    layout.write_text("format: reshardctl-layout/1\nside: train\nworld_size: 8\n"
                      "default:\n  mesh: {shape: [8], dim_names: [dp]}\n  placements: [\"Shard(0)\"]\n")
    code = main(["plan", "--from", str(dtensor), "--train-layout", str(layout), "--site", "slurm-local",
                 "--transport", "reshard", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    inputs = json.loads(out)["inputs"]
    assert inputs["topology"]["train_world"] == 8 and inputs["infer"].startswith("vllm tp=1,pp=1,dp=8")
    assert f"--train-layout {layout}  (the command line's; replaces the derived" in err


@pytest.mark.parametrize("files, says", [
    ({"a.yaml": "defaults: b.yaml\n", "b.yaml": "defaults: a.yaml\n"}, "a.yaml: `defaults` cycle: a.yaml -> b.yaml -> a.yaml"),
    ({"a.yaml": "defaults: gone.yaml\n"}, "a.yaml: `defaults` names 'gone.yaml', which does not exist"),
    ({"a.yaml": "policy:\n  frob: [8]\n"}, "a.yaml: `policy.frob` = [8]: not a key reshardctl reads for NeMo RL"),
    ({"a.yaml": "policy: {model_name: x}\n"}, "a.yaml: `policy.generation.colocated.enabled` = True (NeMo RL's default): "
                                 "colocated deployments are out of scope"),
])
def test_hostile_config_files_exit_2_naming_file_and_key(tmp_path, capsys, files, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code = main(["plan", "--from", str(tmp_path / "a.yaml")])
    out, err = capsys.readouterr()
    assert code == 2 and says in err and "Traceback" not in err + out
