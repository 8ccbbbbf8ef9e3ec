"""GLM-4.5 MoE and gpt-oss inventories (reshardctl/models/architectures.py) against independent builders written
from the transformers modeling files (tests/helpers/parallel_models.py), exact parameter counts of the presets
against the published totals, and hostile configs (the file and the key named, exit 2 on the CLI)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from reshardctl.cli import main
from reshardctl.errors import ModelError
from reshardctl.models.catalog import PRESETS, load_model, preset_config
from reshardctl.models.config import spec_from_config
from helpers.parallel_models import glm4_moe_model, gpt_oss_model


def inventory(m):
    return {t.name: (t.shape, t.dtype, t.kind, t.role, t.layer, t.expert) for t in m.tensors}


# ---------------------------------------------------------------------------- exact counts vs published totals
def test_glm45_counts():
    # zai-org/GLM-4.5 model card: "355B total parameters"; the HF page's safetensors total "358B" counts the MTP
    # layer (model.layers.92, with its own embed_tokens and shared_head.head). Main model: 3 dense + 89 MoE layers
    # = 352,797,829,024; with the MTP layer 358,337,791,296 (358.3B, the HF figure). The card's 355B is neither
    # exactly (it rounds the main model plus the MTP block without its embedding/head copies: 356.8B).
    main_ = load_model("glm-4.5")
    assert main_.num_params == 352_797_829_024 and len(main_.tensors) == 44_189
    full = load_model("glm-4.5", include_mtp=True)
    assert full.num_params == 358_337_791_296
    assert round(full.num_params / 1e9) == 358
    assert abs(main_.num_params / 355e9 - 1) < 0.01  # the card's figure, to 1%


def test_glm45_air_counts():
    # zai-org/GLM-4.5-Air model card: "106B total parameters" = the main model (1 dense + 45 MoE layers),
    # 106,852,251,264; the HF safetensors total "110B" = with the MTP layer, 110,468,824,832.
    assert load_model("glm-4.5-air").num_params == 106_852_251_264
    assert round(load_model("glm-4.5-air").num_params / 1e9) == 107  # 106.85B: the card truncates to 106B
    assert load_model("glm-4.5-air", include_mtp=True).num_params == 110_468_824_832


def test_gpt_oss_counts():
    # openai/gpt-oss model card (arXiv 2508.10925, Table 1): gpt-oss-120b 116.83B total, gpt-oss-20b 20.91B;
    # the counts are of the BF16 form (MXFP4 stores the same experts in fewer bytes, not fewer parameters).
    big, small = load_model("gpt-oss-120b"), load_model("gpt-oss-20b")
    assert big.num_params == 116_829_156_672 and round(big.num_params / 1e7) == 11_683
    assert small.num_params == 20_914_757_184 and round(small.num_params / 1e7) == 2_091
    assert len(big.tensors) == 3 + 36 * 17 and len(small.tensors) == 3 + 24 * 17


def test_presets_listed():
    for name in ("glm-4.5", "glm-4.5-air", "gpt-oss-20b", "gpt-oss-120b", "tiny-glm-4.5", "tiny-gpt-oss"):
        assert name in PRESETS and preset_config(name)["architectures"][0] in ("Glm4MoeForCausalLM",
                                                                                "GptOssForCausalLM")


# ---------------------------------------------------------------------------- inventories vs independent builders
def test_tiny_glm_inventory_matches_transformers_names():
    cfg = preset_config("tiny-glm-4.5")
    ours = load_model("tiny-glm-4.5", include_mtp=True)
    ref = glm4_moe_model(H=cfg["hidden_size"], L=cfg["num_hidden_layers"], nh=cfg["num_attention_heads"],
                         nkv=cfg["num_key_value_heads"], hd=cfg["head_dim"], V=cfg["vocab_size"],
                         I=cfg["intermediate_size"], E=cfg["n_routed_experts"], Im=cfg["moe_intermediate_size"],
                         shared=cfg["n_shared_experts"], first_dense=cfg["first_k_dense_replace"],
                         qk_norm=cfg["use_qk_norm"], mtp=cfg["num_nextn_predict_layers"])
    assert inventory(ours) == inventory(ref)
    assert ours.dims == ref.dims
    main_ = load_model("tiny-glm-4.5")  # the main model is a prefix of the MTP view
    assert [t.name for t in ours.tensors[:len(main_.tensors)]] == [t.name for t in main_.tensors]


def test_tiny_gpt_oss_inventory_matches_transformers_names():
    cfg = preset_config("tiny-gpt-oss")
    ours = load_model("tiny-gpt-oss")
    ref = gpt_oss_model(H=cfg["hidden_size"], L=cfg["num_hidden_layers"], nh=cfg["num_attention_heads"],
                        nkv=cfg["num_key_value_heads"], hd=cfg["head_dim"], V=cfg["vocab_size"],
                        E=cfg["num_local_experts"], Im=cfg["intermediate_size"])
    assert inventory(ours) == inventory(ref)
    assert ours.dims == ref.dims


def test_glm_air_has_no_qk_norm_and_one_dense_layer():
    m = load_model("glm-4.5-air")
    assert not any(t.kind in ("q_norm", "k_norm") for t in m.tensors)
    assert m.dims.moe_layers == tuple(range(1, 46))
    assert m.tensor("model.layers.0.mlp.gate_proj.weight").shape == (10944, 4096)
    assert m.tensor("model.layers.45.self_attn.q_proj.bias").shape == (12288,)


def glm_numbers(H, L, nh, nkv, hd, V, I, E, Im, shared, first, qk, mtp):
    """Closed form of a GLM-4.5 MoE model's parameters (embed + head per MTP layer included)."""
    attn = nh * hd * H + nh * hd + 2 * (nkv * hd * H + nkv * hd) + H * nh * hd + (2 * hd if qk else 0)
    moe = E * H + E + E * 3 * Im * H + 3 * Im * shared * H
    dense = 3 * I * H
    per = [attn + 2 * H + (dense if l < first else moe) for l in range(L + mtp)]
    return 2 * V * H + H + sum(per) + mtp * (2 * V * H + 2 * H + 2 * H * H + H)


