"""vLLM deployments as RL stacks run them (issue 12, items 1, 2, 6, 7, 8): reshardctl's per-rank holdings
against independent re-derivations of vLLM's rules, on the shipped presets where each rule applies.

Re-derivations follow the vLLM source: ``ParallelConfig.use_sequence_parallel_moe`` and ``DeepseekV2MoE``
(shared experts with ``disable_tp``), ``LlamaModel.__init__`` (tied embedding on the last PP rank),
``FusedMoEParallelConfig.make`` + ``determine_expert_map`` + ``determine_expert_placement_strategy``,
``EplbState.build_initial_global_physical_to_logical_map`` and ``validate_fp8_block_shape`` /
``Fp8MoEMethod.create_weights``.
"""

from __future__ import annotations

import json
import random

import pytest

from reshardctl.errors import LayoutError
from reshardctl.layout.parallel_spec import parse_parallel as P
from reshardctl.layout.vllm import VllmLayout
from reshardctl.models import load_model
from helpers.parallel_models import tiny_llama

# vLLM 0.33.0 config/parallel.py:768-785 use_sequence_parallel_moe; :537-543 naive and pplx are replaced by
# allgather_reducescatter at validation (so they run as the default backend, sequence parallel included)
SP_BACKENDS = {"allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
               "flashinfer_nvlink_one_sided", "passthrough", "mori_high_throughput", "mori_low_latency", "nixl_ep"}
REPLACED = {"naive": "allgather_reducescatter", "pplx": "allgather_reducescatter"}


def full_rows(shape):
    return tuple((0, n) for n in shape)


def rank_of(tp, pp, dp, TP, PP):  # arange(world).reshape(DP, PP, TP)
    return tp + TP * (pp + PP * dp)


def param(lay, rank, name, _cache={}):
    """The local parameter ``name`` on ``rank`` (local_params cached per layout and rank)."""
    if _cache.get("lay") is not lay:
        _cache.clear()
        _cache["lay"] = lay
    if rank not in _cache:
        _cache[rank] = {p.name: p for p in lay.local_params(rank)}
    return _cache[rank][name]


# ------------------------------------------------------------------ item 1: shared experts under SP-MoE
SHARED_CASES = [  # (spec, in-engine dp, ep on, all2all)
    ("tp=8,dp=2,ep=16", 2, True, "allgather_reducescatter"),
    ("tp=8,dp=2,ep=16,all2all=pplx", 2, True, "pplx"),
    ("tp=8,dp=2,ep=16,all2all=deepep_low_latency", 2, True, "deepep_low_latency"),
    ("tp=8,dp=2", 2, False, "allgather_reducescatter"),
    ("tp=8,ep=8", 1, True, "allgather_reducescatter"),
    ("tp=8,dp=2,ep=8", 1, True, "allgather_reducescatter"),  # two engines: per-engine dp 1
    ("tp=1,dp=4,ep=4", 4, True, "allgather_reducescatter"),
]


@pytest.mark.parametrize("name", ["deepseek-v3", "tiny-deepseek"])
@pytest.mark.parametrize("spec,engine_dp,ep_on,a2a", SHARED_CASES)
def test_shared_experts_replicated_under_sequence_parallel_moe(name, spec, engine_dp, ep_on, a2a):
    m = load_model(name)
    if name == "tiny-deepseek" and "tp=8" in spec:
        spec = spec.replace("tp=8", "tp=2").replace("ep=16", "ep=4").replace("ep=8", "ep=2")
    lay = VllmLayout(m, P(spec))
    TP = lay.tp
    sp = ep_on and TP > 1 and engine_dp > 1 and REPLACED.get(a2a, a2a) in SP_BACKENDS  # use_sequence_parallel_moe
    assert lay.sp_moe == sp
    layer = m.dims.moe_layers[0]
    for kind, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
        t = m.tensor(f"model.layers.{layer}.mlp.shared_experts.{kind}.weight")
        pl = lay.placement(m.index(t.name))
        for r in range(lay.world_size):
            if sp:  # DeepseekV2MLP(disable_tp=True): tp_rank 0, tp_size 1
                want = (full_rows(t.shape),)
            else:
                n = t.shape[dim] // TP
                box = list(full_rows(t.shape))
                box[dim] = ((r % TP) * n, (r % TP + 1) * n)
                want = (tuple(box),)
            assert pl.holding(r) == want, (t.name, r)
    if sp:  # the fused param is the whole [gate; up] on every rank
        (p,) = [p for p in lay.local_params(1) if p.name == f"model.layers.{layer}.mlp.shared_experts.gate_up_proj.weight"]
        assert p.shape == (2 * m.dims.moe_intermediate, m.dims.hidden)


