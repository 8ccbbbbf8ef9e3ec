"""Coverage properties of the Megatron and vLLM layouts (hypothesis over models and parallel sizes),
local_params consistency with placement, and the `layout show` command."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reshardctl.errors import LayoutError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.parallel_spec import ParallelSpec
from reshardctl.layout.placement import box_shape
from reshardctl.layout.vllm import VllmLayout
from helpers.parallel_models import tiny_deepseek, tiny_llama, tiny_mixtral, tiny_qwen2, tiny_qwen2_moe, tiny_qwen3_moe

MODELS = {
    "llama": tiny_llama(layers=4),
    "llama-tied": tiny_llama(layers=4, tie=True),
    "qwen3moe": tiny_qwen3_moe(layers=4),
    "deepseek": tiny_deepseek(layers=4),  # MLA + shared experts + MTP + fp8 scale_inv
    "deepseek-bf16": tiny_deepseek(layers=4, fp8=False),  # the same served in bf16 (vLLM refuses most fp8 tp>1)
    # engineer "archs1": q/k/v biases (2 kv heads: tp 4, 8 replicate them), a shared expert + its gate, Mixtral
    "qwen2": tiny_qwen2(layers=4),
    "qwen2moe": tiny_qwen2_moe(layers=4),
    "mixtral": tiny_mixtral(layers=4),
}


def coverage_counts(shape, boxes):
    """Count per cell of the coordinate-compressed grid: {cell: count}; cells tile the whole shape."""
    cuts = [sorted({0, n} | {x for b in boxes for x in b[d]}) for d, n in enumerate(shape)]
    grids = [list(zip(c[:-1], c[1:])) for c in cuts]
    counts = np.zeros([len(g) for g in grids], dtype=np.int64)
    for b in boxes:
        sl = tuple(slice(cuts[d].index(b[d][0]), cuts[d].index(b[d][1])) for d in range(len(shape)))
        counts[sl] += 1
    return counts


def check_holdings(t, pl):
    for _, h in pl.items():
        for b in h:
            assert len(b) == len(t.shape) and all(0 <= a < c <= n for (a, c), n in zip(b, t.shape)), (t.name, b)
        if len(h) > 1:
            assert coverage_counts(t.shape, list(h)).max() <= 1, (t.name, h)  # disjoint within a holding


# The checkers work per distinct (placement, stage, ...) key, not per tensor: layouts intern their
# placements (a few dozen for ~45k DeepSeek-V3 tensors), and everything checked depends only on the
# placement (template + ranks), the tensor's stage and, for vLLM, whether it is expert-like. The cache
# keeps the placement object alive, so its id is not reused.
def check_train(lay):
    done: dict = {}
    last = set(lay.stage_ranks(lay.num_stages() - 1))
    for i, t in enumerate(lay.model.tensors):
        pl = lay.placement(i)
        key = (id(pl), lay.stage_of(i))
        if key in done:
            continue
        done[key] = pl
        check_holdings(t, pl)
        boxes = [b for _, h in pl.items() for b in h]
        assert coverage_counts(t.shape, boxes).min() >= 1, t.name  # every element at least once
        assert set(pl.ranks) <= set(lay.stage_ranks(key[1])) | last
    return len(done)


def check_infer(lay):
    per_replica = lay.tp * lay.pp
    done: dict = {}
    for i, t in enumerate(lay.model.tensors):
        pl = lay.placement(i)
        src = lay.model.tensor(t.scale_of) if t.scale_of else t
        expert_like = src.expert is not None  # vLLM experts span DP x TP (EP or MoE-TP): check the world
        key = (id(pl), lay.stage_of(i), expert_like)
        if key in done:
            continue
        done[key] = pl
        check_holdings(t, pl)
        tied = lay.model.dims.tie_embeddings and t.kind == "embed" and t.layer is None and lay.pp > 1
        # vLLM's tied embedding: the last stage builds embed_tokens too (LlamaModel.__init__)
        last = set(lay.stage_ranks(lay.num_stages() - 1)) if tied else set()
        if t.layer is None and lay.pp > 1 and lay.model.dims.arch in getattr(lay, "pp_copies", {}):
            last = set(range(lay.world_size))  # vLLM builds embed/norm/lm_head on every stage (VLLM_PP_COPIES)
        assert set(pl.ranks) == set(lay.stage_ranks(key[1])) | last
        groups = [list(pl.items())] if expert_like else [
            [(r, h) for r, h in pl.items() if r // per_replica == d] for d in range(lay.dp)]
        for items in groups:  # exactly once per DP replica, one copy per distinct holding class
            classes = {h for _, h in items if h}
            boxes = [b for h in classes for b in h]
            c = coverage_counts(t.shape, boxes)
            assert c.min() == 1 and c.max() == 1, (t.name, lay.describe())
    return len(done)


def check_local_params(lay, rank, **spec):
    params = lay.local_params(rank, **spec)
    seen = Counter()
    for p in params:
        assert len(set(x.name for x in params)) == len(params)
        regions = []
        for s in p.segments:
            assert s.param == p.name
            lead = len(s.offset) - len(s.box)
            assert lead >= 0 and len(s.offset) == len(p.shape)
            assert all(0 <= s.offset[k] < p.shape[k] for k in range(lead))
            for k, n in enumerate(box_shape(s.box)):
                assert 0 <= s.offset[lead + k] and s.offset[lead + k] + n <= p.shape[lead + k], (p, s)
            regions.append((s.offset[:lead], tuple((o, o + n) for o, n in zip(s.offset[lead:], box_shape(s.box)))))
        # one param may hold an (hf_name, box) in several slots (an EPLB duplicate): counted once
        seen.update({(s.hf_name, s.box) for s in p.segments})
        for a, b in ((x, y) for k, x in enumerate(regions) for y in regions[k + 1:]):
            overlap = a[0] == b[0] and all(max(p0, q0) < min(p1, q1) for (p0, p1), (q0, q1) in zip(a[1], b[1]))
            assert not overlap or a == b, (p.name, a, b)  # disjoint, or an exact alias (MTP embed copies)
    want = Counter()
    for i, t in enumerate(lay.model.tensors):
        for b in lay.placement(i).holding(rank):
            want[(t.name, b)] += 1
    assert seen == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(sorted(MODELS)), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 3]),
       dp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 4]),
       etp=st.sampled_from([None, 1, 2]), mla_col=st.booleans(), divisor=st.sampled_from([None, 128]),
       vpp=st.sampled_from([1, 2]), split=st.sampled_from(["", "embed", "loss", "both"]))
def test_megatron_coverage(model, tp, pp, dp, cp, ep, etp, mla_col, divisor, vpp, split):
    m = MODELS[model]
    if not m.dims.num_experts:
        ep, etp = 1, None
    spec = ParallelSpec(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vocab_divisor=divisor, vpp=vpp if pp > 1 else 1,
                        first_stage_layers=1 if (pp == 3 and not split) else None,
                        embedding_in_split=True if split in ("embed", "both") else None,
                        loss_in_split=True if split in ("loss", "both") else None,
                        mla_down_proj="column" if (mla_col and m.dims.kv_lora_rank) else None)
    try:
        lay = MegatronLayout(m, spec)
    except LayoutError:
        assume(False)
    check_train(lay)
    for r in {0, lay.world_size - 1, lay.world_size // 2}:  # the layer spec that builds this MLA split
        check_local_params(lay, r, spec="local" if lay.mla_down_proj == "column" else "te")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(sorted(MODELS)), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 3]),
       dp=st.sampled_from([1, 2, 3]), ep_on=st.booleans(), mode=st.sampled_from(["in_engine", "engines"]),
       placement=st.sampled_from([None, "round_robin"]), redundant=st.sampled_from([None, 4]))
def test_vllm_coverage(model, tp, pp, dp, ep_on, mode, placement, redundant):
    m = MODELS[model]
    moe = bool(m.dims.num_experts)
    try:
        lay = VllmLayout(m, ParallelSpec(tp=tp, pp=pp, dp=dp, expert_parallel=ep_on if moe else None, dp_mode=mode,
                                         placement=placement if (moe and ep_on) else None,
                                         redundant=redundant if (moe and ep_on) else None))
    except LayoutError:
        assume(False)
    check_infer(lay)
    for r in {0, lay.world_size - 1, lay.world_size // 2}:
        check_local_params(lay, r)


def test_coverage_helper_counts():
    c = coverage_counts((4, 4), [((0, 2), (0, 4)), ((2, 4), (0, 2)), ((1, 3), (1, 2))])
    assert c.min() == 0 and c.max() == 2


def test_every_rank_local_params_small_layouts():
    for lay in (MegatronLayout(MODELS["deepseek"], ParallelSpec(tp=2, pp=2, ep=2, dp=2, vocab_divisor=128)),
                VllmLayout(MODELS["deepseek-bf16"], ParallelSpec(tp=2, dp=2, expert_parallel=True)),
                MegatronLayout(MODELS["llama-tied"], ParallelSpec(tp=2, pp=2))):
        for r in range(lay.world_size):
            check_local_params(lay, r)


def test_layout_show_cli(capsys):
    from reshardctl.cli import main

    rc = main(["layout", "show", "--model", "tiny-llama", "--layers", "1", "--train", "tp=4",
               "--infer", "tp=2,dp=2", "--tensor", "*layers.0.self_attn.k_proj*", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    (row,) = doc["sides"]["train"]["tensors"]
    assert doc["sides"]["infer"]["layout"].startswith("vllm tp=2")
    assert sum(len(h["ranks"]) for h in row["holders"]) == 4
    rc = main(["layout", "show", "--model", "tiny-llama", "--side", "infer", "--rank", "1",
               "--tensor", "*layers.0.self_attn.*"])
    assert rc == 0 and "qkv_proj.weight" in capsys.readouterr().out
    rc = main(["layout", "show", "--model", "tiny-llama", "--train", "tp=3,pq=2", "--infer", "tp=64"])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean" in err and "infer:" in err
    rc = main(["layout", "show", "--model", "tiny-llama", "--train", "tp=8", "--site", "local"])
    assert rc == 2


def test_catalog_tiny_presets_cover():
    from reshardctl.models import load_model

    for name in ("tiny-llama", "tiny-qwen3-moe", "tiny-deepseek"):
        m = load_model(name, include_mtp=name == "tiny-deepseek", include_scales=name == "tiny-deepseek")
        tr = MegatronLayout(m, ParallelSpec(tp=2, pp=2, ep=2 if m.dims.num_experts else 1))
        # tiny-deepseek's fp8 view: vLLM refuses tp=4 (q_b_proj 768/4 = 192 rows, not a multiple of 128)
        inf = VllmLayout(m, ParallelSpec(tp=2 if name == "tiny-deepseek" else 4, dp=2,
                                         expert_parallel=bool(m.dims.num_experts)))
        check_train(tr)
        check_infer(inf)
        check_local_params(tr, tr.world_size - 1)
        check_local_params(inf, inf.world_size - 3)


# Every shipped model (reshardctl.models.PRESETS), full checkpoint view (MTP layers and fp8 scales where
# it has them), through one Megatron and one vLLM layout each (two vLLM ones for Qwen3-235B: with and
# without expert parallel). A new preset without an entry here fails test_every_preset_has_layouts.
PRESET_LAYOUTS = {
    "llama-3.1-8b": [("megatron", "tp=4,pp=2"), ("vllm", "tp=2,dp=2")],
    "llama-3.1-70b": [("megatron", "tp=8,pp=4"), ("vllm", "tp=8,dp=2")],
    "qwen3-30b-a3b": [("megatron", "tp=2,ep=8,etp=1"), ("vllm", "tp=2,dp=2,expert_parallel=true")],
    "qwen3-235b-a22b": [("megatron", "tp=4,pp=2,ep=8,etp=1"), ("vllm", "tp=8"), ("vllm", "tp=8,ep=8")],
    "deepseek-v3": [("megatron", "pp=16,ep=16,first=3,last=2"), ("vllm", "tp=8,dp=4,ep=32")],
    "tiny-llama": [("megatron", "tp=2,pp=2"), ("vllm", "tp=2,dp=2")],
    "tiny-qwen3-moe": [("megatron", "tp=2,ep=2"), ("vllm", "tp=4")],
    "tiny-deepseek": [("megatron", "tp=2,pp=2,ep=2"), ("vllm", "tp=1,dp=2,expert_parallel=true")],
    # engineer "archs1"
    "qwen2.5-7b": [("megatron", "tp=4,pp=2"), ("vllm", "tp=4,dp=2")],
    "qwen2.5-72b": [("megatron", "tp=8,pp=4"), ("vllm", "tp=8,dp=2")],
    "qwen2-57b-a14b": [("megatron", "tp=4,ep=8,etp=1"), ("vllm", "tp=4,dp=2"), ("vllm", "tp=4,ep=4")],
    "mixtral-8x7b": [("megatron", "tp=2,pp=2,ep=8,etp=1"), ("vllm", "tp=8"), ("vllm", "tp=2,dp=4,ep=8")],
    "tiny-qwen2-moe": [("megatron", "tp=2,ep=2"), ("vllm", "tp=2,dp=2,expert_parallel=true")],
    "tiny-mixtral": [("megatron", "tp=2,pp=2,ep=4,etp=1"), ("vllm", "tp=4")],
    # archs2: GLM-4.5 MoE; gpt-oss has no Megatron layout (refused) and its published config is MXFP4, which the
    # vLLM layout refuses: the BF16 tiny one on vLLM, the others as an FSDP (dtensor dp) trainer
    "glm-4.5": [("megatron", "tp=8,pp=4,ep=16"), ("vllm", "tp=8,dp=4,dp_mode=engines")],
    "glm-4.5-air": [("megatron", "tp=4,pp=2,ep=8"), ("vllm", "tp=4,ep=4")],
    "tiny-glm-4.5": [("megatron", "tp=2,pp=3,ep=2"), ("vllm", "tp=2,dp=2,expert_parallel=true")],
    "gpt-oss-20b": [("dtensor", "dp=2")],
    "gpt-oss-120b": [("dtensor", "dp=2")],
    "tiny-gpt-oss": [("vllm", "tp=2"), ("dtensor", "dp=2")],
}


def test_every_preset_has_layouts():
    from reshardctl.models import PRESETS

    assert set(PRESET_LAYOUTS) == set(PRESETS)


def _full_preset(name):
    from reshardctl.errors import ModelError
    from reshardctl.models import load_model

    for mtp, scales in ((True, True), (False, True), (True, False), (False, False)):
        try:
            return load_model(name, include_mtp=mtp, include_scales=scales)
        except ModelError:
            continue
    raise AssertionError(name)


@pytest.mark.parametrize("name,style,spec", [(n, st_, sp) for n, ls in PRESET_LAYOUTS.items() for st_, sp in ls])
def test_preset_layout_coverage(name, style, spec):
    from reshardctl.layout.build import build_layout

    m = _full_preset(name)
    side = "train" if style in ("megatron", "dtensor") else "infer"
    lay = build_layout(m, side, spec, style)
    checked = check_train(lay) if side == "train" else check_infer(lay)
    assert 0 < checked <= len(m.tensors)