@settings(max_examples=30, deadline=None)
@given(H=st.sampled_from([16, 48]), L=st.integers(1, 4), nkv=st.sampled_from([1, 2, 4]), g=st.integers(1, 3),
       hd=st.sampled_from([8, 16]), V=st.integers(5, 300), I=st.integers(1, 40), E=st.integers(1, 9),
       Im=st.integers(1, 20), shared=st.integers(0, 2), first=st.integers(0, 4), qk=st.booleans(),
       mtp=st.integers(0, 2))
def test_glm_config_counts_property(H, L, nkv, g, hd, V, I, E, Im, shared, first, qk, mtp):
    cfg = dict(json.loads(json.dumps(preset_config("tiny-glm-4.5"))), hidden_size=H, num_hidden_layers=L,
               num_attention_heads=nkv * g, num_key_value_heads=nkv, head_dim=hd, vocab_size=V,
               intermediate_size=I, n_routed_experts=E, moe_intermediate_size=Im, n_shared_experts=shared,
               first_k_dense_replace=first, use_qk_norm=qk, num_nextn_predict_layers=mtp, num_experts_per_tok=1)
    m = spec_from_config(cfg, "p", include_mtp=True)
    assert m.num_params == glm_numbers(H, L, nkv * g, nkv, hd, V, I, E, Im, shared, first, qk, mtp)
    ref = glm4_moe_model(H=H, L=L, nh=nkv * g, nkv=nkv, hd=hd, V=V, I=I, E=E, Im=Im, shared=shared,
                         first_dense=first, qk_norm=qk, mtp=mtp)
    assert inventory(m) == inventory(ref)


@settings(max_examples=30, deadline=None)
@given(H=st.sampled_from([16, 40]), L=st.integers(1, 4), nkv=st.sampled_from([1, 2]), g=st.integers(1, 4),
       hd=st.sampled_from([8, 16]), V=st.integers(5, 300), E=st.integers(1, 9), Im=st.integers(1, 20))
