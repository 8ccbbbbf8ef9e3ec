"""ParallelSpec parsing and the build_layout factory / allocation check."""

from __future__ import annotations

import pytest

from reshardctl.errors import LayoutError
from reshardctl.layout.build import build_layout
from reshardctl.layout.parallel_spec import ParallelSpec, parse_parallel
from helpers.parallel_models import tiny_llama, tiny_qwen3_moe


def test_parse_full():
    s = parse_parallel("tp=4, pp=2,ep=2 etp=1,dp=3,cp=2,vpp=2,first=3,last_stage_layers=5,expert_parallel=on")
    assert s == ParallelSpec(tp=4, pp=2, ep=2, etp=1, dp=3, cp=2, vpp=2, first_stage_layers=3,
                             last_stage_layers=5, expert_parallel=True)
    assert parse_parallel(None) == ParallelSpec()
    for blank in ("", "  "):  # an empty flag is not the default layout: refused, naming the flag
        with pytest.raises(LayoutError, match="--train '.*': empty; leave --train out for the default"):
            parse_parallel(blank)
    assert parse_parallel(str(s)) == s
    assert parse_parallel("tp=2").dp is None  # dp omitted: derived from the world size


def test_parse_collects_every_problem_with_flag_key_and_suggestion():
    with pytest.raises(LayoutError) as ei:
        parse_parallel("tq=4,pp=two,dp=0,ep=-1,expert_parallel=maybe,tp", flag="--infer")
    v = ei.value.violations
    assert len(v) == 6
    assert any("--infer" in x and "'tq'" in x and "did you mean 'tp'" in x for x in v)
    assert any("pp='two'" in x and "not an integer" in x for x in v)
    assert any("dp=0" in x and "positive" in x for x in v)
    assert any("ep=-1" in x for x in v)
    assert any("expert_parallel" in x and "boolean" in x for x in v)
    assert any("key=value" in x for x in v)
    assert all(x.startswith("--infer") for x in v)


def test_parse_deployment_keys_and_framework_aliases():
    s = parse_parallel("tp=8,dp=16,ep=8,dp_mode=engines,placement=round_robin,all2all=deepep_low_latency,"
                       "redundant=8,expert_map=/tmp/m.json,pp_partition=30:31", flag="--infer")
    assert (s.dp_mode, s.placement, s.all2all, s.redundant, s.expert_map, s.pp_partition) == (
        "engines", "round_robin", "deepep_low_latency", 8, "/tmp/m.json", (30, 31))
    assert parse_parallel(str(s), flag="--infer") == s  # the canonical string parses back
    t = parse_parallel("pp=16,make_vocab_size_divisible_by=1280,account_for_embedding_in_pipeline_split=on,"
                       "account_for_loss_in_pipeline_split=1,pipeline_model_parallel_layout=Et*3|(tt|)*29m|L")
    assert (t.vocab_divisor, t.embedding_in_split, t.loss_in_split, t.pp_layout) == (1280, True, True, "Et*3|(tt|)*29m|L")
    assert parse_parallel("vocab_divisor=none").vocab_divisor is None
    assert parse_parallel("dp_attention=true,pp_partition=10/12").pp_partition == (10, 12)
    with pytest.raises(LayoutError) as ei:
        parse_parallel("dp_mode=both,placement=random,pp_partition=3:x,pp_partition2=1,vocab_divisor=big,"
                       "expert_map=", flag="--infer")
    v = "\n".join(ei.value.violations)
    assert "dp_mode='both': expected one of in_engine, engines" in v
    assert "placement='random': expected one of linear, round_robin" in v
    assert "pp_partition='3:x': expected layer counts separated by ':'" in v
    assert "unknown key 'pp_partition2'; did you mean 'pp_partition'?" in v
    assert "vocab_divisor='big' is not an integer" in v and "expert_map= needs a value" in v


def test_parse_duplicate_key():
    with pytest.raises(LayoutError, match="given twice"):
        parse_parallel("tp=2,tp=4", flag="--train")


def test_build_defaults_fit_local_profile():
    m = tiny_llama()
    for side, style in (("train", "megatron"), ("infer", "vllm"), ("train", "dtensor"), ("infer", "dtensor")):
        lay = build_layout(m, side, None, style, None)
        assert lay.world_size == 4 and lay.side == side
    lay = build_layout(m, "train", "tp=2", "megatron", None, world_size=8)
    assert lay.dp == 4 and lay.world_size == 8


def test_build_bad_style_and_side():
    m = tiny_llama()
    with pytest.raises(LayoutError, match="--infer-style 'megatron'"):
        build_layout(m, "infer", "tp=2", "megatron", None)
    with pytest.raises(LayoutError, match="side must be"):
        build_layout(m, "both", "tp=2", "megatron", None)


def test_dtensor_style_matches_vllm_for_plain_tp():
    m = tiny_llama()
    d = build_layout(m, "infer", "tp=2,dp=2", "dtensor", None)
    v = build_layout(m, "infer", "tp=2,dp=2", "vllm", None)
    i = m.index("model.layers.0.self_attn.o_proj.weight")
    assert sorted(d.placement(i).items()) == sorted(v.placement(i).items())
    with pytest.raises(LayoutError, match="pp=2 needs a layout file"):
        build_layout(m, "train", "tp=2,pp=2", "dtensor", None)


def test_allocation_message():
    """The one allocation rule (plan, run, layout show --site): nodes each side needs vs the site's nodes."""
    from reshardctl.request.resolve import topology_or_problems
    from reshardctl.site import load_profile

    m = tiny_qwen3_moe()
    lay = build_layout(m, "infer", "tp=8,pp=2", "vllm", None)
    problems: list[str] = []
    assert topology_or_problems(load_profile("local"), 4, lay.world_size, problems, "allocation") is None
    assert problems == ["allocation: trainer ranks (4) need ceil(4/4) = 1 node(s) and inference ranks (16) need "
                        "ceil(16/4) = 4 node(s): 1 + 4 = 5 nodes, but the site has 2"]
    assert topology_or_problems(load_profile("dgx-h100"), 4, lay.world_size, problems, "allocation") is not None


def test_layout_file_roundtrip_through_build(tmp_path):
    from reshardctl.layout.layout_file import export_layout_file

    m = tiny_qwen3_moe()  # V=1003: Megatron-LM's padding (unpadded 1003 rows do not split over tp=2)
    lay = build_layout(m, "train", "tp=2,pp=2,ep=2,vocab_divisor=128", "megatron", None)
    path = export_layout_file(lay, tmp_path / "train.yaml")
    back = build_layout(m, "train", None, None, str(path))
    assert back.world_size == lay.world_size
    for i in range(len(m.tensors)):
        assert sorted(back.placement(i).items()) == sorted(lay.placement(i).items())
