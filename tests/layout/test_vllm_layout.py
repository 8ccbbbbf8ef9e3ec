"""vLLM inference layout: test vectors derived from the vLLM functions (docs/layouts.md), vocab padding,
EP remainder, PP split, names."""

from __future__ import annotations

import pytest

from reshardctl.errors import LayoutError
from reshardctl.layout.parallel_spec import parse_parallel as P
from reshardctl.layout.pipeline import vllm_pp_parts
from reshardctl.layout.vllm import VllmLayout, vllm_expert_ranges
from reshardctl.layout.vllm_params import vllm_qkv_runs
from helpers.parallel_models import deepseek_v3, llama_70b, qwen3_235b, tiny_deepseek, tiny_llama, tiny_qwen3_moe


def qkv_runs(lay, rank, layer=0):
    (p,) = [p for p in lay.local_params(rank) if p.name == f"model.layers.{layer}.self_attn.qkv_proj.weight"]
    kind = {"q_proj": "q", "k_proj": "k", "v_proj": "v"}
    return sorted(((kind[s.hf_name.split(".")[-2]], s.box[0][0], s.box[0][1], s.offset[0]) for s in p.segments),
                  key=lambda r: r[3]), p


def test_llama70b_tp8_rank2():
    want = [("q", 2048, 3072, 0), ("k", 256, 384, 1024), ("v", 256, 384, 1152)]
    assert vllm_qkv_runs(64, 8, 128, 8, 2) == want
    runs, p = qkv_runs(VllmLayout(llama_70b(layers=1), P("tp=8")), 2)
    assert runs == want and p.shape == (1280, 8192)


def test_qwen3_235b_tp8_rank5_kv_replicated():
    lay = VllmLayout(qwen3_235b(layers=1), P("tp=8"))
    assert qkv_runs(lay, 5)[0] == [("q", 5120, 6144, 0), ("k", 256, 384, 1024), ("v", 256, 384, 1152)]
    k = lay.placement(lay.model.index("model.layers.0.self_attn.k_proj.weight"))
    assert k.holding(4) == k.holding(5) == (((256, 384), (0, 4096)),)
    assert k.template.replica_classes() == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_vocab_pad64_zero_filled_rows():
    lay = VllmLayout(qwen3_235b(layers=1), P("tp=8"))
    assert lay.padded_vocab() == 151936  # already a multiple of 64
    pl = lay.placement(lay.model.index("model.embed_tokens.weight"))
    assert pl.holding(1) == (((18992, 37984), (0, 4096)),)
    m = tiny_qwen3_moe()  # V=1003 -> 1024, tp=4 -> 256 rows/rank; last rank 235 real rows
    lay = VllmLayout(m, P("tp=4"))
    assert lay.placement(m.index("lm_head.weight")).holding(3) == (((768, 1003), (0, 64)),)
    (p,) = [p for p in lay.local_params(3) if p.name == "lm_head.weight"]
    assert p.shape == (256, 64) and p.segments[0].box[0] == (768, 1003)


def test_expert_parallel_remainder_first_ranks():
    assert vllm_expert_ranges(128, 6) == [(0, 22), (22, 44), (44, 65), (65, 86), (86, 107), (107, 128)]
    m = tiny_qwen3_moe()  # E=8
    lay = VllmLayout(m, P("tp=1,dp=3,expert_parallel=true,dp_mode=in_engine"))
    assert lay.expert_ranges == [(0, 3), (3, 6), (6, 8)]
    pl = lay.placement(m.index("model.layers.0.mlp.experts.5.down_proj.weight"))
    assert [r for r, h in pl.items() if h] == [1] and pl.holding(1) == (((0, 64), (0, 32)),)
    names = {p.name: p for p in lay.local_params(2)}
    w13 = names["model.layers.0.mlp.experts.w13_weight"]
    assert w13.shape == (2, 64, 64)
    segs = {s.hf_name: s.offset for s in w13.segments}
    assert segs["model.layers.0.mlp.experts.7.gate_proj.weight"] == (1, 0, 0)
    assert segs["model.layers.0.mlp.experts.7.up_proj.weight"] == (1, 32, 0)
    assert names["model.layers.0.mlp.experts.w2_weight"].shape == (2, 64, 32)
    # ep=N is the same as expert_parallel over dp*tp
    assert VllmLayout(m, P("tp=2,ep=4")).dp == 2


