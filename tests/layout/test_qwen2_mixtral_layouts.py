"""Qwen2 / Qwen2.5 (q/k/v biases), Qwen2-MoE (shared expert + its gate) and Mixtral (block_sparse_moe) on every
side (engineer "archs1"): vLLM's own parameters and loaders (tests/helpers/vllm_modules.py, archs1 block: written
from vLLM's qwen2.py / qwen2_moe.py / mixtral.py), the Megatron names (megatron-core fixtures qwen2_* in
tests/layout/megatron_core/, checked by test_megatron_core_names.py; here Mixtral's and the bias rows), DTensor,
SGLang's refusal, and coverage of every tensor exactly once per replica."""

from __future__ import annotations

import pytest
import torch

from reshardctl.errors import LayoutError
from reshardctl.layout.build import build_layout
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.megatron_params import megatron_qkv_runs
from reshardctl.layout.parallel_spec import parse_parallel as P
from reshardctl.layout.sglang import SglangLayout
from reshardctl.layout.vllm import VllmLayout
from reshardctl.models import load_model
from helpers.parallel_models import tiny_mixtral, tiny_qwen2, tiny_qwen2_moe
from helpers.vllm_modules import Deployment, apply_segments, load_like_vllm_archs1, vllm_param_table_archs1

D = Deployment
MODELS = {"qwen2": tiny_qwen2, "qwen2-tied": lambda: tiny_qwen2(tie=True), "qwen2-moe": tiny_qwen2_moe,
          "mixtral": tiny_mixtral}
GRID = [
    ("qwen2", D(tp=1)), ("qwen2", D(tp=2)), ("qwen2", D(tp=4)),  # tp 4 > 2 kv heads: k/v (and their biases) x2
    ("qwen2", D(tp=2, pp=2)), ("qwen2", D(tp=2, dp=2)), ("qwen2-tied", D(tp=2, pp=2)),
    ("qwen2-moe", D(tp=2)), ("qwen2-moe", D(tp=4, expert_parallel=True)), ("qwen2-moe", D(tp=2, pp=2)),
    # EP, tp > 1, dp > 1: DeepSeek's shared experts go replicated (use_sequence_parallel_moe), Qwen2-MoE's stay split
    ("qwen2-moe", D(tp=2, dp=2, expert_parallel=True)),
    ("mixtral", D(tp=2)), ("mixtral", D(tp=4, expert_parallel=True)), ("mixtral", D(tp=2, dp=2, expert_parallel=True)),
    ("mixtral", D(tp=1, pp=3)),
]


def hf_tensors(model) -> dict[str, torch.Tensor]:
    """Every HF tensor with values unique across the model (float64: exact)."""
    out, base = {}, 0
    for t in model.tensors:
        out[t.name] = (torch.arange(t.numel, dtype=torch.float64) + base + 1).reshape(t.shape)
        base += t.numel
    return out




@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c[0]}-{c[1].spec()}")
def test_local_params_are_vllms_on_every_rank(case):
    """Same names, shapes and dtypes as vLLM builds on every rank; each element written once by the segments and
    equal to what vLLM's loaders put there (padding rows 0)."""
    name, dep = case
    model = MODELS[name]()
    lay = VllmLayout(model, P(dep.spec()), world_size=dep.world)
    hf = hf_tensors(model)
    for rank in range(dep.world):
        lps = lay.local_params(rank)
        got = {p.name: (tuple(p.shape), p.dtype) for p in lps}
        table = vllm_param_table_archs1(model, dep, rank)
        want = {n: (p.shape, p.dtype) for n, p in table.items()}
        assert got == want, (rank, sorted(set(got) ^ set(want))[:6],
                             [(n, got[n], want[n]) for n in set(got) & set(want) if got[n] != want[n]][:6])
        vals, counts = apply_segments(lps, hf)
        loaded = {n: torch.full(s, -1.0, dtype=torch.float64) for n, (s, _) in want.items()}
        load_like_vllm_archs1(model, dep, rank, loaded, hf)
        for n in want:
            assert int(counts[n].max()) <= 1, (rank, n)
            assert not bool((loaded[n] == -1).any()), (rank, n, "vLLM's loaders left elements unwritten")
            assert torch.equal(vals[n], loaded[n]), (rank, n, "segments place boxes elsewhere than vLLM")


