"""GLM-4.5 MoE and gpt-oss layouts: every tensor covered exactly once per replica on Megatron and vLLM, the
framework parameters (``local_params``) against vLLM's own (tests/helpers/vllm_modules.py, written from
glm4_moe.py) and Megatron's names, gpt-oss's stacked experts where ``gpt_oss.py`` slices them, the refusals
(gpt-oss on Megatron / SGLang / pp > 1 / MXFP4 / non-linear placement; GLM on SGLang), and one real gloo refit
of a tiny GLM-4.5 moving bit-exact bytes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reshardctl import api
from reshardctl.errors import LayoutError
from reshardctl.launch.local import run_local
from reshardctl.layout.build import build_layout
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.parallel_spec import ParallelSpec, parse_parallel
from reshardctl.layout.placement import box_shape
from reshardctl.layout.sglang import SglangLayout
from reshardctl.layout.vllm import STACKED_KINDS, VllmLayout
from reshardctl.models.catalog import load_model
from reshardctl.runtime.contract import RunOptions
from helpers.parallel_models import glm4_moe_model, gpt_oss_model
from helpers.vllm_modules import Deployment, glm4_moe_param_table, load_like_vllm_glm4_moe
from helpers.weight_checks import assert_inference_weights

SMALL = dict(H=64, hd=16, V=200, I=128, Im=32)  # nh=8, nkv=2, E=8; vocab padded to 256
GLM = glm4_moe_model(L=3, mtp=1, **SMALL)  # shared=1, first_dense=1, qk-norm, one MTP layer
GLM_NO_QK = glm4_moe_model(L=2, qk_norm=False, shared=2, first_dense=0, **SMALL)
OSS = gpt_oss_model()  # nh=8, nkv=2, hd=32, V=1000, E=8, Im=128, L=2


def counts(shape, boxes):
    """Per cell of the coordinate-compressed grid, how many boxes cover it."""
    cuts = [sorted({0, n} | {x for b in boxes for x in b[d]}) for d, n in enumerate(shape)]
    c = np.zeros([len(x) - 1 for x in cuts], dtype=np.int64)
    for b in boxes:
        c[tuple(slice(cuts[d].index(b[d][0]), cuts[d].index(b[d][1])) for d in range(len(shape)))] += 1
    return c


def check_once_per_replica(lay, replica_of) -> None:
    """Every tensor: inside each replica group (``replica_of(rank, tensor)``), its distinct holdings tile the
    tensor exactly once (replicated copies are one class)."""
    for i, t in enumerate(lay.model.tensors):
        groups: dict = {}
        for r, h in lay.placement(i).items():
            if h:
                groups.setdefault(replica_of(r, t), set()).add(h)
        assert groups, t.name
        for classes in groups.values():
            c = counts(t.shape, [b for h in classes for b in h])
            assert c.min() == 1 and c.max() == 1, (t.name, lay.describe(), classes)


def check_local_params(lay, rank, **kw) -> None:
    """Each segment inside its parameter, no two segments of a parameter overlapping (except an exact alias),
    and the segments exactly the rank's holdings."""
    seen: Counter = Counter()
    for p in lay.local_params(rank, **kw):
        regions = set()
        for s in p.segments:
            lead = len(s.offset) - len(s.box)
            region = (s.offset[:lead], tuple((o, o + n) for o, n in zip(s.offset[lead:], box_shape(s.box))))
            assert all(0 <= a and b <= n for (a, b), n in zip(region[1], p.shape[lead:])), (p.name, s)
            assert not any(r != region and r[0] == region[0] and all(max(a, c) < min(b, d) for (a, b), (c, d)
                                                                     in zip(r[1], region[1])) for r in regions), \
                (p.name, s)  # disjoint, or an exact alias (the MTP layer's embed_tokens copy)
            regions.add(region)
            seen[(s.hf_name, s.box)] += 1
    want = Counter((t.name, b) for i, t in enumerate(lay.model.tensors) for b in lay.placement(i).holding(rank))
    assert seen == want