def test_experts_tp_sharded_over_dp_x_tp_without_ep():
    m = tiny_qwen3_moe()  # Im=32 over dp*tp = 4
    lay = VllmLayout(m, P("tp=2,dp=2,dp_mode=in_engine"))
    pl = lay.placement(m.index("model.layers.0.mlp.experts.3.gate_proj.weight"))
    assert [h for _, h in sorted(pl.items())] == [(((8 * j, 8 * j + 8), (0, 64)),) for j in range(4)]
    # ranks (dp, pp, tp) row-major: rank 2 = dp 1, tp 0 = flattened MoE rank 2
    assert pl.ranks == (0, 1, 2, 3)
    w13 = {p.name: p for p in lay.local_params(2)}["model.layers.0.mlp.experts.w13_weight"]
    assert w13.shape == (8, 16, 64)


def test_mla_fused_qkv_a_replicated():
    m = tiny_deepseek(layers=4, fp8=False)  # bf16 weights (its fp8 view is refused by vLLM at tp=2)
    lay = VllmLayout(m, P("tp=2"))
    names = {p.name: p for p in lay.local_params(1)}
    f = names["model.layers.0.self_attn.fused_qkv_a_proj.weight"]
    assert f.shape == (128 + 64 + 8, 256)
    assert {s.hf_name.split(".")[-2]: s.offset for s in f.segments} == {"q_a_proj": (0, 0), "kv_a_proj_with_mqa": (128, 0)}
    assert names["model.layers.0.self_attn.kv_b_proj.weight"].shape == (128, 64)
    assert lay.stage_of(m.index("model.layers.4.shared_head.head.weight")) == 0


def test_pp_split_remainder_before_last():
    assert vllm_pp_parts(94, 4) == [23, 24, 24, 23]
    assert vllm_pp_parts(94, 3) == [31, 32, 31]
    assert vllm_pp_parts(61, 8) == [7, 7, 8, 8, 8, 8, 8, 7]
    m = tiny_llama(layers=10)
    lay = VllmLayout(m, P("tp=2,pp=4,dp=2"))
    assert lay.pp_parts == [2, 3, 3, 2]
    assert lay.stage_ranks(1) == (2, 3, 10, 11)
    assert lay.stage_of(m.index("model.layers.4.mlp.up_proj.weight")) == 1
    assert lay.stage_of(m.index("lm_head.weight")) == 3 and lay.stage_of(m.index("model.embed_tokens.weight")) == 0


def test_mtp_on_last_stage():
    m = tiny_deepseek(layers=4)
    lay = VllmLayout(m, P("pp=2"))
    assert lay.stage_of(m.index("model.layers.4.eh_proj.weight")) == 1
    assert lay.placement(m.index("model.layers.4.eh_proj.weight")).ranks == (1,)


def test_validation_lists_every_violation_with_arithmetic():
    with pytest.raises(LayoutError) as ei:
        VllmLayout(qwen3_235b(layers=1), P("tp=6,pp=2,ep=5"))
    s = "\n".join(ei.value.violations)
    assert "vLLM tp=6 > num_kv_heads=4 requires 6 % 4 == 0" in s
    assert "tp=6 does not divide num_attention_heads=64 (64/6 = 10.67)" in s
    assert "vLLM ep=5 must be tp(6) = 6 (dp_mode=engines" in s and "or k x tp(6) with k > 1 dividing dp(1)" in s
    assert "vLLM pp=2 > 1 layers" in s
    assert len(ei.value.violations) >= 4
    with pytest.raises(LayoutError, match="16 ranks, but 12 were given"):
        VllmLayout(tiny_llama(), P("tp=8,pp=2"), world_size=12)
    with pytest.raises(LayoutError, match="moe_intermediate_size=32"):
        VllmLayout(tiny_qwen3_moe(), P("tp=8,dp=8,dp_mode=in_engine"))


def test_deepseek_v3_full_scale_placements():
    from reshardctl.models.views import drop_scales

    m = drop_scales(deepseek_v3(), "bfloat16")  # bf16 generation weights (NeMo RL refits bf16)
    for s in ("tp=32,dp=8", "tp=32,dp=8,expert_parallel=on", "tp=32,dp=8,ep=32"):
        lay = VllmLayout(m, P(s))
        assert lay.world_size == 256
        for i in range(len(m.tensors)):
            lay.placement(i)
        assert len(lay._templates) < 2000
