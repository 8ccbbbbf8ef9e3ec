"""`reshardctl layout show` / `layout export`: the same allocation rule and messages as `plan`, every
violation at once, and exported layout files that plan exactly like their parallel strings."""

from __future__ import annotations

import json

import pytest

from reshardctl.cli import main
from reshardctl.layout.build import build_layout, spec_world_size
from reshardctl.layout.layout_file import load_layout_file
from reshardctl.layout.parallel_spec import parse_parallel
from reshardctl.models import load_model


@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------ allocation: one rule for show and plan --
@pytest.mark.parametrize("train,infer,ok", [
    ("tp=2,dp=1", "tp=2,dp=2", True),    # 2 + 4 ranks: 1 + 1 nodes of 4 GPUs; not "half of the GPUs each"
    ("tp=1,dp=1", "tp=1,dp=1", True),
    ("tp=2,dp=4", "tp=2,dp=2", False),   # 2 + 1 nodes > 2
])
def test_layout_show_site_uses_the_plan_allocation_rule(capsys, train, infer, ok):
    sc, _, serr = run(capsys, "layout", "show", "--model", "tiny-llama", "--site", "local", "--train", train,
                      "--infer", infer, "--tensor", "lm_head*")
    pc, _, perr = run(capsys, "plan", "--site", "local", "--model", "tiny-llama", "--train", train, "--infer", infer,
                      "--transport", "reshard")
    assert (sc == 0) is ok and (pc == 0) is ok, (serr, perr)
    if not ok:
        assert sc == pc == 2 and serr == perr and "allocation: trainer ranks (8) need ceil(8/4) = 2 node(s)" in serr


def test_layout_show_side_with_site_checks_both_sides(capsys):
    code, _, err = run(capsys, "layout", "show", "--model", "tiny-llama", "--site", "local", "--side", "train",
                       "--train", "tp=2,dp=2", "--infer", "tp=2,dp=4")
    assert code == 2 and "inference ranks (8) need ceil(8/4) = 2 node(s)" in err


def test_layout_problems_and_allocation_reported_together(capsys):
    """A layout that fails its own checks still counts its ranks: the allocation overflow is reported too."""
    for cmd in (["plan", "--site", "local", "--model", "tiny-llama"],
                ["layout", "show", "--site", "local", "--model", "tiny-llama"]):
        code, _, err = run(capsys, *cmd, "--train", "tp=3,dp=4", "--infer", "tp=8")
        assert code == 2, err
        assert "--train: Megatron tp=3 does not divide num_attention_heads=16" in err
        assert "allocation: trainer ranks (12) need ceil(12/4) = 3 node(s)" in err
        assert "3 + 2 = 5 nodes, but the site has 2" in err


def test_layout_file_problems_and_allocation_reported_together(capsys, tmp_path):
    lf = tmp_path / "t.yaml"
    lf.write_text("world_size: 12\nrules: [{match: '*', mesh: {shape: [12]}, placements: [Shard(7)]}]\n")
    code, _, err = run(capsys, "plan", "--site", "local", "--model", "tiny-llama", "--train-layout", str(lf))
    assert code == 2 and "Shard(7)" in err and "trainer ranks (12) need ceil(12/4) = 3 node(s)" in err


@pytest.mark.parametrize("model,style,spec", [
    ("tiny-llama", "megatron", "tp=2,pp=2"), ("tiny-llama", "megatron", "tp=2,cp=2,dp=2"),
    ("tiny-qwen3-moe", "megatron", "tp=2,ep=4"), ("tiny-qwen3-moe", "megatron", "tp=2,ep=4,etp=1,pp=2"),
    ("tiny-llama", "vllm", "tp=2,dp=3"), ("tiny-qwen3-moe", "vllm", "tp=2,ep=4"), ("tiny-llama", "dtensor", "tp=2"),
])
def test_spec_world_size_matches_the_layout(model, style, spec):
    m = load_model(model)
    side = "infer" if style == "vllm" else "train"
    assert spec_world_size(m, style, parse_parallel(spec)) == build_layout(m, side, spec, style).world_size


