"""Model catalog: exact inventories (the models' model.safetensors.index.json / config.json on the HF
Hub), order, roles/kinds, truncate, config errors."""

from __future__ import annotations

import json
from math import ceil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import ModelError
from reshardctl.models import PRESETS, load_model, spec_from_config, truncate
from reshardctl.models.architectures import KIND_ROLE
from reshardctl.models.catalog import preset_config
from reshardctl.models.spec import KINDS, ROLES


# ---- exact counts (HF Hub index + config) -----------------------------------------------------------
def test_llama_31_8b():
    m = load_model("llama-3.1-8b")
    assert m.num_params == 8_030_261_248
    assert m.num_bytes == 16_060_522_496
    assert len(m.tensors) == 291 == 9 * 32 + 3


def test_llama_31_70b():
    m = load_model("llama-3.1-70b")
    assert m.num_params == 70_553_706_496
    assert m.num_bytes == 141_107_412_992
    assert len(m.tensors) == 723


def test_qwen3_235b_a22b():
    m = load_model("qwen3-235b-a22b")
    assert m.num_params == 235_093_634_560
    assert m.num_bytes == 470_187_269_120
    assert len(m.tensors) == 36_945
    assert m.dims.moe_layers == tuple(range(94))
    assert m.dims.head_dim * m.dims.num_heads == 8192 != m.dims.hidden


def test_qwen3_30b_a3b():
    m = load_model("qwen3-30b-a3b")
    assert m.num_params == 30_532_122_624
    assert len(m.tensors) == 48 * (3 * 128 + 9) + 3


def test_deepseek_v3_main_and_checkpoint_view():
    main = load_model("deepseek-v3")
    assert main.num_params == 671_026_419_200
    assert main.dims.moe_layers == tuple(range(3, 61)) and main.dims.num_mtp_layers == 0
    assert {t.dtype for t in main.tensors} == {"bfloat16", "float32"}
    ckpt = load_model("deepseek-v3", include_mtp=True, include_scales=True)
    assert ckpt.num_params == 684_531_386_000
    assert len(ckpt.tensors) == 91_991 == 3 * 20 + 58 * 1558 + 1564 + 3
    scales = [t for t in ckpt.tensors if t.kind == "scale_inv"]
    assert sum(t.numel for t in scales) == 41_540_496
    mtp = load_model("deepseek-v3", include_mtp=True)
    assert mtp.num_params - main.num_params == 13_463_426_304
    assert mtp.dims.num_mtp_layers == 1 and 61 in mtp.dims.moe_layers