def test_gpt_oss_config_counts_property(H, L, nkv, g, hd, V, E, Im):
    cfg = dict(json.loads(json.dumps(preset_config("tiny-gpt-oss"))), hidden_size=H, num_hidden_layers=L,
               num_attention_heads=nkv * g, num_key_value_heads=nkv, head_dim=hd, vocab_size=V,
               num_local_experts=E, intermediate_size=Im, num_experts_per_tok=1, experts_per_token=1)
    m = spec_from_config(cfg, "p")
    nh = nkv * g
    attn = nh * hd * H + nh * hd + 2 * (nkv * hd * H + nkv * hd) + H * nh * hd + H + nh
    experts = E * H + E + E * H * 2 * Im + E * 2 * Im + E * Im * H + E * H
    assert m.num_params == 2 * V * H + H + L * (attn + 2 * H + experts)
    assert inventory(m) == inventory(gpt_oss_model(H=H, L=L, nh=nh, nkv=nkv, hd=hd, V=V, E=E, Im=Im))


# ---------------------------------------------------------------------------- MXFP4 and hostile configs
def write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_mxfp4_checkpoint_view_refused(tmp_path, capsys):
    p = write(tmp_path, preset_config("gpt-oss-20b"))
    with pytest.raises(ModelError) as e:
        load_model(str(p))
    msg = str(e.value)
    assert str(p) in msg and "quantization_config.quant_method" in msg and "'mxfp4'" in msg
    assert "gate_up_proj_blocks" in msg and "BF16 form" in msg
    rc = main(["model", "show", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and "quantization_config.quant_method" in err and "Traceback" not in err
    with pytest.raises(ModelError, match="quant_method"):  # the preset's checkpoint view too
        load_model("gpt-oss-20b", include_scales=True)
    # without quantization_config (a BF16 checkpoint): the same tensors as the preset's training view
    bf16 = {k: v for k, v in preset_config("gpt-oss-20b").items() if k != "quantization_config"}
    assert inventory(load_model(str(write(tmp_path, bf16, "bf16.json")))) == inventory(load_model("gpt-oss-20b"))


@pytest.mark.parametrize("preset,patch,key,words", [
    ("tiny-gpt-oss", {"quantization_config": {"quant_method": "fp8"}}, "quantization_config.quant_method", "'fp8'"),
    ("tiny-gpt-oss", {"num_local_experts": None}, "num_local_experts", "missing"),
    ("tiny-gpt-oss", {"attention_bias": False}, "attention_bias", "q/k/v/o biases"),
    ("tiny-gpt-oss", {"num_experts_per_tok": 9}, "num_experts_per_tok", "'num_local_experts' (8)"),
    ("tiny-gpt-oss", {"num_key_value_heads": 3}, "num_key_value_heads", "8 % 3 = 2"),
    ("tiny-glm-4.5", {"attention_bias": False}, "attention_bias", "q/k/v biases"),
    ("tiny-glm-4.5", {"n_routed_experts": "8"}, "n_routed_experts", "must be an integer"),
    ("tiny-glm-4.5", {"use_qk_norm": "yes"}, "use_qk_norm", "true or false"),
    ("tiny-glm-4.5", {"n_group": 3}, "n_group", "8 % 3 = 2"),
    ("tiny-glm-4.5", {"first_k_dense_replace": -1}, "first_k_dense_replace", ">= 0"),
])
def test_hostile_configs_name_file_and_key(tmp_path, capsys, preset, patch, key, words):
    cfg = dict(preset_config(preset))
    for k, v in patch.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    p = write(tmp_path, cfg)
    with pytest.raises(ModelError) as e:
        load_model(str(p))
    assert str(p) in str(e.value) and key.split(".")[0] in str(e.value) and words in str(e.value), str(e.value)
    rc = main(["model", "show", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and key.split(".")[0] in err
