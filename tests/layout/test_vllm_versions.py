"""Issue 24, vLLM part: the data-parallel default that matches the RL frameworks, several in-engine-DP
engines, the per-version vLLM rules (``vllm=<version>``) and the embed/norm/lm_head copies vLLM builds on
every pipeline stage. Each rule is re-derived here from the source line cited next to it (vLLM 0.33.0 and
0.14.1 wheels from PyPI; NeMo RL ``nemo_rl/models/generation/vllm/vllm_generation.py``)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st

from reshardctl.errors import LayoutError
from reshardctl.layout.parallel_spec import parse_parallel as P
from reshardctl.layout.vllm import VllmLayout
from reshardctl.models import load_model
from helpers.parallel_models import build_model, tiny_deepseek_grouped, tiny_llama, tiny_qwen3_moe


def rank_of(tp, pp, dp, TP, PP):  # vLLM / NeMo RL: arange(world).reshape(DP, PP, TP)
    return tp + TP * (pp + PP * dp)


def holders(lay, m, name):
    return {r for r, h in lay.placement(m.index(name)).items() if h}


def linear_owner(E, ep, e):
    """determine_expert_map (linear): base, rem = divmod(E, ep), the first rem ranks hold one more."""
    base, rem = divmod(E, ep)
    for j in range(ep):
        start = j * base + min(j, rem)
        if start <= e < start + base + (1 if j < rem else 0):
            return j
    raise AssertionError


# ------------------------------------------------------------------ item 2: the data-parallel default
def test_nemo_rl_deepseek_v3_recipe_gives_expert_columns_0_64_on_rank_0(capsys):
    """NeMo RL's DeepSeek-V3 generation (vLLM tp=32, 8 replicas, no expert parallel) runs 8 engines: each
    expert's down_proj is split over one engine's 32 TP ranks (2048 / 32 = 64 columns), not over 256."""
    m = load_model("deepseek-v3")
    lay = VllmLayout(m, P("tp=32,dp=8"))
    assert lay.dp_mode == "engines" and lay.engines == 8 and not lay.expert_parallel
    name = f"model.layers.{m.dims.moe_layers[0]}.mlp.experts.0.down_proj.weight"
    assert lay.placement(m.index(name)).holding(0) == (((0, 7168), (0, 64)),)
    assert lay.placement(m.index(name)).holding(rank_of(0, 0, 7, 32, 1)) == (((0, 7168), (0, 64)),)
    rules = lay.framework_rules()
    assert "EP = TP" not in rules and "experts TP-split over tp=32 inside each, no EP" in rules
    from reshardctl.cli import main

    assert main(["layout", "show", "--model", "tiny-deepseek", "--side", "infer", "--infer", "tp=2,dp=2"]) == 0
    out = capsys.readouterr().out  # (the message was "EP = TP = 2 inside each" with EP off)
    assert "EP = TP" not in out and "2 separate engines, one per replica (experts TP-split over tp=2" in out


def test_moonlight_like_tp4_dp6_is_six_engines():
    """verl's Moonlight script (tp=4, dp=6; moe_intermediate_size 1408): as six engines the experts are split
    over tp=4 (352 rows each); as one in-engine-DP engine vLLM would split them over 24 (refused)."""
    m = build_model("moonlight-like", arch="deepseek_v3", H=2048, L=2, nh=16, nkv=16, hd=192, V=163840, I=11264,
                    E=64, Im=1408, shared=2, first_dense=1, mla=dict(q_lora=0, kv_lora=512, nope=128, rope=64, v=128))
    lay = VllmLayout(m, P("tp=4,dp=6"))
    assert lay.dp_mode == "engines" and lay.moe_tp == 4
    box = lay.placement(m.index("model.layers.1.mlp.experts.5.gate_proj.weight")).holding(rank_of(1, 0, 5, 4, 1))
    assert box == (((352, 704), (0, 2048)),)
    with pytest.raises(LayoutError, match=r"dp\(6\) x tp\(4\) = 24 does not divide moe_intermediate_size=1408"):
        VllmLayout(m, P("tp=4,dp=6,dp_mode=in_engine"))


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), k=st.sampled_from([1, 2, 4]), engines=st.sampled_from([1, 2, 3]),
       ep_given=st.booleans())
def test_default_dp_mode_and_engine_groups(tp, k, engines, ep_given):
    """NeMo RL (vllm_generation.py, VllmGeneration.__init__): ``vllm_dp_size = ep_size // tp_size`` and
    ``VLLM_DP_SIZE`` is set only when ``ep_size > tp_size``; the cluster's ``world // (tp*pp)`` replicas then
    form ``world / (pp*ep)`` engines of ``vllm_dp_size`` DP ranks each. vLLM (fused_moe/config.py
    FusedMoEParallelConfig.make) flattens one engine's DP x TP into its EP group."""
    m = tiny_qwen3_moe()
    E, dp = m.dims.num_experts, k * engines
    ep = k * tp
    assume(ep <= E)  # vLLM: EP over more ranks than experts is refused (tested elsewhere)
    spec = f"tp={tp},dp={dp}" + (f",ep={ep}" if ep_given and ep > 1 else "")
    lay = VllmLayout(m, P(spec))
    in_engine = ep_given and ep > tp
    assert lay.dp_mode == ("in_engine" if in_engine else "engines")
    group = ep if in_engine else tp  # the MoE world of one engine
    assert lay.engines == (dp // k if in_engine else dp)
    layer = m.dims.moe_layers[0]
    for e in range(E):
        name = f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"
        if ep_given and ep > 1:  # EP over the engine's group; every engine holds each expert once
            owner = linear_owner(E, group, e)
            per_engine = group // tp
            want = {rank_of(owner % tp, 0, g * per_engine + owner // tp, tp, 1) for g in range(dp // per_engine)}
            assert holders(lay, m, name) == want
        else:  # no EP: TP-split over tp inside each engine (no in-engine DP by default)
            assert holders(lay, m, name) == set(range(dp * tp))
            n = m.dims.moe_intermediate // tp
            assert lay.placement(m.index(name)).holding(dp * tp - 1) == (((0, 64), ((tp - 1) * n, tp * n)),)


def test_several_in_engine_dp_engines_from_world_size():
    """NeMo RL with ep > tp on more GPUs than ep: 32 GPUs, tp=2, ep=8 -> 16 replicas in 4 engines of vLLM DP 4."""
    m = load_model("qwen3-30b-a3b")
    lay = VllmLayout(m, P("tp=2,ep=8"), world_size=32)
    assert (lay.dp, lay.dp_mode, lay.engine_dp, lay.engines, lay.ep) == (16, "in_engine", 4, 4, 8)
    assert "engines=4" in lay.describe() and "4 engine(s) of dp=4 x tp=2" in lay.framework_rules()
    name = f"model.layers.0.mlp.experts.{127}.up_proj.weight"  # EP rank 7 = (dp 3, tp 1) of each engine
    assert holders(lay, m, name) == {rank_of(1, 0, 4 * g + 3, 2, 1) for g in range(4)}
    with pytest.raises(LayoutError, match=r"ep=8 = tp\(2\) x 4 in-engine DP ranks, which does not divide dp=6"):
        VllmLayout(m, P("tp=2,dp=6,ep=8"))
    with pytest.raises(LayoutError, match=r"ep=6 with in-engine DP must be a multiple of tp=4 .*6 % 4 = 2"):
        VllmLayout(m, P("tp=4,dp=3,ep=6"))


# ------------------------------------------------------------------ item 3: rules per vLLM version
def sp_of(spec, version):
    m = load_model("tiny-deepseek")
    return VllmLayout(m, P(f"{spec},vllm={version}")).sp_moe


@pytest.mark.parametrize("backend,sp", [
    # vLLM 0.33.0 config/parallel.py:768-785 use_sequence_parallel_moe
    ("deepep_v2", True), ("flashinfer_nvlink_one_sided", True), ("passthrough", True), ("nixl_ep", True),
    ("deepep_high_throughput", True), ("mori_low_latency", True),
    ("flashinfer_nvlink_two_sided", False), ("flashinfer_all2allv", False),  # (moonep: refused here, below)
    # 0.33.0 config/parallel.py:537-543: naive and pplx "have been removed" -> allgather_reducescatter, which
    # is in the list above: sequence-parallel MoE is ON (the reading, off, ignores this fallback)
    ("naive", True), ("pplx", True),
])
def test_vllm_033_sequence_parallel_backends(backend, sp):
    assert sp_of(f"tp=2,dp=2,ep=4,all2all={backend}", "0.33") is sp
    lay = VllmLayout(load_model("tiny-deepseek"), P(f"tp=2,dp=2,ep=4,all2all={backend}"))  # 0.33 is the default
    assert lay.sp_moe is sp
    name = "model.layers.1.mlp.shared_experts.down_proj.weight"
    H, W = lay.model.tensor(name).shape  # DeepseekV2MLP(disable_tp=sp): whole, or row-parallel columns of tp 1
    want = ((0, H), (0, W)) if sp else ((0, H), (W // 2, W))
    assert lay.placement(lay.model.index(name)).holding(1) == (want,)


@pytest.mark.parametrize("backend,sp", [
    # vLLM 0.14.1 config/parallel.py:429-441 use_sequence_parallel_moe: naive yes, pplx no
    ("naive", True), ("allgather_reducescatter", True), ("deepep_low_latency", True), ("pplx", False),
    ("flashinfer_all2allv", False),
])
def test_vllm_014_sequence_parallel_backends(backend, sp):
    assert sp_of(f"tp=2,dp=2,ep=4,all2all={backend}", "0.14") is sp


@pytest.mark.parametrize("backend", ["deepep_v2", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
                                     "passthrough", "moonep", "nixl_ep", "mori_high_throughput"])
def test_033_only_backend_refused_under_014(backend):
    """vLLM 0.14.1 config/parallel.py:40-47 All2AllBackend has none of these; 0.33.0 :45-60 has them all."""
    with pytest.raises(LayoutError, match=rf"all2all='{backend}' is not a backend of vLLM 0.14 \(expected one of "
                                          r"allgather_reducescatter, deepep_high_throughput"):
        VllmLayout(load_model("tiny-deepseek"), P(f"tp=2,dp=2,ep=4,all2all={backend},vllm=0.14"))
    VllmLayout(load_model("tiny-deepseek"), P(f"tp=2,dp=2,ep=2,all2all={backend},vllm=0.33"))  # (engines: moonep ok)


@pytest.mark.parametrize("backend,version,kept", [
    # 0.33.0 fused_moe/expert_map_manager.py:137-147 + fused_moe/config.py:1070-1071
    # (needs_round_robin_routing_tables = use_deepep_ll_kernels or use_nixl_ep_kernels)
    ("nixl_ep", "0.33", True), ("deepep_low_latency", "0.33", True), ("deepep_v2", "0.33", False),
    ("mori_low_latency", "0.33", False), ("allgather_reducescatter", "0.33", False),  # (moonep: only linear, below)
    # 0.14.1 fused_moe/layer.py:200-210: only use_deepep_ll_kernels
    ("deepep_low_latency", "0.14", True), ("allgather_reducescatter", "0.14", False),
])
def test_round_robin_kept_per_version(backend, version, kept):
    m = tiny_deepseek_grouped()  # n_group=2: round_robin allowed at all
    lay = VllmLayout(m, P(f"tp=1,dp=4,ep=4,placement=round_robin,all2all={backend},vllm={version}"))
    assert lay.expert_map.strategy == ("round_robin" if kept else "linear")
    e = 5  # round_robin: EP rank e % 4; linear: e // 2 (8 experts over 4)
    want = e % 4 if kept else e // 2
    assert holders(lay, m, f"model.layers.1.mlp.experts.{e}.gate_proj.weight") == {want}
    # separate engines have no all2all kernels (use_all2all_kernels needs in-engine dp > 1): always kept
    lay = VllmLayout(m, P(f"tp=4,dp=2,ep=4,placement=round_robin,all2all={backend},vllm={version}"))
    assert lay.expert_map.strategy == "round_robin"


def test_unknown_version_refused_listing_known_ones():
    with pytest.raises(LayoutError, match=r"vllm=0.20: no rules for this vLLM version \(known: 0.14, 0.29, 0.33; "
                                          r"default 0.33\)"):
        VllmLayout(load_model("tiny-qwen3-moe"), P("tp=2,vllm=0.20"))
    for v in ("0.33.0", "0.33.1", "v0.33"):
        assert VllmLayout(load_model("tiny-qwen3-moe"), P(f"tp=2,vllm={v}")).version_rules.version == "0.33"
    with pytest.raises(LayoutError, match="vllm=latest: no rules"):
        VllmLayout(load_model("tiny-qwen3-moe"), P("tp=2,vllm=latest"))
    lay = VllmLayout(load_model("tiny-qwen3-moe"), P("tp=2,vllm=0.14"))
    assert ",vllm=0.14" in lay.describe() and "vLLM 0.14.1: config/parallel.py:40-47" in lay.framework_rules()
    from reshardctl.layout.sglang import SglangLayout

    with pytest.raises(LayoutError, match="vllm is not a SGLang option"):
        SglangLayout(load_model("tiny-qwen3-moe"), P("tp=2,vllm=0.33"))


@pytest.mark.parametrize("backend,sp", [
    # vLLM 0.29.0 (NeMo RL v0.8.0's container) config/parallel.py:704-719: 0.33's list without deepep_v2 and
    # passthrough; :488-494 the same naive/pplx fallback to allgather_reducescatter
    ("deepep_v2", False), ("naive", True), ("pplx", True), ("nixl_ep", True), ("flashinfer_nvlink_one_sided", True),
    ("flashinfer_nvlink_two_sided", False), ("mori_high_throughput", True),
])
def test_vllm_029_sequence_parallel_backends(backend, sp):
    assert sp_of(f"tp=2,dp=2,ep=4,all2all={backend}", "0.29") is sp


@pytest.mark.parametrize("backend", ["moonep", "passthrough"])
def test_033_only_backends_refused_under_029(backend):
    """vLLM 0.29.0 config/parallel.py:42-55 All2AllBackend has neither."""
    with pytest.raises(LayoutError, match=rf"all2all='{backend}' is not a backend of vLLM 0.29"):
        VllmLayout(load_model("tiny-deepseek"), P(f"tp=2,dp=2,ep=4,all2all={backend},vllm=0.29"))


def test_moonep_refused_where_its_kernels_replace_the_experts():
    """vLLM 0.33.0: with EP and in-engine DP > 1 (use_moonep_kernels, fused_moe/config.py:1102-1103) MoonEP's
    experts are picked (oracle/unquantized.py:300-303) and w13_weight / w2_weight replaced after loading by
    all-gathered [E+B] tensors (:424-456), a reload raising NotImplementedError (:440-448): refused. Separate
    engines (no all2all kernels) and no EP keep vLLM's ordinary experts."""
    m = load_model("tiny-deepseek")
    with pytest.raises(LayoutError, match=r"all2all=moonep with expert parallel and in-engine DP > 1 .*"
                                          r"oracle/unquantized.py:300-303.*:440-448 raises NotImplementedError"):
        VllmLayout(m, P("tp=2,dp=2,ep=4,all2all=moonep"))
    for ok in ("tp=2,dp=2,ep=2,all2all=moonep", "tp=2,dp=2,all2all=moonep,dp_mode=in_engine"):
        lay = VllmLayout(m, P(ok))
        assert not lay.sp_moe  # moonep is not sequence-parallel (config/parallel.py:768-785)
    # config/vllm.py:2106-2140: unquantized bf16 only, no EPLB, linear placement, whatever the kernels
    with pytest.raises(LayoutError, match=r"all2all=moonep: vLLM 0.33.0 refuses EPLB .*config/vllm.py:2106-2140"):
        VllmLayout(m, P("tp=2,dp=2,ep=2,all2all=moonep,redundant=2"))
    with pytest.raises(LayoutError, match=r"refuses placement=round_robin with this backend"):
        VllmLayout(tiny_deepseek_grouped(), P("tp=4,dp=2,ep=4,all2all=moonep,placement=round_robin"))
    with pytest.raises(LayoutError, match=r"refuses a quantized checkpoint"):
        VllmLayout(load_model("tiny-deepseek", include_scales=True), P("tp=1,dp=2,ep=1,all2all=moonep"))


def test_cli_bad_all2all_exits_2_naming_the_key_and_the_values(capsys):
    from reshardctl.cli import main

    show = ["layout", "show", "--model", "tiny-deepseek", "--side", "infer", "--infer"]
    rc = main([*show, "tp=2,dp=2,ep=4,all2all=nccl"])
    err = capsys.readouterr().err
    assert rc == 2 and "all2all='nccl' is not a backend of vLLM 0.33 (expected one of allgather_reducescatter," in err
    assert "moonep" in err and "passthrough" in err and "Traceback" not in err
    rc = main([*show, "tp=2,dp=2,ep=4,all2all=moonep"])
    assert rc == 2 and "NotImplementedError on a weight reload" in capsys.readouterr().err


def test_cli_refuses_unknown_version_with_exit_2(capsys):
    from reshardctl.cli import main

    rc = main(["layout", "show", "--model", "tiny-qwen3-moe", "--side", "infer", "--infer", "tp=2,vllm=9.9"])
    err = capsys.readouterr().err
    assert rc == 2 and "vllm=9.9: no rules for this vLLM version (known: 0.14, 0.29, 0.33" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ item 4: pipeline copies
def test_qwen3_moe_builds_embed_norm_head_on_every_stage():
    """vLLM 0.33.0 qwen3_moe.py:468 (embed_tokens), :479 (norm) in Qwen3MoeModel.__init__ and :580 (lm_head)
    in Qwen3MoeForCausalLM.__init__, with no PPMissingLayer: every pipeline rank loads them, so every
    stage's copy must receive the new weights. Llama (llama.py:377-397, :502-517) builds them on the first /
    last rank only."""
    m = tiny_qwen3_moe()
    lay = VllmLayout(m, P("tp=2,pp=2,dp=2"))
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert holders(lay, m, name) == set(range(8)), name
    stage1 = rank_of(1, 1, 1, 2, 2)
    params = {p.name: p for p in lay.local_params(stage1)}
    emb = params["model.embed_tokens.weight"]
    assert emb.shape == (512, 64) and emb.segments[0].box == ((512, 1003), (0, 64))
    assert "model.norm.weight" in params and "lm_head.weight" in params
    assert "every pipeline stage" in lay.framework_rules()
    dense = tiny_llama()
    lay_d = VllmLayout(dense, P("tp=2,pp=2"))
    assert holders(lay_d, dense, "model.embed_tokens.weight") == {0, 1}
    assert holders(lay_d, dense, "lm_head.weight") == {2, 3}


def test_plan_delivers_the_pipeline_copies():
    """A plan from a Megatron trainer to vLLM pp=2: replayed, every stage's embed/norm/lm_head copy lands
    byte-exact (helpers.plan_checker.check_plan replays every destination box)."""
    from helpers.plan_checker import check_plan
    from reshardctl.layout.megatron import MegatronLayout
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    m = tiny_qwen3_moe()
    train = MegatronLayout(m, P("tp=2,pp=2,vocab_divisor=128"))
    infer = VllmLayout(m, P("tp=2,pp=2"))
    plan = build_plan(m, train, infer, Topology(train.world_size, infer.world_size, 8, 1), bucket_bytes=1 << 16)
    check_plan(plan)
    emb = m.index("model.embed_tokens.weight")
    assert emb in plan.dst_holdings(2) and m.index("lm_head.weight") in plan.dst_holdings(0)


def test_sglang_keeps_first_and_last_stage_only():
    from reshardctl.layout.sglang import SglangLayout

    m = tiny_qwen3_moe()
    lay = SglangLayout(m, P("tp=2,pp=2"))
    assert holders(lay, m, "model.embed_tokens.weight") == {0, 1}