# ---------------------------------------------------------------------------- Megatron: GLM-4.5
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["glm", "glm-no-qk"]), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 4]), etp=st.sampled_from([None, 1, 2]),
       spec=st.sampled_from(["te", "local"]))
def test_megatron_glm_coverage(model, tp, pp, dp, ep, etp, spec):
    m = GLM if model == "glm" else GLM_NO_QK
    try:
        lay = MegatronLayout(m, ParallelSpec(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp))
    except LayoutError:
        assume(False)
    # dense tensors: once per (dp, cp) replica; experts: once per expert-data-parallel replica
    S = lay.stage_size
    check_once_per_replica(lay, lambda r, t: ((r % S) // (lay.etp * lay.ep)) if t.expert is not None
                           else (r % S) // lay.tp)
    for r in {0, lay.world_size - 1}:
        check_local_params(lay, r, spec=spec)


def test_megatron_glm_qkv_bias_is_linear_qkv_bias_interleaved_per_group():
    """megatron-core SelfAttention: linear_qkv (with add_qkv_bias, Megatron-Bridge GLM45Bridge) holds
    [q heads of group g | k_g | v_g] per query group; the bias rows follow the weight rows exactly."""
    lay = MegatronLayout(GLM, ParallelSpec(tp=4))  # nkv=2 < tp=4: a rank holds half a query group
    for r in range(4):
        params = {p.name: p for p in lay.local_params(r)}
        w, b = (params[f"decoder.layers.1.self_attention.linear_qkv.{x}"] for x in ("weight", "bias"))
        assert b.shape == (w.shape[0],) == (((8 + 2 * 2) * 16) // 4,)
        wseg = sorted((s.hf_name.rsplit(".", 2)[-2], s.box[0], s.offset[0]) for s in w.segments)
        bseg = sorted((s.hf_name.rsplit(".", 2)[-2], s.box[0], s.offset[0]) for s in b.segments)
        assert wseg == bseg and len(bseg) >= 1
    # group g = [4 q heads | k_g | v_g] = 96 rows, 192 in all, 48 a rank: rank 1 holds rows 48-95 of the global
    # linear_qkv = q head 3 (q rows 48:64), k_0, v_0
    b1 = next(p for p in lay.local_params(1) if p.name == "decoder.layers.0.self_attention.linear_qkv.bias")
    assert sorted((s.hf_name.split(".")[-2], s.box, s.offset) for s in b1.segments) == [
        ("k_proj", ((0, 16),), (16,)), ("q_proj", ((48, 64),), (0,)), ("v_proj", ((0, 16),), (32,))]


def test_megatron_glm_names():
    lay = MegatronLayout(glm4_moe_model(L=4, mtp=1, **SMALL), ParallelSpec(tp=2, ep=2, pp=2))
    last = {p.name for p in lay.local_params(lay.world_size - 1)}
    first = {p.name for p in lay.local_params(0)}
    assert {"decoder.layers.0.self_attention.linear_qkv.bias", "decoder.layers.0.self_attention.q_layernorm.weight",
            "decoder.layers.0.mlp.linear_fc1.weight", "embedding.word_embeddings.weight"} <= first
    assert {"mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.bias", "mtp.layers.0.eh_proj.weight",
            "decoder.layers.0.mlp.router.expert_bias", "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
            "decoder.layers.0.mlp.experts.linear_fc1.weight0"} <= last


# ---------------------------------------------------------------------------- vLLM: GLM-4.5
def vllm_replica(lay):
    """vLLM: experts span the engine's MoE world (in_engine: all dp x tp; engines: one engine), the rest one
    engine (dp replica)."""
    per = lay.tp * lay.pp

    def of(r, t):
        if (t.expert is not None or t.kind in STACKED_KINDS) and lay.dp_mode == "in_engine":
            return 0
        return r // per
    return of


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
       ep_on=st.booleans(), mode=st.sampled_from(["in_engine", "engines"]))
def test_vllm_glm_coverage(tp, pp, dp, ep_on, mode):
    try:
        lay = VllmLayout(GLM, ParallelSpec(tp=tp, pp=pp, dp=dp, expert_parallel=ep_on, dp_mode=mode))
    except LayoutError:
        assume(False)
    check_once_per_replica(lay, vllm_replica(lay))
    for r in {0, lay.world_size - 1}:
        check_local_params(lay, r)


def hf_values(model):
    out, base = {}, 0
    for t in model.tensors:
        out[t.name] = (torch.arange(t.numel, dtype=torch.float64) + base + 1).reshape(t.shape)
        base += t.numel
    return out


@pytest.mark.parametrize("model,dep", [
    (GLM, Deployment(tp=1)), (GLM, Deployment(tp=2)), (GLM, Deployment(tp=4)),  # tp=4 > nkv=2: kv replicated
    (GLM, Deployment(tp=2, pp=2)), (GLM, Deployment(tp=2, expert_parallel=True)),
    # in-engine DP + EP + tp > 1: sequence-parallel MoE; GLM's shared experts stay TP-split (Glm4MoeMLP)
    (GLM, Deployment(tp=2, dp=2, expert_parallel=True)),
    (GLM_NO_QK, Deployment(tp=2, dp=2)),
], ids=lambda x: x.spec() if isinstance(x, Deployment) else x.name)
def test_vllm_glm_local_params_are_vllms(model, dep):
    """The layout's parameters on every rank: the names, shapes and dtypes glm4_moe.py builds, and the segments
    put every HF box where glm4_moe.py's loaders put it."""
    lay = VllmLayout(model, parse_parallel(dep.spec()), world_size=dep.world)
    hf = hf_values(model)
    for rank in range(dep.world):
        lps = lay.local_params(rank)
        got = {p.name: (tuple(p.shape), p.dtype) for p in lps}
        want = {n: (v.shape, v.dtype) for n, v in glm4_moe_param_table(model, dep, rank).items()}
        assert got == want, (rank, sorted(set(got) ^ set(want))[:6],
                             [(n, got[n], want[n]) for n in got if n in want and got[n] != want[n]][:4])
        vals = {p.name: torch.zeros(p.shape, dtype=torch.float64) for p in lps}
        for p in lps:
            for s in p.segments:
                lead = len(s.offset) - len(s.box)
                idx = tuple(s.offset[:lead]) + tuple(slice(o, o + b - a) for o, (a, b) in zip(s.offset[lead:], s.box))
                vals[p.name][idx] = hf[s.hf_name][tuple(slice(a, b) for a, b in s.box)]
        loaded = {n: torch.zeros(s, dtype=torch.float64) for n, (s, _) in want.items()}
        load_like_vllm_glm4_moe(model, dep, rank, loaded, hf)
        for n in want:
            assert torch.equal(vals[n], loaded[n]), (rank, n)


def test_vllm_glm_gate_is_fp32_and_binding_would_convert():
    """glm4_moe.py Glm4MoE: gate = nn.Linear(..., dtype=torch.float32): the parameter is fp32 while the
    checkpoint's mlp.gate.weight is the model dtype; the layout says so (bind refuses the conversion)."""
    lay = VllmLayout(GLM, ParallelSpec(tp=2))
    gate = next(p for p in lay.local_params(0) if p.name == "model.layers.1.mlp.gate.weight")
    assert gate.dtype == "float32" and GLM.tensor("model.layers.1.mlp.gate.weight").dtype == "bfloat16"


def test_sglang_refuses_glm_and_gpt_oss():
    for m in (GLM, OSS):
        with pytest.raises(LayoutError, match=rf"SGLang's .* layout \({m.dims.arch}\) is not modelled"):
            SglangLayout(m, ParallelSpec(tp=2))


# ---------------------------------------------------------------------------- vLLM: gpt-oss
def boxes(lay, name, rank):
    return lay.placement(lay.model.index(name)).holding(rank)


def test_vllm_gpt_oss_tp_slices_as_gpt_oss_py():
    """gpt_oss.py _load_weights_other without EP, fused-MoE TP rank r of n (per = ceil(I / n)):
    w13 = gate_up_proj[:, :, 2*r*per : 2*(r+1)*per] (interleaved gate/up: one contiguous range), w13_bias the same
    columns, w2 = down_proj[:, r*per : (r+1)*per, :], w2_bias whole on rank 0 and zeroed elsewhere; sinks narrowed
    to heads [r*nh/n, (r+1)*nh/n)."""
    E, Im, H, nh = 8, 128, 256, 8
    lay = VllmLayout(OSS, ParallelSpec(tp=4))
    pre = "model.layers.1."
    for r in range(4):
        per = -(-Im // 4)
        assert boxes(lay, pre + "mlp.experts.gate_up_proj", r) == (((0, E), (0, H), (2 * r * per, 2 * (r + 1) * per)),)
        assert boxes(lay, pre + "mlp.experts.gate_up_proj_bias", r) == (((0, E), (2 * r * per, 2 * (r + 1) * per)),)
        assert boxes(lay, pre + "mlp.experts.down_proj", r) == (((0, E), (r * per, (r + 1) * per), (0, H)),)
        assert boxes(lay, pre + "mlp.experts.down_proj_bias", r) == ((((0, E), (0, H)),) if r == 0 else ())
        assert boxes(lay, pre + "self_attn.sinks", r) == (((r * nh // 4, (r + 1) * nh // 4),),)
        assert boxes(lay, pre + "self_attn.o_proj.bias", r) == (((0, H),),)  # RowParallelLinear: full bias
        assert boxes(lay, pre + "mlp.router.bias", r) == (((0, E),),)
    check_once_per_replica(lay, vllm_replica(lay))


def test_vllm_gpt_oss_ep_and_in_engine_dp():
    """With EP: weight[ep_rank_start:ep_rank_end] (E // ep contiguous experts, down_proj_bias included); the
    fused-MoE world flattened over dp x tp (FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp)."""
    lay = VllmLayout(OSS, ParallelSpec(tp=2, dp=2, ep=4))
    for r in range(4):
        for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            (b,) = boxes(lay, f"model.layers.0.mlp.experts.{n}", r)
            assert b[0] == (2 * r, 2 * r + 2) and all(x == (0, s) for x, s in zip(b[1:], OSS.tensor(
                f"model.layers.0.mlp.experts.{n}").shape[1:]))
    check_once_per_replica(lay, vllm_replica(lay))
    flat = VllmLayout(OSS, ParallelSpec(tp=2, dp=2, dp_mode="in_engine"))  # no EP: MoE TP over dp*tp = 4
    assert boxes(flat, "model.layers.0.mlp.experts.down_proj", 3) == (((0, 8), (96, 128), (0, 256)),)
    engines = VllmLayout(OSS, ParallelSpec(tp=2, dp=2, dp_mode="engines"))  # each engine: MoE TP over its tp=2
    assert boxes(engines, "model.layers.0.mlp.experts.down_proj", 3) == (((0, 8), (64, 128), (0, 256)),)
    assert boxes(engines, "model.layers.0.mlp.experts.down_proj_bias", 2) == (((0, 8), (0, 256)),)
    check_once_per_replica(engines, vllm_replica(engines))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2]), ep_on=st.booleans(),
       mode=st.sampled_from(["in_engine", "engines"]))
def test_vllm_gpt_oss_coverage(tp, dp, ep_on, mode):
    try:
        lay = VllmLayout(OSS, ParallelSpec(tp=tp, dp=dp, expert_parallel=ep_on, dp_mode=mode))
    except LayoutError:
        assume(False)
    check_once_per_replica(lay, vllm_replica(lay))


@pytest.mark.parametrize("spec,words", [
    ("tp=2,pp=2", "every pipeline rank"),
    ("tp=2,ep=2,redundant=2", "contiguous blocks"),
    ("tp=1,dp=3,ep=3", "num_local_experts=8 (8/3"),
    ("tp=1,dp=3,dp_mode=in_engine", "world size 3 (MLPBlock asserts"),
])
def test_vllm_gpt_oss_refusals(spec, words):
    with pytest.raises(LayoutError) as e:
        VllmLayout(OSS, parse_parallel(spec))
    assert words in str(e.value), str(e.value)


def test_vllm_gpt_oss_round_robin_request_is_linear():
    # no expert groups (n_group): vLLM's determine_expert_map falls back to linear, which gpt_oss.py loads
    lay = VllmLayout(OSS, parse_parallel("tp=2,ep=2,placement=round_robin"))
    assert "placement=linear" in lay.describe()


def test_gpt_oss_refusals_name_why():
    with pytest.raises(LayoutError, match="w13_weight = gate_up_proj.*permute"):
        VllmLayout(OSS, ParallelSpec(tp=2)).local_params(0)
    with pytest.raises(LayoutError, match="Megatron gpt-oss is not modelled.*de-interleaved"):
        MegatronLayout(OSS, ParallelSpec(tp=2))
    with pytest.raises(LayoutError, match="_load_weights_mxfp4"):  # the published config is MXFP4
        VllmLayout(load_model("gpt-oss-20b"), ParallelSpec(tp=4))
    VllmLayout(load_model("tiny-gpt-oss"), ParallelSpec(tp=4))  # a BF16 config: fine
    with pytest.raises(LayoutError, match="stacked experts and attention sinks"):
        build_layout(OSS, "train", "tp=2", "dtensor")
    assert build_layout(OSS, "train", "dp=2", "dtensor").world_size == 2  # FSDP: every rank the whole tensors


# ---------------------------------------------------------------------------- presets at scale
def test_glm45_presets_at_scale():
    """NeMo RL / verl style GLM-4.5 deployments build, and every expert lands once per engine."""
    m = load_model("glm-4.5-air")
    tr = MegatronLayout(m, ParallelSpec(tp=4, pp=2, ep=8))
    assert tr.world_size == 4 * 8 * 2  # dp = lcm(tp, etp * ep) / tp = 8
    inf = VllmLayout(m, ParallelSpec(tp=8, dp=4, dp_mode="engines"))
    e100 = tr.placement(m.index("model.layers.10.mlp.experts.100.down_proj.weight"))
    assert {tr.coords(r)["ep"] for r, h in e100.items() if h} == {100 // 16}  # 128 experts / ep 8, contiguous
    i = m.index("model.layers.10.mlp.experts.100.down_proj.weight")
    assert [b for _, h in inf.placement(i).items() for b in h][:2] == [((0, 4096), (0, 176)), ((0, 4096), (176, 352))]
    assert "model.layers.10.self_attn.qkv_proj.bias" in {p.name for p in inf.local_params(0)}


# ---------------------------------------------------------------------------- a real refit (gloo, real bytes)
def test_tiny_glm_refit_bit_exact(tmp_path):
    """Megatron tp=1,ep=2 (2 ranks) -> vLLM tp=2 (2 ranks) of the tiny GLM-4.5 with its MTP layer, over gloo:
    every inference rank ends with exactly its boxes of the step's bytes (q/k/v biases, fp32 router bias and
    the MTP layer included)."""
    plan = api.plan_refit(model="tiny-glm-4.5", train="tp=1,ep=2", infer="tp=2", mtp=True)
    names = {plan.model.tensors[i].name for d in range(plan.infer_world) for i in plan.dst_holdings(d)}
    assert {"model.layers.1.self_attn.k_proj.bias", "model.layers.3.mlp.gate.e_score_correction_bias",
            "model.layers.3.eh_proj.weight"} <= names
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, first_step=4, timeout_s=60.0,
                                         dump_weights=True, device="cpu", full_check=True))
    assert [r.ok for r in reports] == [True] * 4
    assert_inference_weights(tmp_path, plan, 5)