def test_vllm_bias_rows_follow_the_kv_head_replicas():
    """tp 4 > 2 kv heads: rank r holds k/v head r // 2 (QKVParallelLinear num_kv_head_replicas = 2), bias too."""
    m = tiny_qwen2(layers=1)
    lay = VllmLayout(m, P("tp=4"))
    pl = lay.placement(m.index("model.layers.0.self_attn.k_proj.bias"))
    assert [pl.holding(r) for r in range(4)] == [(((0, 8),),), (((0, 8),),), (((8, 16),),), (((8, 16),),)]
    (bias,) = [p for p in lay.local_params(3) if p.name == "model.layers.0.self_attn.qkv_proj.bias"]
    assert bias.shape == (8 * 8 // 4 + 2 * 8,)  # 2 q heads + 1 k + 1 v head of 8
    assert {s.hf_name.rsplit(".", 2)[1]: s.offset for s in bias.segments} == {"q_proj": (0,), "k_proj": (16,),
                                                                            "v_proj": (24,)}


def test_megatron_bias_rows_are_linear_qkvs():
    """linear_qkv.bias holds the same interleaved per-group rows as linear_qkv.weight (add_qkv_bias), at the same
    local offsets, for tp dividing the groups and tp > groups."""
    m = tiny_qwen2(layers=1)
    for tp in (1, 2, 4):
        lay = MegatronLayout(m, P(f"tp={tp}"))
        for r in range(tp):
            params = {p.name: p for p in lay.local_params(r)}
            w, b = params["decoder.layers.0.self_attention.linear_qkv.weight"], \
                params["decoder.layers.0.self_attention.linear_qkv.bias"]
            assert b.shape == w.shape[:1]
            assert [(s.hf_name.replace(".weight", ""), s.box[0], s.offset[0]) for s in w.segments] == \
                [(s.hf_name.replace(".bias", ""), s.box[0], s.offset[0]) for s in b.segments]
            runs = megatron_qkv_runs(8, 2, 8, tp, r)
            assert sorted((c, n, a, e) for n, a, e, c in runs) == sorted(
                (s.offset[0], s.hf_name.split(".")[-2][0], *s.box[0]) for s in b.segments)


def test_megatron_mixtral_names():
    """Mixtral on Megatron is a MoE without shared experts: the router and grouped experts (TE) / local experts."""
    m = tiny_mixtral(layers=2)
    lay = MegatronLayout(m, P("tp=2,ep=2,etp=1"))
    te = {p.name: p.shape for p in lay.local_params(0)}
    assert te["decoder.layers.0.mlp.router.weight"] == (8, 64)
    assert te["decoder.layers.1.mlp.experts.linear_fc1.weight3"] == (128, 64)  # [w1; w3] of expert 3
    assert te["decoder.layers.1.pre_mlp_layernorm.weight"] == (64,)
    local = {p.name for p in lay.local_params(1, spec="local")}
    assert "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight" in local
    (fc1,) = [p for p in lay.local_params(1) if p.name == "decoder.layers.0.mlp.experts.linear_fc1.weight0"]
    assert [s.hf_name.rsplit(".", 2)[1] for s in fc1.segments] == ["w1", "w3"]  # expert 4 on ep rank 1
    assert all(".experts.4." in s.hf_name for s in fc1.segments)


def test_shared_expert_stays_tp_split_under_sequence_parallel_moe():
    """EP + tp 2 + dp 2 (in-engine): DeepSeek's shared experts replicate, Qwen2-MoE's Qwen2MoeMLP has no
    disable_tp: each rank holds half of the shared expert's rows; the 1 x H gate is replicated."""
    m = tiny_qwen2_moe(layers=2)
    lay = VllmLayout(m, P("tp=2,dp=2,expert_parallel=true,dp_mode=in_engine"))
    assert lay.sp_moe and lay.shared_tp == 2
    pl = lay.placement(m.index("model.layers.1.mlp.shared_expert.gate_proj.weight"))
    assert {pl.holding(r)[0][0] for r in range(4)} == {(0, 32), (32, 64)}
    gate = lay.placement(m.index("model.layers.1.mlp.shared_expert_gate.weight"))
    assert all(gate.holding(r) == (((0, 1), (0, 64)),) for r in range(4))


def test_qwen2_moe_refuses_tp_above_experts():
    """Qwen2MoeSparseMoeBlock raises when tp > num_experts, expert parallel or not."""
    for spec in ("tp=16", "tp=16,ep=16"):
        with pytest.raises(LayoutError, match=r"Qwen2-MoE: tp=16 > num_experts=8"):
            VllmLayout(tiny_qwen2_moe(layers=2), P(spec))


def test_sglang_refuses_the_archs_by_name():
    for model, what in ((tiny_qwen2(layers=1), "Qwen2"), (tiny_qwen2_moe(layers=1), "Qwen2-MoE"),
                        (tiny_mixtral(layers=1), "Mixtral")):
        with pytest.raises(LayoutError, match=rf"SGLang's {what} layout \({model.dims.arch}\) is not modelled"):
            SglangLayout(model, P("tp=2"))


@pytest.mark.parametrize("name", ["tiny-qwen2-moe", "tiny-mixtral", "qwen2.5-7b"])
def test_dtensor_layouts_cover_once_per_replica(name):
    """The dtensor style (HF names): tp column / row rules (the q/k/v biases Shard(0) with their weights), dp
    replicas; every element once per dp replica."""
    m = load_model(name, layers=2)
    lay = build_layout(m, "infer", "tp=2,dp=2", "dtensor")
    for i, t in enumerate(m.tensors):
        pl = lay.placement(i)
        for d in range(2):
            classes = {h for r, h in pl.items() if r // 2 == d and h}  # replicas inside a dp group count once
            n = sum(sum(_numel(b) for b in h) for h in classes)
            assert n == t.numel, (t.name, d, n)
    if m.dims.arch != "mixtral":  # Mixtral has no attention bias
        b = lay.placement(m.index("model.layers.0.self_attn.q_proj.bias"))
        assert b.holding(0) != b.holding(1)  # split over tp, not replicated


def _numel(box):
    out = 1
    for a, c in box:
        out *= c - a
    return out
