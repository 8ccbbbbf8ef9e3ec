"""The vLLM layout's framework parameters (``VllmLayout.local_params``) against the parameters vLLM builds
(tests/helpers/vllm_modules.py, written from vLLM's source without reshardctl.layout): on every rank of each
deployment, the same names, shapes and dtypes, nothing missing, nothing extra; and the segments place every
HF box where vLLM's weight loaders put it (filling by segments == loading like vLLM, padding rows 0), each
element of a parameter written by exactly one segment."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from reshardctl.layout.parallel_spec import parse_parallel
from reshardctl.layout.vllm import VllmLayout
from reshardctl.models.catalog import load_model
from helpers.parallel_models import (
    tiny_deepseek, tiny_deepseek_grouped, tiny_deepseek_v2_lite, tiny_llama, tiny_qwen3_moe,
)
from helpers.vllm_modules import Deployment, apply_segments, load_like_vllm, local_experts, vllm_module, vllm_params

D = Deployment
# vLLM 0.33.0 config/parallel.py:45-60 All2AllBackend
A2A_033 = ("naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "deepep_v2", "mori_high_throughput",
           "mori_low_latency", "moonep", "nixl_ep", "allgather_reducescatter", "flashinfer_all2allv",
           "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided", "passthrough")
MODELS = {
    "llama": lambda: tiny_llama(),  # nh=8, nkv=4, V=1000 (padded 1024)
    "llama-tied": lambda: tiny_llama(tie=True),
    "qwen3-moe": lambda: tiny_qwen3_moe(),  # nkv=2, E=8, V=1003
    "deepseek": lambda: tiny_deepseek(fp8=False),  # MLA with q_lora, shared expert, router bias, MTP
    "deepseek-no-q-lora": lambda: tiny_deepseek_v2_lite(),
    "deepseek-grouped": lambda: tiny_deepseek_grouped(),  # n_group=2: round_robin allowed
    "deepseek-fp8": lambda: tiny_deepseek(),  # block fp8: fused weight_scale_inv params
}
GRID = [
    ("llama", D(tp=1)), ("llama", D(tp=2)), ("llama", D(tp=4)),
    ("llama", D(tp=8)),  # tp > 4 kv heads: each kv head replicated on 2 ranks
    ("llama", D(tp=2, pp=2)), ("llama", D(tp=1, pp=3)),  # get_pp_indices remainder before the last stage
    ("llama", D(tp=2, dp=2)), ("llama-tied", D(tp=2, pp=2)), ("llama-tied", D(tp=4)),
    ("qwen3-moe", D(tp=2)), ("qwen3-moe", D(tp=4)), ("qwen3-moe", D(tp=2, dp=2)),
    ("qwen3-moe", D(tp=2, expert_parallel=True)), ("qwen3-moe", D(tp=1, dp=3, expert_parallel=True)),
    ("qwen3-moe", D(tp=2, dp=2, expert_parallel=True)),
    ("qwen3-moe", D(tp=4, expert_parallel=True, placement="round_robin")),  # no n_group: vLLM uses linear
    ("qwen3-moe", D(tp=2, expert_parallel=True, redundant=2)),
    ("qwen3-moe", D(tp=4, expert_parallel=True, redundant=4)),
    ("qwen3-moe", D(tp=2, expert_parallel=True, redundant=16)),  # 24 slots, 12 a rank: experts 0-3 twice on rank 0
    ("qwen3-moe", D(tp=2, pp=2, expert_parallel=True)),
    ("qwen3-moe", D(tp=1, expert_parallel=True, redundant=4)),  # ep 1: all 12 slots here, experts 0-3 twice
    ("deepseek", D(tp=1)), ("deepseek", D(tp=2)), ("deepseek", D(tp=4)), ("deepseek", D(tp=2, pp=2)),
    ("deepseek", D(tp=2, expert_parallel=True)), ("deepseek", D(tp=2, expert_parallel=True, redundant=2)),
    ("deepseek", D(tp=2, dp=2, expert_parallel=True)),  # sequence-parallel MoE: shared experts replicated
    ("deepseek-no-q-lora", D(tp=2)), ("deepseek-no-q-lora", D(tp=2, pp=2, expert_parallel=True)),
    ("deepseek-grouped", D(tp=4, expert_parallel=True, placement="round_robin")),
    ("deepseek-grouped", D(tp=2, dp=2, expert_parallel=True, placement="round_robin")),  # all2all: linear
    ("deepseek-fp8", D(tp=1)), ("deepseek-fp8", D(tp=1, dp=2, expert_parallel=True)),
    ("deepseek-fp8", D(tp=1, pp=2, dp=2, expert_parallel=True, redundant=2)),
    # issue 36: every all2all backend of vLLM 0.33.0 (config/parallel.py:45-60) at EP + in-engine DP + TP > 1, where
    # use_sequence_parallel_moe decides whether DeepSeek's shared experts are whole or TP-split (moonep: refused
    # there, test_vllm_versions.py); the releases that differ: deepep_v2 is not sequence-parallel in 0.29.0, naive
    # and pplx are not replaced in 0.14.1 (naive SP, pplx not)
    *[("deepseek", D(tp=2, dp=2, expert_parallel=True, all2all=b)) for b in A2A_033 if b != "moonep"],
    ("deepseek", D(tp=2, dp=2, expert_parallel=True, all2all="deepep_v2", vllm="0.29")),
    ("deepseek", D(tp=2, dp=2, expert_parallel=True, all2all="pplx", vllm="0.14")),
    ("deepseek", D(tp=2, dp=2, expert_parallel=True, all2all="naive", vllm="0.14")),
    ("deepseek", D(tp=2, dp=2, all2all="moonep")),  # no EP: no all2all kernels, MoonEP never runs
    # DeepseekV2MoE reads use_sequence_parallel_moe alone (deepseek_v2.py:312; the decoder layer's own flag adds
    # pp == 1, :1300-1303, for its activations only): with pp > 1 the weights are still whole
    ("deepseek", D(tp=2, pp=2, dp=2, expert_parallel=True)),
    ("deepseek", D(tp=2, pp=2, dp=2, expert_parallel=True, all2all="flashinfer_nvlink_two_sided")),
    # round_robin with all2all kernels: kept only with routing tables (deepep_low_latency, nixl_ep)
    ("deepseek-grouped", D(tp=2, dp=2, expert_parallel=True, placement="round_robin", all2all="deepep_low_latency")),
    ("deepseek-grouped", D(tp=2, dp=2, expert_parallel=True, placement="round_robin", all2all="nixl_ep")),
    ("deepseek-grouped", D(tp=2, dp=2, expert_parallel=True, placement="round_robin", all2all="deepep_v2")),
]
_HF: dict[str, dict[str, torch.Tensor]] = {}


def ident(case) -> str:
    name, dep = case
    return f"{name}-{dep.spec()}"


def hf_tensors(key: str, model) -> dict[str, torch.Tensor]:
    """Every HF tensor with values unique across the model (float64: exact), built once per model."""
    if key not in _HF:
        out, base = {}, 0
        for t in model.tensors:
            out[t.name] = (torch.arange(t.numel, dtype=torch.float64) + base + 1).reshape(t.shape)
            base += t.numel
        _HF[key] = out
    return _HF[key]


def layout_for(model, dep: Deployment, tmp_path=None) -> VllmLayout:
    map_file = None
    if dep.phys_map is not None:
        map_file = str(tmp_path / "expert_map.json")
        with open(map_file, "w") as f:
            json.dump(list(dep.phys_map), f)
    return VllmLayout(model, parse_parallel(dep.spec(map_file)), world_size=dep.world)




def check_rank(model, dep: Deployment, lay: VllmLayout, rank: int, hf) -> None:
    lps = lay.local_params(rank)
    got = {p.name: (tuple(p.shape), p.dtype) for p in lps}
    want = vllm_params(model, dep, rank)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, f"rank {rank}: missing {missing[:6]}, extra {extra[:6]}"
    bad = {n: (got[n], want[n]) for n in want if got[n] != want[n]}
    assert not bad, f"rank {rank}: (layout, vLLM) {dict(list(bad.items())[:6])}"
    # the names alone (the cost model's count: one expert per fused parameter looked at) are the same, in order
    assert lay.param_names(rank) == [p.name for p in lps] and set(lay.param_names(rank)) == set(want)
    vals, counts = apply_segments(lps, hf)
    loaded = {n: torch.full(s, -1.0, dtype=torch.float64) for n, (s, _) in want.items()}
    load_like_vllm(model, dep, rank, loaded, hf)
    for n in want:
        assert int(counts[n].max()) <= 1, f"rank {rank}: {n} has elements written by two segments"
        assert torch.equal(vals[n], loaded[n]), f"rank {rank}: {n}: segments place boxes elsewhere than vLLM"
        # vLLM's loaders wrote every element (-1 nowhere); the segments all but vocab padding rows
        pad = counts[n] == 0
        assert not bool((loaded[n] == -1).any()), f"rank {rank}: {n}: vLLM's loaders left elements unwritten"
        assert bool((loaded[n][pad] == 0).all()), f"rank {rank}: {n}: uncovered elements that are not padding"


@pytest.mark.parametrize("case", GRID, ids=ident)
def test_local_params_are_vllms_on_every_rank(case, tmp_path):
    name, dep = case
    model = MODELS[name]()
    lay = layout_for(model, dep, tmp_path)
    hf = hf_tensors(name, model)
    for rank in range(dep.world):
        check_rank(model, dep, lay, rank, hf)


def test_eplb_map_file_with_an_expert_twice_on_one_rank(tmp_path):
    """An EPLB map (rebalanced at run time) may put one logical expert in two physical slots of one rank:
    both slots are listed, the second a duplicate segment with the same (hf_name, box)."""
    model = tiny_qwen3_moe()
    dep = D(tp=2, expert_parallel=True, redundant=2, phys_map=(0, 1, 2, 3, 0, 4, 5, 6, 7, 7))
    assert local_experts(model, dep, 0, 2) == [0, 1, 2, 3, 0] and local_experts(model, dep, 1, 2) == [4, 5, 6, 7, 7]
    lay = layout_for(model, dep, tmp_path)
    hf = hf_tensors("qwen3-moe", model)
    for rank in range(2):
        check_rank(model, dep, lay, rank, hf)
    (w13,) = [p for p in lay.local_params(1) if p.name == "model.layers.0.mlp.experts.w13_weight"]
    seven = [s for s in w13.segments if s.hf_name == "model.layers.0.mlp.experts.7.gate_proj.weight"]
    assert [s.offset for s in seven] == [(3, 0, 0), (4, 0, 0)] and seven[0].box == seven[1].box
    # the plan sees one holding per rank (the primary), not two
    pl = lay.placement(model.index("model.layers.0.mlp.experts.7.gate_proj.weight"))
    assert pl.holding(1) == (((0, 32), (0, 64)),)


def test_initial_eplb_map_repeats_experts_on_a_rank():
    """R > E: ``build_initial_global_physical_to_logical_map`` wraps, so rank 0 of 2 holds experts 0-3
    twice (slots 0-3 and 8-11)."""
    model = tiny_qwen3_moe()
    dep = D(tp=2, expert_parallel=True, redundant=16)
    assert local_experts(model, dep, 0, 2) == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    lay = layout_for(model, dep)
    (w2,) = [p for p in lay.local_params(0) if p.name == "model.layers.1.mlp.experts.w2_weight"]
    offs = [s.offset for s in w2.segments if s.hf_name == "model.layers.1.mlp.experts.2.down_proj.weight"]
    assert offs == [(2, 0, 0), (10, 0, 0)]


def test_module_named_parameters_are_the_table():
    """The helper's module yields exactly the table's names, shapes and dtypes (target and draft)."""
    model = tiny_deepseek(fp8=False)
    dep = D(tp=2, pp=2)
    want = vllm_params(model, dep, 3)
    got = {}
    for prefix, draft in (("", False), ("draft/", True)):
        got.update({prefix + n: (tuple(p.shape), str(p.dtype).removeprefix("torch."))
                    for n, p in vllm_module(model, dep, 3, draft=draft).named_parameters()})
    assert got == want
    assert "draft/model.layers.3.mtp_block.mlp.experts.w13_weight" in got
    assert got["model.layers.2.mlp.gate.e_score_correction_bias"] == ((8,), "float32")
    assert not any(n.startswith("model.layers.0.") for n in got)  # stage 0's layers are PPMissingLayer here


@settings(max_examples=25, deadline=None)
@given(data=st.data(), ep=st.sampled_from([1, 2, 4]), per_extra=st.integers(0, 5))
def test_any_eplb_map_lands_like_vllm(tmp_path_factory, data, ep, per_extra):
    """Any physical -> logical map (every expert somewhere, repeats anywhere, a rank may hold one expert in
    several slots): the layout's segments fill w13 / w2 as vLLM's loaders do, each slot exactly once."""
    model = tiny_qwen3_moe(layers=1)  # E = 8
    E, R = 8, ep * per_extra
    phys = data.draw(st.permutations(list(range(E)))) + data.draw(
        st.lists(st.integers(0, E - 1), min_size=R, max_size=R))
    order = data.draw(st.permutations(list(range(E + R))))
    dep = D(tp=ep, expert_parallel=ep > 1, redundant=R, phys_map=tuple(phys[i] for i in order))
    if ep == 1:  # no expert parallel: every expert, no map
        dep = D(tp=1)
    lay = layout_for(model, dep, tmp_path_factory.mktemp("maps"))
    hf = hf_tensors("qwen3-moe-1", model)
    for rank in range(dep.world):
        check_rank(model, dep, lay, rank, hf)


CATALOG = [
    ("llama-3.1-70b", {}, D(tp=8, pp=2)),
    ("qwen3-235b-a22b", {}, D(tp=8, expert_parallel=True, redundant=8)),  # 4 kv heads at tp=8: replicated
    ("deepseek-v3", {"include_mtp": True, "include_scales": True},
     D(tp=8, pp=2, expert_parallel=True, placement="round_robin")),  # fp8 checkpoint view, n_group=8
    ("tiny-llama", {}, D(tp=2, pp=2)), ("tiny-qwen3-moe", {}, D(tp=2, dp=2, expert_parallel=True)),
    ("tiny-deepseek", {"include_mtp": True}, D(tp=2, pp=2)),
]


@pytest.mark.parametrize("case", CATALOG, ids=lambda c: f"{c[0]}-{c[2].spec()}")
def test_catalog_models_at_real_shapes(case):
    """The catalog's presets at their real shapes (names, shapes, dtypes; no tensor data): the first and
    the last rank, which between them hold the embedding, the head, the MTP draft and every kind of layer."""
    name, view, dep = case
    model = load_model(name, **view)
    lay = layout_for(model, dep)
    for rank in (0, dep.world - 1):
        got = {p.name: (tuple(p.shape), p.dtype) for p in lay.local_params(rank)}
        want = vllm_params(model, dep, rank)
        assert sorted(lay.param_names(rank)) == sorted(want), rank
        assert got == want, (rank, sorted(set(got) ^ set(want))[:6],
                             [(n, got[n], want[n]) for n in set(got) & set(want) if got[n] != want[n]][:6])