# ------------------------------------------------------------------ item 2: tied embeddings, pp > 1
@pytest.mark.parametrize("tp,pp,dp", [(1, 2, 1), (2, 2, 2), (2, 3, 1), (1, 4, 2)])
def test_tied_embedding_on_first_and_last_stage(tp, pp, dp):
    m = tiny_llama(layers=8, tie=True)
    lay = VllmLayout(m, P(f"tp={tp},pp={pp},dp={dp}"))
    pl = lay.placement(m.index("model.embed_tokens.weight"))
    vp = -(-m.dims.vocab // 64) * 64
    per = vp // tp
    for dpi in range(dp):
        for p in range(pp):
            for t in range(tp):
                r = rank_of(t, p, dpi, tp, pp)
                builds = p == 0 or p == pp - 1  # first rank, or tied and last rank
                want = (((t * per, min((t + 1) * per, m.dims.vocab)), (0, m.dims.hidden)),) if builds else ()
                assert pl.holding(r) == want, (r, p)
                names = {x.name for x in lay.local_params(r)}
                assert ("model.embed_tokens.weight" in names) == builds
    # a plan delivers the embedding to the last stage too, byte-exact
    from helpers.plan_checker import check_plan
    from reshardctl.layout.megatron import MegatronLayout
    from reshardctl.plan.planner import build_plan
    from reshardctl.topology import Topology

    train = MegatronLayout(m, P("tp=2,pp=2"))
    plan = build_plan(m, train, lay, Topology(train.world_size, lay.world_size, 8, 1), bucket_bytes=1 << 16)
    check_plan(plan)


# ------------------------------------------------------------------ item 6: block-fp8 rules
def vllm_fp8_refuses(model, tp, moe_tp, shared_tp, bn=128, bk=128):
    """validate_fp8_block_shape over DeepSeek's linear layers, as vLLM builds them; Fp8MoEMethod for experts."""
    d = model.dims
    qk, kvb = d.qk_nope_head_dim + d.qk_rope_head_dim, d.qk_nope_head_dim + d.v_head_dim
    layers = [  # (layer tp, input, input per partition, output, output partition sizes)
        (1, d.hidden, d.hidden, d.q_lora_rank + d.kv_lora_rank + d.qk_rope_head_dim,
         [d.q_lora_rank, d.kv_lora_rank + d.qk_rope_head_dim]),                       # fused_qkv_a_proj
        (tp, d.q_lora_rank, d.q_lora_rank, d.num_heads * qk, [d.num_heads * qk // tp]),  # q_b_proj
        (tp, d.kv_lora_rank, d.kv_lora_rank, d.num_heads * kvb, [d.num_heads * kvb // tp]),  # kv_b_proj
        (tp, d.num_heads * d.v_head_dim, d.num_heads * d.v_head_dim // tp, d.hidden, [d.hidden]),  # o_proj
        (tp, d.hidden, d.hidden, 2 * d.intermediate, [d.intermediate // tp] * 2),      # dense gate_up
        (tp, d.intermediate, d.intermediate // tp, d.hidden, [d.hidden]),               # dense down
    ]
    s = d.moe_intermediate * d.num_shared_experts
    layers += [(shared_tp, d.hidden, d.hidden, 2 * s, [s // shared_tp] * 2),
               (shared_tp, s, s // shared_tp, d.hidden, [d.hidden])]
    for ltp, inp, inp_pp, out, parts in layers:
        if ltp > 1 and inp // inp_pp == ltp and inp_pp % bk:
            return True
        split = ltp > 1 and out // sum(parts) == ltp
        if split or len(parts) > 1:
            check = parts if split else parts[:-1]
            if any(x % bn for x in check):
                return True
    per = d.moe_intermediate // moe_tp
    return moe_tp > 1 and (per % bn != 0 or per % bk != 0)


@pytest.mark.parametrize("name", ["deepseek-v3", "tiny-deepseek"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("dp,ep_mode", [(1, "off"), (1, "on"), (8, "off"), (8, "in_engine"), (8, "engines")])
def test_fp8_block_rules_match_vllm(name, tp, dp, ep_mode):
    m = load_model(name, include_scales=True)
    d = m.dims
    if tp > d.num_heads:
        return
    spec = f"tp={tp},dp={dp}"
    if ep_mode == "on":
        spec += ",expert_parallel=true"
    elif ep_mode == "in_engine":
        spec += f",ep={tp * dp}"
    elif ep_mode == "engines":
        spec += f",ep={tp},dp_mode=engines"
    ep_on = ep_mode != "off"
    engine_dp = dp if ep_mode == "in_engine" else 1  # default: one engine per replica unless ep > tp
    group = tp * engine_dp
    if ep_on and d.num_experts < group:
        return
    moe_tp = 1 if ep_on else group
    sp = ep_on and tp > 1 and engine_dp > 1
    refused = vllm_fp8_refuses(m, tp, moe_tp, 1 if sp else tp)
    if d.moe_intermediate % moe_tp or (d.moe_intermediate * d.num_shared_experts) % tp:
        return  # refused for plain divisibility, not the fp8 rule
    try:
        VllmLayout(m, P(spec))
        got = False
    except LayoutError as e:
        assert all("block-fp8" in v for v in e.violations), e.violations
        got = True
    assert got == refused, (spec, refused)
    # the bf16 view (NeMo RL refits bf16 weights) has no block rule
    VllmLayout(load_model(name), P(spec))


def test_fp8_message_names_the_arithmetic():
    with pytest.raises(LayoutError) as ei:
        VllmLayout(load_model("deepseek-v3", include_scales=True), P("tp=32,dp=8,ep=32"))
    s = "\n".join(ei.value.violations)
    assert "mlp.down_proj (RowParallelLinear) input per rank intermediate_size 18432 / tp 32 = 576 is not a " \
           "multiple of block_k 128 (576 % 128 = 64)" in s


# ------------------------------------------------------------------ item 7: separate engines vs in-engine DP
def linear_owner(E, ep, e):
    base, rem = divmod(E, ep)
    for j in range(ep):
        start = j * base + min(j, rem)
        if start <= e < start + base + (1 if j < rem else 0):
            return j, e - start
    raise AssertionError


@pytest.mark.parametrize("name,spec,mode", [
    ("deepseek-v3", "tp=32,dp=8,ep=32", "engines"),            # NeMo RL DeepSeek-V3 generation
    ("qwen3-235b-a22b", "tp=8,dp=16,ep=8", "engines"),         # NeMo RL Qwen3-235B generation
    ("qwen3-235b-a22b", "tp=4,dp=8,ep=32", "in_engine"),       # vLLM DP+EP, ep = dp x tp
    ("qwen3-30b-a3b", "tp=2,dp=3,ep=6", "in_engine"),
    ("qwen3-30b-a3b", "tp=2,dp=3,ep=2,dp_mode=engines", "engines"),
    ("tiny-qwen3-moe", "tp=2,dp=2,ep=2", "engines"),
    ("tiny-deepseek", "tp=2,dp=4,ep=8", "in_engine"),
])
def test_engines_and_in_engine_expert_holders(name, spec, mode):
    m = load_model(name)
    lay = VllmLayout(m, P(spec))
    assert lay.dp_mode == mode and f"dp_mode={mode}" in lay.describe()
    assert ("separate engines" in lay.framework_rules()) == (mode == "engines")
    TP, DP, E = lay.tp, lay.dp, m.dims.num_experts
    ep = TP if mode == "engines" else DP * TP
    layer = m.dims.moe_layers[-1]
    for e in range(0, E, max(1, E // 11)):
        t = m.tensor(f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight")
        owner, local = linear_owner(E, ep, e)
        if mode == "engines":  # every engine holds the expert on its own TP rank `owner`
            want = {rank_of(owner, 0, d, TP, 1) for d in range(DP)}
        else:  # flattened dp*tp rank owner -> (dp, tp) = divmod(owner, TP)
            want = {rank_of(owner % TP, 0, owner // TP, TP, 1)}
        pl = lay.placement(m.index(t.name))
        assert {r for r, h in pl.items() if h} == want
        r0 = min(want)
        assert pl.holding(r0) == (full_rows(t.shape),)
        w2 = param(lay, r0, f"model.layers.{layer}.mlp.experts.w2_weight")
        (seg,) = [s for s in w2.segments if s.hf_name == t.name]
        assert seg.offset[0] == local


def test_nemo_rl_layouts_accepted_by_plan_inputs():
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    for model, train, infer in (("deepseek-v3", "pp=16,ep=16,first=3,last=2", "tp=32,dp=8,ep=32"),
                                ("qwen3-235b-a22b", "tp=4,pp=8,ep=16,first=11,last=11", "tp=8,dp=16,ep=8")):
        inp = prepare(RefitRequest(site="dgx-h100", model=model, train=train, infer=infer, transport="reshard"))
        assert inp.infer.dp_mode == "engines" and inp.infer.ep == inp.infer.tp
    with pytest.raises(LayoutError, match=r"vLLM ep=16 must be tp\(32\) = 32 .* or k x tp\(32\) with k > 1 "
                                          r"dividing dp\(8\)"):
        VllmLayout(load_model("deepseek-v3"), P("tp=32,dp=8,ep=16"))


# ------------------------------------------------------------------ item 8: round_robin and EPLB maps
@pytest.mark.parametrize("name", ["deepseek-v3", "tiny-deepseek", "qwen3-235b-a22b", "qwen3-30b-a3b", "tiny-qwen3-moe"])
@pytest.mark.parametrize("extra,kept", [("", True), (",all2all=deepep_low_latency", True), (",all2all=pplx", False)])
def test_round_robin_placement_and_fallbacks(name, extra, kept):
    m = load_model(name)
    grouped = int(m.config.get("n_group") or 1) > 1
    for spec, all2all_kernels in ((f"tp=2,dp=2,ep=2,placement=round_robin{extra}", False),   # 2 engines
                                  (f"tp=1,dp=2,ep=2,placement=round_robin{extra}", True)):   # in-engine DP
        lay = VllmLayout(m, P(spec))
        effective = grouped and (not all2all_kernels or "deepep_low_latency" in extra)
        assert lay.expert_map.strategy == ("round_robin" if effective else "linear")
        assert ("falls back to linear" in lay.framework_rules()) == (not effective)
        ep, E = lay.ep, m.dims.num_experts
        layer = m.dims.moe_layers[0]
        for e in range(min(E, 9)):
            j, k = (e % ep, e // ep) if effective else linear_owner(E, ep, e)
            t = m.tensor(f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight")
            holders = {r for r, h in lay.placement(m.index(t.name)).items() if h}
            # two engines (EP rank = tp rank in each engine) / one engine (EP rank = flattened dp*tp rank)
            want = {rank_of(j, 0, d, lay.tp, 1) for d in range(lay.dp)} if not all2all_kernels else {j}
            assert holders == want
            r0 = min(holders)
            w13 = param(lay, r0, f"model.layers.{layer}.mlp.experts.w13_weight")
            assert {s.offset[0] for s in w13.segments if s.hf_name == t.name} == {k}


def eplb_initial(E, R):
    return list(range(E)) + [i % E for i in range(R)]


@pytest.mark.parametrize("name,spec,R", [("deepseek-v3", "tp=32,dp=8,ep=32", 32),
                                         ("qwen3-235b-a22b", "tp=8,dp=16,ep=8", 8),
                                         ("qwen3-30b-a3b", "tp=2,dp=2,ep=4", 4),
                                         ("tiny-deepseek", "tp=2,dp=2,ep=4", 4)])
def test_eplb_redundant_experts_initial_map(name, spec, R):
    m = load_model(name)
    lay = VllmLayout(m, P(spec + f",redundant={R}"))
    E, ep = m.dims.num_experts, lay.ep
    phys = eplb_initial(E, R)
    per = len(phys) // ep
    layer = m.dims.moe_layers[0]
    for e in list(range(0, E, max(1, E // 7))) + [0, R - 1]:
        slots = [(p // per, p % per) for p, x in enumerate(phys) if x == e]
        t = m.tensor(f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight")
        holders = {r for r, h in lay.placement(m.index(t.name)).items() if h}
        assert {r % lay.tp if lay.dp_mode == "engines" else r for r in holders} == {j for j, _ in slots}
        for j, k in slots:
            r = j if lay.dp_mode == "in_engine" else rank_of(j, 0, 0, lay.tp, 1)
            w13 = param(lay, r, f"model.layers.{layer}.mlp.experts.w13_weight")
            assert w13.shape[0] == per
            assert {s.offset[0] for s in w13.segments if s.hf_name == t.name} == {k}


def test_eplb_explicit_map_file(tmp_path):
    m = load_model("qwen3-30b-a3b")
    E, R, ep = m.dims.num_experts, 8, 4
    rng = random.Random(12)
    per_layer = []
    for _ in m.dims.moe_layers:  # a rebalanced map: a permutation plus R hot experts, one per rank block
        phys = list(range(E))
        rng.shuffle(phys)
        blocks = [phys[i * E // ep:(i + 1) * E // ep] for i in range(ep)]
        for i in range(R):
            b = blocks[i % ep]
            b.append(rng.choice([x for x in range(E) if x not in b]))
        per_layer.append([x for b in blocks for x in b])
    path = tmp_path / "map.json"
    path.write_text(json.dumps(per_layer))
    lay = VllmLayout(m, P(f"tp=2,dp=2,ep=4,redundant={R},expert_map={path}"))
    per = (E + R) // ep
    for li, layer in enumerate(m.dims.moe_layers[:5]):
        for e in range(0, E, 13):
            want = {p // per for p, x in enumerate(per_layer[li]) if x == e}
            t = m.tensor(f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight")
            assert {r for r, h in lay.placement(m.index(t.name)).items() if h} == want
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(list(range(E - 1)) + [0] * (R + 1)))
    with pytest.raises(LayoutError, match=rf"logical experts \[{E - 1}\] have no physical slot"):
        VllmLayout(m, P(f"tp=2,dp=2,ep=4,redundant={R},expert_map={bad}"))
    with pytest.raises(LayoutError, match=r"E \+ redundant = 128 \+ 3 = 131 physical experts must divide evenly "
                                          r"over ep=4 ranks \(131/4 = 32.75\)"):
        VllmLayout(m, P("tp=2,dp=2,ep=4,redundant=3"))
    with pytest.raises(LayoutError, match="no such file"):
        VllmLayout(m, P(f"tp=2,dp=2,ep=4,redundant={R},expert_map={tmp_path / 'none.json'}"))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("ep_on", [False, True])
def test_fp8_block_rules_qwen3_moe_fp8(tp, ep_on):
    """Qwen3-30B-A3B-FP8 (the preset's config with a 128x128 block quantization_config): QKVParallelLinear
    partitions and the fused-MoE intermediate 768/moe_tp against the block (vLLM refuses tp 4 and 8
    without expert parallel: 192 and 96 rows)."""
    from reshardctl.models.catalog import preset_config
    from reshardctl.models.config import spec_from_config

    cfg = dict(preset_config("qwen3-30b-a3b"))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    m = spec_from_config(cfg, "qwen3-30b-a3b-fp8", include_scales=True)
    d = m.dims
    kv_per_rank = max(1, d.num_kv_heads // tp) * d.head_dim
    parts = [d.num_heads * d.head_dim // tp, kv_per_rank, kv_per_rank]  # qkv_proj output partitions
    check = parts if tp > 1 else parts[:-1]
    refused = any(x % 128 for x in check) or (tp > 1 and (d.num_heads * d.head_dim // tp) % 128)
    moe_tp = 1 if ep_on else tp
    refused = refused or (moe_tp > 1 and (d.moe_intermediate // moe_tp) % 128 != 0)
    spec = f"tp={tp}" + (",expert_parallel=true" if ep_on else "")
    if refused:
        with pytest.raises(LayoutError, match="block-fp8"):
            VllmLayout(m, P(spec))
    else:
        lay = VllmLayout(m, P(spec))
        assert lay.placement(m.index("model.layers.0.self_attn.q_proj.weight_scale_inv")).ranks