# ------------------------------------------------------------ messages ------------------------------------
def test_layout_show_and_plan_prefix_flag_errors_alike(capsys):
    _, _, show = run(capsys, "layout", "show", "--model", "tiny-llama", "--train", "tq=2")
    _, _, plan = run(capsys, "plan", "--model", "tiny-llama", "--train", "tq=2")
    assert show == plan
    assert "error: --train: unknown key 'tq'" in show and "--train: --train" not in show and "train: --train" not in show


def test_layout_show_tensor_glob_matching_nothing(capsys):
    code, out, err = run(capsys, "layout", "show", "--model", "tiny-llama", "--tensor", "nomatch*")
    assert code == 2 and out == ""
    assert "--tensor 'nomatch*': no tensor of model tiny-llama matches" in err and "Traceback" not in err


# ------------------------------------------------------------ layout export ------------------------------
def _transfers(capsys, tmp_path, name, *args) -> list[dict]:
    path = tmp_path / f"{name}.jsonl"
    code, _, err = run(capsys, "plan", "--site", "local", *args, "--transport", "reshard",
                       "--export-transfers", str(path), "--json")
    assert code == 0, err
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("side,spec,style,suffix", [
    ("train", "tp=2,pp=2", "megatron", ".yaml"),
    ("train", "tp=2,dp=2", "dtensor", ".json"),
    ("infer", "tp=4", "vllm", ".yaml"),
    ("infer", "tp=2,ep=4", "vllm", ".json"),
    ("infer", "tp=2,dp=2,ep=2,redundant=4,placement=linear", "vllm", ".json"),  # 2 engines, EPLB slots
    ("infer", "tp=4,ep=2,dp=2,dp_attention=true", "sglang", ".yaml"),
])
def test_layout_export_plans_identically(capsys, tmp_path, side, spec, style, suffix):
    model = "tiny-qwen3-moe"
    f = tmp_path / f"{side}{suffix}"
    code, _, err = run(capsys, "layout", "export", "--model", model, "--side", side, f"--{side}", spec,
                       f"--{side}-style", style, "--out", str(f))
    assert code == 0 and f.exists(), err
    m = load_model(model)
    direct = build_layout(m, side, spec, style)
    loaded = load_layout_file(f, m, side)
    assert loaded.world_size == direct.world_size and loaded.num_stages() == direct.num_stages()
    for i in range(len(m.tensors)):
        assert dict(loaded.placement(i).items()) == dict(direct.placement(i).items()), m.tensors[i].name
        assert loaded.stage_of(i) == direct.stage_of(i)
    base = ["--model", model, f"--{side}-style", style]
    a = _transfers(capsys, tmp_path, "a", *base, f"--{side}", spec)
    b = _transfers(capsys, tmp_path, "b", "--model", model, f"--{side}-layout", str(f))
    assert a == b and a


def test_layout_export_errors(capsys, tmp_path):
    code, _, err = run(capsys, "layout", "export", "--model", "tiny-llama", "--side", "train", "--train", "tp=3",
                       "--out", str(tmp_path / "x.yaml"))
    assert code == 2 and "--train: Megatron tp=3" in err and not (tmp_path / "x.yaml").exists()
    code, _, err = run(capsys, "layout", "export", "--model", "tiny-llama", "--side", "train", "--out", "/proc/x.yaml")
    assert code == 2 and "--out /proc/x.yaml: cannot write" in err and "Traceback" not in err
    code, _, err = run(capsys, "layout", "export", "--model", "tiny-llama", "--side", "both", "--out", "x.yaml")
    assert code == 2 and "--side 'both'" in err