def test_deepseek_fp8_dtypes_and_scale_shapes():
    m = load_model("deepseek-v3", include_mtp=True, include_scales=True)
    by = {t.name: t for t in m.tensors}
    assert by["model.layers.3.self_attn.q_a_proj.weight_scale_inv"].shape == (12, 56)
    assert by["model.layers.3.self_attn.q_b_proj.weight_scale_inv"].shape == (192, 12)
    assert by["model.layers.3.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape == (5, 56)
    assert by["model.layers.3.self_attn.kv_b_proj.weight_scale_inv"].shape == (256, 4)
    assert by["model.layers.3.self_attn.o_proj.weight_scale_inv"].shape == (56, 128)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.5.mlp.gate.weight",
                 "model.layers.61.eh_proj.weight", "model.layers.61.shared_head.head.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert by[name].dtype == "bfloat16", name
    assert by["model.layers.5.mlp.gate.e_score_correction_bias"].dtype == "float32"
    assert by["model.layers.5.mlp.experts.7.up_proj.weight"].dtype == "float8_e4m3fn"
    for t in m.tensors:
        if t.kind == "scale_inv":
            w = by[t.scale_of]
            assert w.dtype == "float8_e4m3fn" and t.dtype == "float32"
            assert t.shape == (ceil(w.shape[0] / 128), ceil(w.shape[1] / 128))
            assert (t.layer, t.expert) == (w.layer, w.expert)
            assert m.index(t.name) == m.index(w.name) + 1  # scale right after its weight


def test_qwen3_dense_8b_arithmetic():
    # Qwen3-8B config values: H 4096, I 12288, L 36, nh 32, nkv 8, hd 128, V 151936, untied
    cfg = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
           "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    m = spec_from_config(cfg, "qwen3-8b")
    layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 2 * 128 + 2 * 4096 + 3 * 4096 * 12288
    assert m.num_params == 36 * layer + 2 * 151936 * 4096 + 4096 == 8_190_735_360
    assert len(m.tensors) == 36 * 11 + 3
    assert m.tensor("model.layers.0.self_attn.k_norm.weight").shape == (128,)


# ---- structure ------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "deepseek-v3"] + ["tiny-deepseek"])
def test_order_roles_kinds(preset):
    mtp = preset.endswith("deepseek")
    m = load_model(preset, include_mtp=mtp, include_scales=mtp)
    names = [t.name for t in m.tensors]
    assert names[0] == "model.embed_tokens.weight"
    main_end = names.index("model.norm.weight")
    assert names[main_end + 1] == "lm_head.weight"
    layers = [t.layer for t in m.tensors[1:main_end]]
    assert layers == sorted(layers) and set(layers) == set(range(m.dims.num_layers))
    assert all(t.layer is not None and t.layer >= m.dims.num_layers for t in m.tensors[main_end + 2:])
    for t in m.tensors:
        assert t.kind in KINDS and t.role in ROLES and t.role == KIND_ROLE[t.kind], t
        assert (t.expert is not None) == t.kind.startswith("expert_") or t.kind == "scale_inv"
        assert (t.scale_of is not None) == (t.kind == "scale_inv")
        assert t.name.startswith(f"model.layers.{t.layer}.") if t.layer is not None else "layers" not in t.name


def test_tiny_presets_are_shape_faithful():
    llama = load_model("tiny-llama").dims
    for tp in (1, 2, 4, 8):
        padded = -(-llama.vocab // 64) * 64  # vLLM pads the vocab to 64, then splits by TP
        assert llama.num_heads % tp == 0 and llama.intermediate % tp == 0 and padded % tp == 0
    q = load_model("tiny-qwen3-moe").dims
    assert q.num_heads * q.head_dim != q.hidden and q.num_kv_heads == 2 and 8 <= q.num_experts <= 16
    d = load_model("tiny-deepseek", include_mtp=True).dims
    assert d.moe_layers == (1, 2, 3, 4) and d.num_shared_experts == 1 and d.num_mtp_layers == 1
    assert d.q_lora_rank and d.kv_lora_rank
    for p in ("tiny-llama", "tiny-qwen3-moe", "tiny-deepseek"):
        assert 10e6 < load_model(p).num_bytes < 400e6


def test_qwen3_moe_sparse_step_and_mlp_only_layers():
    cfg = dict(preset_config("tiny-qwen3-moe"), num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    m = spec_from_config(cfg, "x")
    assert m.dims.moe_layers == (1, 5)  # (l+1) % 2 == 0 and l not in mlp_only_layers
    assert m.tensor("model.layers.0.mlp.gate_proj.weight").shape == (1536, 512)
    assert m.tensor("model.layers.3.mlp.down_proj.weight").shape == (512, 1536)
    assert m.tensor("model.layers.5.mlp.experts.15.down_proj.weight").shape == (512, 256)


def test_tied_embeddings_and_default_head_dim():
    cfg = dict(preset_config("tiny-llama"), tie_word_embeddings=True)
    m = spec_from_config(cfg, "tied")
    assert "lm_head.weight" not in [t.name for t in m.tensors] and m.dims.tie_embeddings
    assert m.dims.head_dim == 1024 // 16


def test_deepseek_without_q_lora_uses_q_proj():
    cfg = dict(preset_config("tiny-deepseek"), q_lora_rank=None)
    m = spec_from_config(cfg, "v2-lite-like")
    assert m.tensor("model.layers.0.self_attn.q_proj.weight").shape == (8 * (64 + 32), 512)
    assert not any("q_a_proj" in t.name for t in m.tensors)


def test_views_match_direct_config():
    cfg = preset_config("deepseek-v3")
    assert load_model("deepseek-v3").tensors == spec_from_config(cfg, "deepseek-v3").tensors
    assert load_model("deepseek-v3").dims == spec_from_config(cfg, "deepseek-v3").dims
    direct = spec_from_config(cfg, "d", include_mtp=True, include_scales=True)
    assert load_model("deepseek-v3", include_mtp=True, include_scales=True).tensors == direct.tensors
    # include_scales has no effect without fp8 quantization
    assert spec_from_config(preset_config("tiny-llama"), "a", include_scales=True).tensors == \
        load_model("tiny-llama").tensors


# ---- truncate -------------------------------------------------------------------------------------
def _expected(preset: str, n: int) -> tuple[int, int]:
    """(tensors, params) of the first n layers: per-layer tensor and parameter counts from each model's
    config.json (shapes as in its HF modeling file), plus embeddings, final norm and lm_head."""
    if preset == "llama-3.1-8b":
        return 9 * n + 3, 218_112_000 * n + 2 * 525_336_576 + 4096
    if preset == "qwen3-235b-a22b":
        return 393 * n + 3, 2_487_755_008 * n + 1_244_663_808
    if preset == "deepseek-v3":
        attn, norms, dense, moe = 187_107_328, 14_336, 396_361_728, 11_320_164_608
        nd = min(n, 3)
        return 12 * nd + 782 * (n - nd) + 3, (
            nd * (attn + norms + dense) + (n - nd) * (attn + norms + moe) + 2 * 129280 * 7168 + 7168
        )
    raise AssertionError(preset)


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(["llama-3.1-8b", "qwen3-235b-a22b", "deepseek-v3"]), data=st.data())
def test_truncate_arithmetic(preset, data):
    full = load_model(preset, include_mtp=preset == "deepseek-v3")
    n = data.draw(st.integers(1, full.dims.num_layers), label="layers")
    m = truncate(full, n)
    assert (len(m.tensors), m.num_params) == _expected(preset, n)
    assert m.dims.num_layers == n and m.dims.num_mtp_layers == 0
    assert all(l < n for l in m.dims.moe_layers)
    assert m.config["num_hidden_layers"] == n
    assert load_model(preset, layers=n).tensors == m.tensors


@settings(max_examples=20, deadline=None)
@given(preset=st.sampled_from(["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek"]), data=st.data())
def test_truncate_is_a_prefix_and_matches_its_config(preset, data):
    full = load_model(preset)
    n = data.draw(st.integers(1, full.dims.num_layers), label="layers")
    m = truncate(full, n)
    names = [t.name for t in m.tensors]
    assert names == [t.name for t in full.tensors if t.layer is None or t.layer < n]
    again = spec_from_config(m.config, m.name)
    assert again.tensors == m.tensors and again.dims == m.dims


@pytest.mark.parametrize("n", [0, -1, 5, True, 2.0])
def test_truncate_rejects(n):
    with pytest.raises(ModelError, match="between 1 and 4"):
        truncate(load_model("tiny-llama"), n)


# ---- config errors --------------------------------------------------------------------------------
def test_unsupported_architecture_names_file_and_key(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"architectures": ["MambaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ModelError) as e:
        load_model(p)
    assert str(p) in str(e.value) and "'architectures'" in str(e.value) and "MambaForCausalLM" in str(e.value)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_missing_key_names_file_and_key(tmp_path, key):
    cfg = preset_config("tiny-llama")
    del cfg[key]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=f"{p}: key '{key}' is missing"):
        load_model(tmp_path)


@pytest.mark.parametrize("key,value,msg", [
    ("hidden_size", "1024", "must be an integer"),
    ("num_attention_heads", 0, "must be >= 1"),
    ("tie_word_embeddings", "no", "must be true or false"),
    ("attention_bias", True, "is true: bias tensors are not supported"),
    ("torch_dtype", "int8", "must be one of"),
])
def test_bad_values(key, value, msg):
    cfg = dict(preset_config("tiny-llama"), **{key: value})
    with pytest.raises(ModelError, match=f"key '{key}' {msg}"):
        spec_from_config(cfg, "x", source="here/config.json")


def test_model_type_fallback_and_missing_both():
    cfg = preset_config("tiny-qwen3-moe")
    del cfg["architectures"]
    assert spec_from_config(cfg, "x").dims.arch == "qwen3_moe"
    del cfg["model_type"]
    with pytest.raises(ModelError, match="missing key 'architectures'"):
        spec_from_config(cfg, "x", source="c.json")


def test_bad_json_missing_file_unknown_preset(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        load_model(p)
    p.write_text("[1, 2]")
    with pytest.raises(ModelError, match="expected a JSON object"):
        load_model(p)
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "nope" / "config.json")
    with pytest.raises(ModelError, match="not a preset"):
        load_model("llama-9")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no model.safetensors.index.json"):
        load_model(tmp_path / "empty")


def test_view_flags_without_content():
    with pytest.raises(ModelError, match="no MTP layers"):
        load_model("tiny-llama", include_mtp=True)
    with pytest.raises(ModelError, match="no fp8 scale tensors"):
        load_model("qwen3-30b-a3b", include_scales=True)


# ---- cross-key consistency -------------------------------------------------------------------------
def _load_cfg(tmp_path, preset, **changes):
    cfg = dict(preset_config(preset), **changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelError) as e:
        load_model(p)
    msg = str(e.value)
    assert str(p) in msg
    return msg


def test_heads_not_a_multiple_of_kv_heads_is_caught_at_load(tmp_path):
    msg = _load_cfg(tmp_path, "tiny-llama", num_attention_heads=16, num_key_value_heads=3, head_dim=64)
    assert "'num_attention_heads' (16) must be a multiple of 'num_key_value_heads' (3)" in msg and "16 % 3 = 1" in msg
    msg = _load_cfg(tmp_path, "tiny-llama", num_attention_heads=4, num_key_value_heads=8, head_dim=64)
    assert "'num_attention_heads' (4) must be a multiple of 'num_key_value_heads' (8)" in msg


def test_moe_keys_are_consistent(tmp_path):
    n = preset_config("tiny-qwen3-moe")["num_experts"]
    msg = _load_cfg(tmp_path, "tiny-qwen3-moe", num_experts_per_tok=n + 1)
    assert f"'num_experts_per_tok' ({n + 1}) must be between 1 and 'num_experts' ({n})" in msg
    e = preset_config("tiny-deepseek")["n_routed_experts"]
    msg = _load_cfg(tmp_path, "tiny-deepseek", n_group=e + 1, topk_group=e + 2, num_experts_per_tok=0)
    assert "3 problems" in msg and f"'n_routed_experts' ({e}) must be a multiple of 'n_group' ({e + 1})" in msg
    assert f"'topk_group' ({e + 2}) must be between 1 and 'n_group' ({e + 1})" in msg
    assert "'num_experts_per_tok' (0)" in msg


@pytest.mark.parametrize("key,value", [("vocab_size", 0), ("head_dim", 0)])
def test_non_positive_sizes(key, value):
    cfg = dict(preset_config("tiny-qwen3-moe"), **{key: value})
    with pytest.raises(ModelError, match=f"key '{key}' must be >= 1"):
        spec_from_config(cfg, "x", source="here/config.json")


def test_every_preset_passes_the_consistency_checks():
    """Every shipped preset loads through the config checks into the spec of its own config, and the same
    checks refuse that preset's config with one key broken (so they ran on its architecture's path)."""
    assert len(PRESETS) >= 8
    for name in PRESETS:
        cfg = preset_config(name)
        m = load_model(name)
        assert (m.name, m.source) == (name, f"preset:{name}")
        assert (m.dims.num_layers, m.dims.hidden, m.dims.vocab) == \
            (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]), name
        assert m.tensors and m.num_params > 0, name
        experts = cfg.get("n_routed_experts", cfg.get("num_experts", 0))
        if experts:  # MoE: top-k beyond the experts
            bad, key = dict(cfg, num_experts_per_tok=experts + 1), "num_experts_per_tok"
        else:  # grouped-query attention: heads not a multiple of the kv heads
            bad, key = dict(cfg, num_key_value_heads=cfg["num_attention_heads"] - 1), "num_key_value_heads"
        with pytest.raises(ModelError, match=key):
            spec_from_config(bad, name, source=f"{name}/config.json")


@pytest.mark.parametrize("preset", ["tiny-deepseek", "qwen3-30b-a3b", "llama-3.1-8b"])
def test_column_arrays_are_the_tensors_fields(preset):
    """``ModelSpec``'s per-tensor arrays (what the cost model vectorises over) hold each tensor's own field,
    -1 where a layer or expert is absent."""
    m = load_model(preset)
    assert m.nbytes_array.tolist() == [t.nbytes for t in m.tensors]
    assert m.kind_array.tolist() == [t.kind for t in m.tensors]
    assert m.layer_array.tolist() == [-1 if t.layer is None else t.layer for t in m.tensors]
    assert m.expert_array.tolist() == [-1 if t.expert is None else t.expert for t in m.tensors]
    assert (m.expert_array >= 0).any() == any(t.expert is not None for t in m.tensors)
