"""The trainer layout's Megatron names against what megatron-core builds.

``spec="local"``: every parameter (and persistent buffer) of the ``GPTModel``s megatron-core 0.16.1 built with
the local layer spec on gloo CPU ranks (tests/layout/megatron_core/*.json, made by generate.py there), per rank,
name -> (shape, dtype), equals ``MegatronLayout.local_params(rank, spec="local")``: nothing missing, nothing
extra. The 0.16 -> 0.19 renames (read in the 0.19 source, docs/layouts.md) are applied to the fixture names.

``spec="te"``: Transformer Engine cannot run here, so the TE names are the same fixtures mapped by the
differences between the TE and local specs that megatron-core 0.19's source states (file:line below).
Only the JSON is read: no megatron-core at test time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import helpers.parallel_models as parallel_models
from reshardctl.errors import LayoutError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.parallel_spec import parse_parallel as P

# rank_order.json (megatron_core/rank_order.py: RankGenerator's grids) is test_megatron_rank_order.py's
FIXTURES = sorted(p for p in (Path(__file__).parent / "megatron_core").glob("*.json") if p.stem != "rank_order")
IDS = [p.stem for p in FIXTURES]

# megatron-core 0.16 -> 0.19: MultiTokenPredictionLayer's inner layer attribute
# (0.16.1 transformer/multi_token_prediction.py:666 self.transformer_layer;
#  0.19.0 transformer/multi_token_prediction.py:1039 self.mtp_model_layer)
RENAMES_0_19 = ((re.compile(r"^((?:model\d+\.)?mtp\.layers\.\d+\.)transformer_layer\."), r"\1mtp_model_layer."),)

# local spec -> TE spec (megatron-core 0.19.0 models/gpt/gpt_layer_specs.py), per layer kind:
# dense attention: the local spec's own keys map, :459-462 ("input_layernorm." -> "self_attention.linear_qkv.
#   layer_norm_"; "pre_mlp_layernorm." -> "mlp.linear_fc1.layer_norm_"), TE :324 linear_qkv =
#   column_parallel_layer_norm_linear, TE :336 pre_mlp_layernorm = IdentityOp for a dense MLP, :543 linear_fc1
#   = column_parallel_layer_norm_linear; an MoE layer keeps pre_mlp_layernorm (TE :336 layer_norm if num_experts)
# MLA: TE :296 input_layernorm = layer_norm (kept), :246-254 linear_q_up_proj / linear_kv_up_proj =
#   column_parallel_layer_norm_linear (the local :428-429 q_layernorm / kv_layernorm move into them), TE :302/:304
#   down projections backend.linear() = TELinear parallel_mode="duplicated" (multi_latent_attention.py:526,:573)
# experts: TE with grouped GEMM = TEGroupedMLP (extensions/transformer_engine_spec_provider.py:77-85), whose
#   TEGroupedLinear names its weights weight{i} (transformer/moe/experts.py:939); local = SequentialMLP
#   local_experts (experts.py:1286,:1302)
TE_RENAMES = (  # the first two for MLA only (a dense layer's q_layernorm / k_layernorm keep their names)
    (re.compile(r"\.self_attention\.q_layernorm\.weight$"), ".self_attention.linear_q_up_proj.layer_norm_weight"),
    (re.compile(r"\.self_attention\.kv_layernorm\.weight$"), ".self_attention.linear_kv_up_proj.layer_norm_weight"),
    (re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.linear_fc(\d)\.weight$"), r".mlp.experts.linear_fc\2.weight\1"),
)


def load(path: Path):
    doc = json.loads(path.read_text())
    model = getattr(parallel_models, doc["builder"])(**doc["builder_kwargs"])
    return doc, model


def layout(doc, model, *, mla_down_proj: str) -> MegatronLayout:
    """The layout of the fixture's parallel string; an MLA model's gets ``mla_down_proj=`` (the CLI's key)."""
    text = doc["parallel"] + (f",mla_down_proj={mla_down_proj}" if model.dims.kv_lora_rank else "")
    return MegatronLayout(model, P(text), world_size=len(doc["ranks"]))


def rename_0_19(name: str) -> str:
    for pat, rep in RENAMES_0_19:
        name = pat.sub(rep, name)
    return name


def built(doc, rank: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of the parameters and persistent buffers megatron-core built on ``rank``."""
    r = doc["ranks"][rank]
    entries = dict(r["params"])
    entries.update({n: b for n, b in r["buffers"].items() if b["persistent"]})
    return {rename_0_19(n): (tuple(e["shape"]), e["dtype"]) for n, e in entries.items()}


def names_of(params) -> dict[str, tuple[tuple[int, ...], str]]:
    return {p.name: (tuple(p.shape), p.dtype) for p in params}


def diff(want: dict, got: dict) -> list[str]:
    out = [f"missing {n}: megatron-core builds {want[n]}" for n in sorted(set(want) - set(got))]
    out += [f"extra {n}: {got[n]} (megatron-core builds no such parameter)" for n in sorted(set(got) - set(want))]
    out += [f"{n}: megatron-core {want[n]}, layout {got[n]}" for n in sorted(set(want) & set(got))
            if want[n] != got[n]]
    return out


def test_fixtures_cover_the_configurations():
    """The configurations the issue lists are all there (a fixture lost is a failure, not a smaller test)."""
    assert set(IDS) >= {"dense_tp2", "qknorm_tp2_one_kv_group", "dense_pp2", "dense_pp2_vpp2", "tied_pp2",
                        "moe_tp2_ep2_etp1", "moe_tp2_dp2_ep2_etp2", "mla_moe_mtp_tp2_ep2", "mla_moe_mtp_tp2_pp2_ep2",
                        "mla_no_q_lora_tp2", "qwen2_qkv_bias_tp4", "qwen2_moe_shared_gate_tp2_ep2",
                        "moe_tp2_pp2_dp2_ep2_bridge_order"}


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_fixture_is_the_builders_model(path):
    """generate.py built megatron-core with the dims of the same builder the layout is built from."""
    doc, model = load(path)
    d, m = model.dims, doc["dims"]
    assert doc["layer_spec"] == "local" and doc["megatron_core"].startswith("0.16")
    assert (d.hidden, d.num_heads, d.num_kv_heads, d.vocab, d.intermediate) == (
        m["hidden"], m["heads"], m["kv"], m["vocab"], m["ffn"])
    if not d.kv_lora_rank:
        assert d.head_dim == m["head_dim"]
    assert (d.num_experts, d.moe_intermediate) == (m.get("experts", 0), m.get("moe_ffn", 0))
    extra, mla = doc["extra"], m.get("mla") or {}
    assert (d.num_layers, d.num_mtp_layers, d.tie_embeddings) == (doc["layers"], extra.get("mtp", 0),
                                                                   bool(extra.get("tie")))
    assert (d.q_lora_rank, d.kv_lora_rank) == (extra.get("q_lora", mla.get("q_lora", 0)), mla.get("kv_lora", 0))
    lay = layout(doc, model, mla_down_proj="column")
    sizes = {k: v for k, v in doc["sizes"].items() if v is not None}
    assert {k: getattr(lay, k) for k in sizes} == sizes
    assert len(doc["ranks"]) == lay.world_size


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_rank_coordinates_match_parallel_state(path):
    """megatron-core's parallel_state rank of each group (order tp-cp-ep-dp-pp) == the layout's coords."""
    doc, model = load(path)
    lay = layout(doc, model, mla_down_proj="column")
    for rank, r in enumerate(doc["ranks"]):
        c = lay.coords(rank)
        assert {k: c[k] for k in r["coords"]} == r["coords"], f"rank {rank}"


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_local_spec_names_shapes_dtypes_equal_megatron_core(path):
    doc, model = load(path)
    lay = layout(doc, model, mla_down_proj="column")
    problems = []
    for rank in range(len(doc["ranks"])):
        got = names_of(lay.local_params(rank, spec="local"))
        problems += [f"rank {rank}: {p}" for p in diff(built(doc, rank), got)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_non_persistent_buffers_are_not_weights(path):
    """What megatron-core keeps out of its state dict (router token counts, rotary tables) is not bound."""
    doc, model = load(path)
    lay = layout(doc, model, mla_down_proj="column")
    for rank, r in enumerate(doc["ranks"]):
        transient = {rename_0_19(n) for n, b in r["buffers"].items() if not b["persistent"]}
        assert not transient & {p.name for p in lay.local_params(rank, spec="local")}


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_buffers_are_megatron_cores_persistent_buffers(path):
    """``LocalParam.buffer`` marks exactly what megatron-core registers as a persistent buffer (the router's
    expert_bias), every other local param is one of its ``named_parameters()``."""
    doc, model = load(path)
    lay = layout(doc, model, mla_down_proj="column")
    for rank, r in enumerate(doc["ranks"]):
        lps = lay.local_params(rank, spec="local")
        assert {p.name for p in lps if p.buffer} == {rename_0_19(n) for n, b in r["buffers"].items()
                                                     if b["persistent"]}, f"rank {rank}"
        assert {p.name for p in lps if not p.buffer} == {rename_0_19(n) for n in r["params"]}, f"rank {rank}"


def te_expected(doc, model, rank: int, lay: MegatronLayout) -> dict[str, tuple[tuple[int, ...], str]]:
    """The fixture's names mapped to the TE spec by the 0.19 source's differences (see TE_RENAMES)."""
    moe = set(model.dims.moe_layers)
    out = {}
    for name, (shape, dtype) in built(doc, rank).items():
        m = re.match(r"(?:model(\d+)\.)?(decoder|mtp)\.layers\.(\d+)\.", name)
        layer = None
        if m and m.group(2) == "mtp":  # MTP layer k is global layer L + k
            layer = model.dims.num_layers + int(m.group(3))
        elif m:  # decoder.layers.{local} of this rank's stage and chunk
            layer = lay.chunks[lay.coords(rank)["pp"]][int(m.group(1) or 0)][int(m.group(3))]
        dense_mlp = layer is not None and layer not in moe
        if not model.dims.kv_lora_rank:
            name = name.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
        if dense_mlp and name.endswith(".pre_mlp_layernorm.weight"):
            name = name.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight")
        for pat, rep in TE_RENAMES if model.dims.kv_lora_rank else TE_RENAMES[2:]:
            name = pat.sub(rep, name)
        if re.search(r"linear_(q|kv)_down_proj\.weight$", name):
            shape = (shape[0] * lay.tp,) + shape[1:]  # duplicated over tp instead of column split
        out[name] = (shape, dtype)
    return out


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_te_spec_names_equal_the_source_mapping(path):
    doc, model = load(path)
    lay = layout(doc, model, mla_down_proj="replicated")
    problems = []
    for rank in range(len(doc["ranks"])):
        problems += [f"rank {rank}: {p}" for p in diff(te_expected(doc, model, rank, lay),
                                                       names_of(lay.local_params(rank, spec="te")))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("spec,key,want", [
    ("local", "", r"'local' builds .*ColumnParallelLinear \(split over tp=2\), but the train layout has "
                  r"mla_down_proj=replicated \(the default\).*give mla_down_proj=column"),
    ("local", ",mla_down_proj=replicated", r"'local' builds .* but the train layout has mla_down_proj=replicated$"),
    ("te", ",mla_down_proj=column", r"'te' builds .*TELinear parallel_mode='duplicated'.* but the train layout has "
                                    r"mla_down_proj=column.*give mla_down_proj=replicated"),
])
def test_layer_spec_and_mla_down_proj_must_agree(spec, key, want):
    """The layer spec the names come from and the split the layout models never silently disagree: an MLA
    model's local spec with the default (TE) split is refused, naming both, and so is the reverse."""
    lay = MegatronLayout(parallel_models.tiny_deepseek(layers=2, fp8=False),
                         P("tp=2,ep=2,etp=1,vocab_divisor=128" + key))
    with pytest.raises(LayoutError) as e:
        lay.local_params(0, spec=spec)
    assert re.search(want, str(e.value), re.S | re.M), str(e.value)


def test_unknown_spec_is_refused():
    lay = MegatronLayout(parallel_models.tiny_llama(layers=2), P("tp=2"))
    with pytest.raises(LayoutError, match=r"'transformer_engine': expected one of te, local"):
        lay.local_params(0, spec="transformer_engine")