def test_layout_export_train_layout_and_site(capsys, tmp_path):
    """--train-layout / --infer-layout override the parallel strings and --site checks the allocation,
    as in `plan`: a file exports to the same placements, an overflowing allocation writes nothing."""
    t = tmp_path / "t.yaml"
    assert run(capsys, "layout", "export", "--side", "train", "--train", "tp=2,pp=2", "-o", str(t))[0] == 0
    t2 = tmp_path / "t2.json"
    code, _, err = run(capsys, "layout", "export", "--side", "train", "--train-layout", str(t), "--site", "local",
                       "-o", str(t2))
    assert code == 0, err
    m = load_model("tiny-llama")
    a, b = load_layout_file(t, m, "train"), load_layout_file(t2, m, "train")
    assert all(dict(a.placement(i).items()) == dict(b.placement(i).items()) for i in range(len(m.tensors)))
    # --site: the same allocation message as `plan`, and no file
    i = tmp_path / "i.yaml"
    code, out, err = run(capsys, "layout", "export", "--side", "infer", "--infer", "tp=2,dp=4", "--train-layout",
                         str(t), "--site", "local", "-o", str(i))
    pc, _, perr = run(capsys, "plan", "--infer", "tp=2,dp=4", "--train-layout", str(t), "--site", "local")
    assert code == pc == 2 and out == "" and not i.exists()
    assert "allocation: trainer ranks (4) need ceil(4/4) = 1 node(s) and inference ranks (8)" in err and err == perr
    # without --site the export needs no allocation
    assert run(capsys, "layout", "export", "--side", "infer", "--infer", "tp=2,dp=4", "-o", str(i))[0] == 0
    # a directory / a missing file as --train-layout: the same messages as `plan`
    code, _, err = run(capsys, "layout", "export", "--side", "train", "--train-layout", str(tmp_path), "-o", str(i))
    assert code == 2 and f"--train-layout {tmp_path}: is a directory" in err
    code, _, err = run(capsys, "layout", "export", "--side", "train", "--train-layout", str(tmp_path / "no.yaml"),
                       "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and "no such file" in err and not (tmp_path / "x.yaml").exists()
    code, _, err = run(capsys, "layout", "export", "--side", "train", "--site", "no-such-site", "-o",
                       str(tmp_path / "x.yaml"))
    assert code == 2 and "no-such-site" in err and not (tmp_path / "x.yaml").exists()


def test_layout_export_creates_missing_parents_like_plan(capsys, tmp_path):
    f = tmp_path / "a" / "b" / "t.json"
    code, _, err = run(capsys, "layout", "export", "--side", "train", "-o", str(f))
    assert code == 0 and f.is_file(), err
    (tmp_path / "file").write_text("x")
    code, out, err = run(capsys, "layout", "export", "--side", "train", "-o", str(tmp_path / "file" / "t.yaml"))
    assert code == 2 and f"{tmp_path / 'file'} is a file, not a directory" in err and out == ""
    assert (tmp_path / "file").read_text() == "x"


def test_layout_show_rank_names_parameters_per_megatron_spec(capsys):
    """`--megatron-spec local` lists the local spec's names (input_layernorm, local_experts.i); te the fused
    TE names; anything else is exit 2 naming the choices."""
    base = ["layout", "show", "--model", "tiny-qwen3-moe", "--train", "tp=2,ep=2", "--side", "train", "--rank", "1",
            "--json"]
    assert main(base) == 0
    te = {p["param"] for p in json.loads(capsys.readouterr().out)["sides"]["train"]["params"]}
    assert main(base + ["--megatron-spec", "local"]) == 0
    local = {p["param"] for p in json.loads(capsys.readouterr().out)["sides"]["train"]["params"]}
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te
    assert "decoder.layers.0.input_layernorm.weight" in local and "decoder.layers.0.input_layernorm.weight" not in te
    assert any(".mlp.experts.local_experts.0.linear_fc1.weight" in n for n in local)
    assert not any("local_experts" in n for n in te)
    assert main(base[:-1] + ["--megatron-spec", "bogus"]) == 2
    assert "expected one of te, local" in capsys.readouterr().err
